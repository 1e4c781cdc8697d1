//! The chain a package declares in its `Cargo.toml`, read, checked and fully resolved.
//!
//! [`load`] reads `[package.metadata.promptgen]` (and the defaults of
//! `[workspace.metadata.promptgen]`), applies the command line and the environment, and returns
//! a [`Chain`] in which every value is settled and every file it names exists. Every mistake is
//! a [`ConfigError`] that names the manifest with the line and column (`Cargo.toml:12:9`), the
//! exact key (a dotted path such as `package.metadata.promptgen.steps[1].prompt`) and what is
//! expected instead; nothing here panics on user input.
//!
//! # The declaration
//!
//! ```toml
//! [package.metadata.promptgen]
//! backend = "ollama"                    # "ollama" | "openai" | "scripted" (default "ollama")
//! model = "qwen2.5-coder:7b"            # required unless every step sets one
//! base_url = "http://127.0.0.1:11434"   # optional
//! seed = 123                            # optional integer >= 0
//! temperature = 0.0                     # optional number from 0 to 2
//! max_model_calls = 8                   # optional, >= 1: model calls per step, repairs included
//!                                       # (default Step::DEFAULT_MAX_MODEL_CALLS; old name: max_steps)
//! protocol = "native"                   # "native" | "json" | "blocks" (default "native")
//! system_prompt = "prompts/system.md"   # optional file, relative to the package directory
//! num_ctx = 16384                       # optional, >= 1: Ollama's context window
//! max_output_tokens = 4096              # optional, >= 1: the most tokens one reply may have
//! request_timeout_secs = 600            # optional, >= 1: a reply asked for whole
//! first_byte_timeout_secs = 300         # optional, >= 1: a streamed reply's silence before it
//!                                       # begins
//! idle_timeout_secs = 60                # optional, >= 1: a streamed reply's silence between
//!                                       # two of its pieces
//! check = "cargo check"                 # "cargo check" | "cargo test" | "rustc" | "none" |
//!                                       # ["cmd", "arg", ...]; default "cargo check" for steps
//!                                       # with .rs outputs, else "none"
//! check_rounds = 3                      # optional integer >= 0 (default Step::DEFAULT_CHECK_ROUNDS)
//! seed_retries = 0                      # optional integer >= 0: run a failed step again with
//!                                       # the next seed, up to this many times
//! store = "repo"                        # "repo" (default): files in promptgen/ | "cache": files in
//!                                       # the content-addressed cache, the lock alone committed
//! cache_url = "s3://bucket/prefix"      # optional: the cache's shared S3 remote (push, pull)
//! jobs = 1                              # optional, >= 1: steps `cargo promptgen` runs at once
//!                                       # (default 1; PROMPTGEN_JOBS and --jobs beat it)
//!
//! [[package.metadata.promptgen.steps]]
//! id = "01"                             # required, unique, [A-Za-z0-9_-]+
//! prompt = "../prompts/step_01_view.md" # required file, relative to the package directory
//! outputs = ["view.rs"]                 # optional relative forward-slash paths
//! inputs = ["src/domain.rs", "src"]     # optional existing files or folders
//! script = "../prompts/scripts/01.toml" # canned turns; required with backend "scripted"
//! after = ["01", "03"]                  # optional: the steps whose outputs this one builds on
//!                                       # ([] for none; default: the step before it in id order)
//! # optional per-step overrides: model, seed, temperature, max_model_calls, protocol,
//! # system_prompt, check, check_rounds, seed_retries
//!
//! [package.metadata.promptgen.eval]     # optional: what `cargo promptgen eval` requires
//! min_pass_rate = 0.6                   # optional number from 0 to 1: the pass@1 every
//!                                       # step x model must reach
//! steps = { "01" = 0.8 }                # optional: per step, a rate that replaces it
//! ```
//!
//! `store`, `cache_url` and `jobs` never change a step's key: switching stores leaves the lock
//! as it is.
//!
//! `after` makes the chain a graph ([`crate::graph`]): every id it names must be a step of the
//! chain other than the step itself, the steps may not wait for each other in a cycle, and two
//! steps of which neither runs after the other (transitively) may not declare the same output
//! file. A step without `after` runs after the step before it in id order (the first step after
//! none), so chains written before `after` existed keep their meaning and their keys. The cache folder is `PROMPTGEN_CACHE_DIR` (an absolute path), else the user's cache
//! folder (see [`crate::cache::default_dir`]); `store = "cache"` without either is an error.
//!
//! `[workspace.metadata.promptgen]` may set every chain-level key except `steps` (and
//! `eval.steps`, which name one package's steps); its file paths are relative to the workspace
//! root. That root is the one cargo finds: the package's
//! own manifest if it has a `[workspace]` table, else the root `package.workspace` names, else
//! the nearest parent folder's `Cargo.toml` with a `[workspace]` table that does not `exclude`
//! the package (or that names its own root with `package.workspace`). A caller that knows the
//! root (from `cargo metadata`) passes it in [`Overrides::workspace_root`].
//!
//! Each key is declared once, in `schema.rs`'s `ChainTable` and `StepTable` (the keys they
//! share in `with_shared_keys!`); serde reads them and `serde_ignored` reports the keys nobody
//! declared. What serde cannot know is checked by hand (`tables.rs`, `after.rs`,
//! `workspace.rs`): files that must exist, the rules for paths, value ranges, the order of the
//! layers and where each value came from.
//!
//! # Precedence
//!
//! Strongest first: the command line ([`Overrides`]); `PROMPTGEN_BACKEND`, `PROMPTGEN_MODEL`,
//! `PROMPTGEN_BASE_URL`, `PROMPTGEN_JOBS`; the backend's own variables (`OLLAMA_HOST` for `ollama`, normalised
//! like Ollama's client does; `OPENAI_BASE_URL` and `OPENAI_API_KEY` for `openai`); the step's
//! own value; the package's chain-level value; the workspace's; the default. Empty (or
//! whitespace-only) flags and variables count as unset. Each resolved backend, model and base
//! URL records its [`Origin`], so messages can say where a value came from.
//!
//! # Paths
//!
//! Files named in the manifest are joined to their base folder and normalised lexically (`.`
//! dropped, `a/../b` folded), without resolving symbolic links. `..` is allowed there: prompts
//! commonly live in a sibling folder such as `../prompts`.
//!
//! An input's [`Input::virtual_path`] is the path the model sees. It is the path as written,
//! normalised (forward slashes, no `.` components, no empty components or trailing slash,
//! interior `a/..` folded); `..` components that remain at its start (an input outside the
//! package, such as `../prompts/shared.md`) are dropped from the virtual path, so that file
//! is seen as `prompts/shared.md`.
//!
//! A symbolic link inside an input folder is followed when it leads inside the package folder
//! (or inside that input folder); a link that leads anywhere else, to nothing, or to a folder
//! that holds it is a [`ConfigErrorKind::InputLink`] naming the link and its target. The
//! fingerprint and the sandbox walk input folders by the same rule
//! (`codegen_core::sandbox::input_files`).

mod after;
mod edit;
mod error;
mod paths;
mod schema;
mod source;
mod tables;
mod workspace;

use std::collections::BTreeMap;
use std::fmt;
use std::num::{NonZeroU32, NonZeroU64};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

use codegen_core::ToolProtocol;
use codegen_core::backend::ollama::{self, parse_host};
use codegen_core::backend::{BackendConfig, BackendKind, HttpConfig, openai};
use serde::Deserialize;
use toml::Spanned;

use crate::cache::CacheUrl;
use crate::graph::Graph;

use after::{GraphDecl, resolve_graph};
pub use edit::with_store;
pub use error::{ConfigError, ConfigErrorKind, CycleLink, Location};
use paths::absolute;
use schema::{ChainTable, JOBS_EXPECTED, Manifest, one_of, parse_word};
use source::Source;
use tables::{Ctx, Layer, check_steps, eval_settings, value};
use workspace::{find_workspace, package_edition};

/// The temperatures a step may sample at (`temperature`, and `eval --temperature`).
pub const TEMPERATURES: RangeInclusive<f64> = 0.0..=2.0;

/// The pass rates a threshold may ask for (`min_pass_rate`, and `eval --min-pass-rate`).
pub const PASS_RATES: RangeInclusive<f64> = 0.0..=1.0;

/// The names of every environment variable `load` reads (for build scripts'
/// `cargo:rerun-if-env-changed`).
pub const ENV_VARS: &[&str] = &[
    "PROMPTGEN_BACKEND",
    "PROMPTGEN_MODEL",
    "PROMPTGEN_BASE_URL",
    // Not used by builds, but a value that is not a number fails the load.
    "PROMPTGEN_JOBS",
    "OLLAMA_HOST",
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    // Where the cache is (see `crate::cache::DIR_VARS`).
    "PROMPTGEN_CACHE_DIR",
    "XDG_CACHE_HOME",
    "HOME",
    "LOCALAPPDATA",
];

pub(super) const PACKAGE_PREFIX: &str = "package.metadata.promptgen";
pub(super) const WORKSPACE_PREFIX: &str = "workspace.metadata.promptgen";

/// Where the outputs the lock records are kept: `store = "repo" | "cache"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreMode {
    /// In the package's `promptgen/` folder, committed beside the lock.
    #[default]
    Repo,
    /// In the content-addressed cache (`crate::cache`); only the lock is committed.
    Cache,
}

impl StoreMode {
    /// The mode as the manifest spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreMode::Repo => "repo",
            StoreMode::Cache => "cache",
        }
    }
}

impl fmt::Display for StoreMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Values given on the command line; they beat every other layer. Empty strings count as unset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--backend`: `ollama`, `openai` or `scripted`.
    pub backend: Option<String>,
    /// `--model`: the model for every step.
    pub model: Option<String>,
    /// `--base-url`: the server's URL.
    pub base_url: Option<String>,
    /// `--jobs`: the steps `cargo promptgen` runs at once.
    pub jobs: Option<NonZeroU32>,
    /// The workspace root, when the caller knows it better than a search of the folders (the
    /// `cargo promptgen` binary passes the one `cargo metadata` reports). `None`: found by
    /// cargo's rule.
    pub workspace_root: Option<PathBuf>,
}

/// Where a resolved value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Origin {
    /// The command line ([`Overrides`]).
    Flag,
    /// The environment variable of that name.
    Env(&'static str),
    /// The step's own table. Its `Display` cannot name the step; use [`Origin::describe`].
    Step,
    /// `[package.metadata.promptgen]`.
    Package,
    /// `[workspace.metadata.promptgen]`.
    Workspace,
    /// Nothing set it.
    Default,
}

impl Origin {
    /// The origin as a phrase, naming the step for [`Origin::Step`]: ``step `01` ``,
    /// `PROMPTGEN_MODEL`, `package metadata`, ...
    pub fn describe(&self, step_id: &str) -> String {
        match self {
            Origin::Step => format!("step `{step_id}`"),
            other => other.to_string(),
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Flag => f.write_str("command line"),
            Origin::Env(name) => f.write_str(name),
            Origin::Step => f.write_str("step metadata"),
            Origin::Package => f.write_str("package metadata"),
            Origin::Workspace => f.write_str("workspace metadata"),
            Origin::Default => f.write_str("default"),
        }
    }
}

/// A chain, fully resolved: every layer applied, every named file checked to exist.
#[derive(Debug, Clone, PartialEq)]
pub struct Chain {
    /// `package.name`.
    pub package_name: String,
    /// The folder of the package's `Cargo.toml` (absolute).
    pub package_dir: PathBuf,
    /// The package's `Cargo.toml` (absolute).
    pub manifest_path: PathBuf,
    /// The root folder of the workspace the package belongs to (found by cargo's rule, or as
    /// [`Overrides::workspace_root`] says); `None` when it belongs to none.
    pub workspace_root: Option<PathBuf>,
    /// Which backend every step uses.
    pub backend: BackendKind,
    /// Where [`Chain::backend`] came from.
    pub backend_origin: Origin,
    /// The server's URL; `None` when nothing set one (the backend's default applies, see
    /// [`Chain::effective_base_url`]). `OLLAMA_HOST` is stored normalised
    /// (`http://host:port`).
    pub base_url: Option<String>,
    /// Where [`Chain::base_url`] came from ([`Origin::Default`] when it is `None`).
    pub base_url_origin: Origin,
    /// `OPENAI_API_KEY`, for the `openai` backend only.
    pub api_key: Option<String>,
    /// Ollama's context window in tokens.
    pub num_ctx: u32,
    /// The most tokens one model reply may have.
    pub max_output_tokens: u32,
    /// Time allowed for one whole model request.
    pub request_timeout: Duration,
    /// How long a streamed reply may be silent before its first byte
    /// (`first_byte_timeout_secs`, default [`HttpConfig::first_byte_timeout`]'s).
    pub first_byte_timeout: Duration,
    /// How long a streamed reply may be silent between two pieces (`idle_timeout_secs`,
    /// default [`HttpConfig::idle_timeout`]'s): a stalled server is noticed within it.
    pub idle_timeout: Duration,
    /// The package's Rust edition (`package.edition`, inherited from the workspace when it
    /// says `edition.workspace = true`; `2015` when absent, as cargo does).
    pub edition: String,
    /// The steps, sorted by id in plain string (byte) order: `"01" < "02" < "10" < "a"`, so
    /// zero-padded numeric ids come in numeric order.
    pub steps: Vec<StepConfig>,
    /// Which steps run after which: [`StepConfig::after`] by index into [`Chain::steps`].
    pub graph: Graph,
    /// The steps `cargo promptgen` runs at once (`--jobs`, `PROMPTGEN_JOBS`, `jobs`; default
    /// [`Chain::DEFAULT_JOBS`]). A build script runs its steps one at a time.
    pub jobs: usize,
    /// Where the outputs the lock records are kept (`store`, default [`StoreMode::Repo`]).
    pub store: StoreMode,
    /// The cache folder the environment names ([`crate::cache::default_dir`]); always set
    /// when [`Chain::store`] is [`StoreMode::Cache`].
    pub cache_dir: Option<PathBuf>,
    /// The cache's shared remote (`cache_url`), in either mode.
    pub cache_url: Option<CacheUrl>,
    /// `[package.metadata.promptgen.eval]`: what `cargo promptgen eval` holds the steps to.
    pub eval: EvalSettings,
}

/// `[package.metadata.promptgen.eval]` (and the workspace's): the pass rates `cargo promptgen
/// eval` requires.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EvalSettings {
    /// The pass rate (pass@1, from 0 to 1) every step × model must reach (`min_pass_rate`).
    pub min_pass_rate: Option<f64>,
    /// Per step, a rate that replaces `min_pass_rate` (`steps = { "02" = 0.9 }`).
    pub steps: BTreeMap<String, f64>,
}

impl EvalSettings {
    /// The rate step `id` must reach, if any.
    pub fn min_pass_rate_of(&self, id: &str) -> Option<f64> {
        self.steps.get(id).copied().or(self.min_pass_rate)
    }
}

impl Chain {
    /// Steps run at once unless `jobs` says otherwise: one, because a local server (Ollama,
    /// llama.cpp's server) often serves one request at a time, and a second request would wait
    /// behind the first with its first-byte limit running.
    pub const DEFAULT_JOBS: usize = 1;

    /// The index of the step with this id in [`Chain::steps`] (and in [`Chain::graph`]).
    pub fn index(&self, id: &str) -> Option<usize> {
        self.steps.binary_search_by(|s| s.id.as_str().cmp(id)).ok()
    }

    /// The backend configuration for `step`: this chain's backend, URL, key, context window
    /// and silence and request timeouts, and the step's script.
    pub fn backend_config(&self, step: &StepConfig) -> BackendConfig {
        let mut config = BackendConfig::new(self.backend);
        config.base_url = self.base_url.clone();
        config.api_key = self.api_key.clone();
        config.num_ctx = self.num_ctx;
        config.max_output_tokens = self.max_output_tokens;
        config.script = step.script.clone();
        config.http.request_timeout = self.request_timeout;
        config.http.first_byte_timeout = self.first_byte_timeout;
        config.http.idle_timeout = self.idle_timeout;
        config
    }

    /// The step with this id.
    pub fn step(&self, id: &str) -> Option<&StepConfig> {
        self.index(id).map(|i| &self.steps[i])
    }

    /// The URL the backend will talk to: [`Chain::base_url`], else the backend's default
    /// (`None` for `scripted`, which talks to no server).
    pub fn effective_base_url(&self) -> Option<String> {
        match (&self.base_url, self.backend) {
            (Some(url), _) => Some(url.clone()),
            (None, BackendKind::Ollama) => Some(ollama::DEFAULT_HOST.to_string()),
            (None, BackendKind::OpenAi) => Some(openai::DEFAULT_BASE_URL.to_string()),
            (None, BackendKind::Scripted) => None,
        }
    }

    /// ``backend `ollama` (from PROMPTGEN_BACKEND)``, or ``backend `ollama` (default)`` when nothing
    /// chose it.
    pub fn describe_backend(&self) -> String {
        format!("backend `{}` {}", self.backend, from_phrase(self.backend_origin, ""))
    }
}

/// One step of a chain, fully resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct StepConfig {
    /// The step's id: unique, `[A-Za-z0-9_-]+`.
    pub id: String,
    /// The prompt file: the package folder joined with the path as written, normalised.
    pub prompt: PathBuf,
    /// The prompt's path exactly as written in the manifest, for messages.
    pub prompt_display: String,
    /// The system prompt file, from the step, the package or the workspace.
    pub system_prompt: Option<PathBuf>,
    /// The model's name.
    pub model: String,
    /// Where [`StepConfig::model`] came from.
    pub model_origin: Origin,
    /// Sampling seed.
    pub seed: Option<u64>,
    /// Sampling temperature, from 0 to 2.
    pub temperature: Option<f64>,
    /// Model calls the step may make, at least 1.
    pub max_model_calls: u32,
    /// How the model calls tools.
    pub protocol: ToolProtocol,
    /// Files the step must write: relative forward-slash paths, normalised (no `.` or empty
    /// components), without `..`.
    pub outputs: Vec<String>,
    /// Files and folders the model may read, in the order declared.
    pub inputs: Vec<Input>,
    /// The file of canned turns for the `scripted` backend.
    pub script: Option<PathBuf>,
    /// The check the step's output must pass before it may finish.
    pub check: CheckSpec,
    /// Failed checks answered with a repair round before the step fails.
    pub check_rounds: u32,
    /// Runs with the next seed after a run that failed its budget or its check.
    pub seed_retries: u32,
    /// The steps it runs directly after, in id order: its `after`, else the step before it in
    /// id order (none for the first).
    pub after: Vec<String>,
    /// Whether the manifest declares its `after` (else it is the step before it).
    pub after_declared: bool,
}

/// The check a step's output must pass: `check = "cargo check"`, `"cargo test"`, `"rustc"`,
/// `"none"`, or a command (`["make", "lint"]`). Without `check`, steps that declare `.rs`
/// outputs get `cargo check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckSpec {
    /// `cargo check --all-targets` of the package, with the step's candidate tree mounted
    /// where the build entry mounts the recorded one.
    CargoCheck,
    /// `cargo test` of the package, mounted the same way: the crate's own tests are the
    /// step's acceptance test.
    CargoTest,
    /// Type-check the generated tree alone with rustc, mounted as the crate mounts it.
    Rustc,
    /// No check.
    None,
    /// Run this command in the package folder with `PROMPTGEN_TREE` set to the step's tree;
    /// a non-zero exit fails the check.
    Command(Vec<String>),
}

impl CheckSpec {
    /// How it is written in the metadata, e.g. `rustc` or `cargo check`.
    pub fn describe(&self) -> String {
        match self {
            CheckSpec::CargoCheck => "cargo check".into(),
            CheckSpec::CargoTest => "cargo test".into(),
            CheckSpec::Rustc => "rustc".into(),
            CheckSpec::None => "none".into(),
            CheckSpec::Command(words) => words.join(" "),
        }
    }
}

impl StepConfig {
    /// ``model `x` (from PROMPTGEN_MODEL)``, ``model `x` (from step `01`)``, ...
    pub fn describe_model(&self) -> String {
        format!("model `{}` {}", self.model, from_phrase(self.model_origin, &self.id))
    }
}

fn from_phrase(origin: Origin, step_id: &str) -> String {
    match origin {
        Origin::Default => "(default)".to_string(),
        other => format!("(from {})", other.describe(step_id)),
    }
}

/// A file or folder a step's model may read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    /// The path the model sees: as written, normalised (forward slashes, no `./`, no trailing
    /// slash), with leading `..` components dropped (see the module documentation).
    pub virtual_path: String,
    /// The real file or folder: the package folder joined with the path as written, normalised.
    pub real_path: PathBuf,
    /// Whether it is a folder.
    pub is_dir: bool,
}

/// Loads with `std::env::var` as the environment.
pub fn load_from_env(manifest_path: &Path, overrides: &Overrides) -> Result<Chain, ConfigError> {
    load(manifest_path, overrides, &|name| std::env::var(name).ok())
}

/// Reads the package manifest at `manifest_path` (a `Cargo.toml`, or the folder holding one)
/// and the workspace's, applies `overrides` and the variables of [`ENV_VARS`] as `env`
/// returns them, and checks the result.
pub fn load(
    manifest_path: &Path,
    overrides: &Overrides,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Chain, ConfigError> {
    let mut manifest_path = absolute(manifest_path);
    if manifest_path.is_dir() {
        manifest_path.push("Cargo.toml");
    }
    let src = Source::read(&manifest_path)?;
    let package_dir = manifest_path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    let manifest: Manifest = src.parse(&[PACKAGE_PREFIX, WORKSPACE_PREFIX])?;

    let no_package = |offset| src.error(offset, "package.name", ConfigErrorKind::NoPackage);
    let package = manifest.package.as_ref().ok_or_else(|| no_package(0))?;
    let package_at = package.span().start;
    let package_name = package.get_ref().name.as_ref().ok_or_else(|| no_package(package_at))?.get_ref().clone();
    let chain_table = package.get_ref().metadata.as_ref().and_then(|m| m.promptgen.as_ref());
    let chain_table = chain_table.ok_or_else(|| src.error(package_at, PACKAGE_PREFIX, ConfigErrorKind::NoChain))?;

    let package_ctx = Ctx { src: &src, prefix: PACKAGE_PREFIX.into(), base: &package_dir };
    let package_layer = Layer::check(package_ctx, chain_table.get_ref(), Origin::Package)?;
    let declared = check_steps(&package_layer.ctx, chain_table)?;

    let workspace = find_workspace(&src, &manifest, &package_dir, overrides.workspace_root.as_deref())?;
    let workspace_table = workspace.as_ref().and_then(|ws| {
        let (ws_src, table) = match &ws.manifest {
            None => (&src, manifest.workspace.as_ref()?),
            Some((ws_src, root)) => (ws_src, root.workspace.as_ref()?),
        };
        Some((ws_src, table.get_ref(), ws.dir.as_path()))
    });
    let mut layers = vec![package_layer];
    if let Some((ws_src, table, root)) = workspace_table
        && let Some(chain) = table.metadata.as_ref().and_then(|m| m.promptgen.as_ref())
    {
        let ctx = Ctx { src: ws_src, prefix: WORKSPACE_PREFIX.into(), base: root };
        // Steps, and the rates of steps, belong to one package.
        if let Some(steps) = &chain.get_ref().steps {
            return Err(ws_src.unknown_key(&ctx.key("steps"), steps.span().start));
        }
        if let Some(steps) = chain.get_ref().eval.as_ref().and_then(|e| e.get_ref().steps.as_ref()) {
            return Err(ws_src.unknown_key(&ctx.key("eval.steps"), steps.span().start));
        }
        layers.push(Layer::check(ctx, chain.get_ref(), Origin::Workspace)?);
    }
    // The first layer that sets a chain-level value, with its origin.
    fn pick<T>(layers: &[Layer<'_>], get: impl Fn(&ChainTable) -> Option<T>) -> Option<(T, Origin)> {
        layers.iter().find_map(|layer| get(layer.table).map(|v| (v, layer.origin)))
    }
    // The first layer's value of a key, alone.
    fn first<T: Copy>(layers: &[Layer<'_>], key: impl Fn(&ChainTable) -> &Option<Spanned<T>>) -> Option<T> {
        layers.iter().find_map(|layer| value(key(layer.table)))
    }

    let flag = |value: &Option<String>| value.as_deref().map(str::trim).filter(|v| !v.is_empty()).map(str::to_string);
    let var = |name: &'static str| env(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    // The flag's value, else the variable's, with its origin.
    let given = |value: &Option<String>, name: &'static str| {
        flag(value).map(|v| (v, Origin::Flag)).or_else(|| var(name).map(|v| (v, Origin::Env(name))))
    };
    // A flag or a variable (`key`) whose value cannot be used: not in the file.
    let refused = |key: &str, kind| ConfigError::new(&manifest_path, None, Some(key.into()), kind);

    let (backend, backend_origin) = match given(&overrides.backend, "PROMPTGEN_BACKEND") {
        Some((value, origin)) => {
            let kind = parse_word::<BackendKind>(&value).map_err(|_| {
                let expected = one_of::<BackendKind>();
                match origin {
                    Origin::Env(name) => refused(name, ConfigErrorKind::Env { value: value.clone(), expected }),
                    _ => refused("--backend", ConfigErrorKind::Flag { value: value.clone(), expected }),
                }
            })?;
            (kind, origin)
        }
        None => pick(&layers, |t| value(&t.backend)).unwrap_or((BackendKind::Ollama, Origin::Default)),
    };

    // Base URL and key.
    let backend_url = || {
        let name = match backend {
            BackendKind::Ollama => "OLLAMA_HOST",
            BackendKind::OpenAi => "OPENAI_BASE_URL",
            BackendKind::Scripted => return None,
        };
        let value = var(name)?;
        Some((if backend == BackendKind::Ollama { parse_host(&value) } else { value }, Origin::Env(name)))
    };
    let (base_url, base_url_origin) = match given(&overrides.base_url, "PROMPTGEN_BASE_URL")
        .or_else(backend_url)
        .or_else(|| pick(&layers, |t| t.base_url.as_ref().map(|u| u.get_ref().clone())))
    {
        Some((url, origin)) => (Some(url), origin),
        None => (None, Origin::Default),
    };
    let api_key = if backend == BackendKind::OpenAi { var("OPENAI_API_KEY") } else { None };

    let num_ctx = first(&layers, |t| &t.num_ctx).map_or(BackendConfig::DEFAULT_NUM_CTX, NonZeroU32::get);
    let max_output_tokens =
        first(&layers, |t| &t.max_output_tokens).map_or(BackendConfig::DEFAULT_MAX_OUTPUT_TOKENS, NonZeroU32::get);
    let http = HttpConfig::default();
    let secs = |secs: Option<NonZeroU64>, default| secs.map_or(default, |s| Duration::from_secs(s.get()));
    let request_timeout = secs(first(&layers, |t| &t.request_timeout_secs), http.request_timeout);
    let first_byte_timeout = secs(first(&layers, |t| &t.first_byte_timeout_secs), http.first_byte_timeout);
    let idle_timeout = secs(first(&layers, |t| &t.idle_timeout_secs), http.idle_timeout);

    let jobs = if let Some(jobs) = overrides.jobs {
        jobs.get()
    } else if let Some(value) = var("PROMPTGEN_JOBS") {
        let expected = JOBS_EXPECTED.into();
        let jobs = value.parse::<NonZeroU32>();
        jobs.map_err(|_| refused("PROMPTGEN_JOBS", ConfigErrorKind::Env { value: value.clone(), expected }))?.get()
    } else {
        first(&layers, |t| &t.jobs).map_or(Chain::DEFAULT_JOBS as u32, NonZeroU32::get)
    };
    let jobs = usize::try_from(jobs).unwrap_or(usize::MAX);

    let model_override = given(&overrides.model, "PROMPTGEN_MODEL");
    let mut steps = Vec::with_capacity(declared.len());
    let mut without_model = Vec::new();
    for step in declared {
        // The step's own value, else the first chain-level layer's.
        let own = &step.shared;
        macro_rules! layered {
            ($key:ident) => {
                own.$key.clone().or_else(|| layers.iter().find_map(|l| l.shared.$key.clone()))
            };
        }
        let model = model_override
            .clone()
            .or_else(|| own.model.clone().map(|m| (m, Origin::Step)))
            .or_else(|| layers.iter().find_map(|l| l.shared.model.clone().map(|m| (m, l.origin))));
        let Some((model, model_origin)) = model else {
            without_model.push(step.id.clone());
            continue;
        };
        if backend == BackendKind::Scripted && step.script.is_none() {
            let backend = format!("backend `scripted` {}", from_phrase(backend_origin, &step.id));
            let kind = ConfigErrorKind::MissingScript { step: step.id.clone(), backend };
            return Err(src.error(step.at, format!("{}.script", step.key), kind));
        }
        let check = layered!(check).unwrap_or_else(|| {
            if step.outputs.iter().any(|o| o.ends_with(".rs")) { CheckSpec::CargoCheck } else { CheckSpec::None }
        });
        let config = StepConfig {
            system_prompt: layered!(system_prompt),
            seed: layered!(seed),
            temperature: layered!(temperature),
            max_model_calls: layered!(max_model_calls).unwrap_or(codegen_core::Step::DEFAULT_MAX_MODEL_CALLS),
            protocol: layered!(protocol).unwrap_or_default(),
            check,
            check_rounds: layered!(check_rounds).unwrap_or(codegen_core::Step::DEFAULT_CHECK_ROUNDS),
            seed_retries: layered!(seed_retries).unwrap_or(0),
            id: step.id,
            prompt: step.prompt,
            prompt_display: step.prompt_display,
            model,
            model_origin,
            outputs: step.outputs,
            inputs: step.inputs,
            script: step.script,
            // Set with the graph, once every step is known.
            after: Vec::new(),
            after_declared: false,
        };
        steps.push((config, step.graph));
    }
    if !without_model.is_empty() {
        let kind = ConfigErrorKind::MissingModel { steps: without_model };
        return Err(src.error(chain_table.span().start, format!("{PACKAGE_PREFIX}.model"), kind));
    }
    steps.sort_by(|(a, _), (b, _)| a.id.cmp(&b.id));
    let (mut steps, declared): (Vec<StepConfig>, Vec<GraphDecl>) = steps.into_iter().unzip();
    let graph = resolve_graph(&src, &mut steps, &declared)?;
    let eval = eval_settings(&layers, &steps)?;
    let edition = package_edition(&src, package.get_ref(), workspace_table.map(|(_, table, _)| table))?;

    // Where the outputs live, and the cache folder (needed in cache mode, and to switch to it).
    let store = first(&layers, |t| &t.store).unwrap_or(StoreMode::Repo);
    let cache_url = layers.iter().find_map(|l| l.cache_url.clone());
    let cache_dir = crate::cache::default_dir(env).map_err(|(key, value)| {
        refused(key, ConfigErrorKind::Env { value, expected: "an absolute path to the cache folder".into() })
    })?;
    if store == StoreMode::Cache
        && cache_dir.is_none()
        && let Some((layer, set)) = layers.iter().find_map(|l| Some((l, l.table.store.as_ref()?)))
    {
        return Err(layer.ctx.error(set, "store", ConfigErrorKind::NoCacheDir));
    }

    Ok(Chain {
        package_name,
        package_dir,
        manifest_path: manifest_path.clone(),
        workspace_root: workspace.map(|ws| ws.dir),
        backend,
        backend_origin,
        base_url,
        base_url_origin,
        api_key,
        num_ctx,
        max_output_tokens,
        request_timeout,
        first_byte_timeout,
        idle_timeout,
        edition,
        steps,
        graph,
        jobs,
        store,
        cache_dir,
        cache_url,
        eval,
    })
}

#[cfg(test)]
mod tests {
    use super::schema::{ChainTable, EvalTable, StepTable};

    #[test]
    fn the_module_documentation_lists_every_key() {
        let docs = include_str!("mod.rs");
        let docs: String = docs.lines().take_while(|l| l.starts_with("//!")).collect::<Vec<_>>().join("\n");
        for key in ChainTable::KEYS.iter().chain(StepTable::KEYS) {
            let line = match *key {
                "steps" => "//! [[package.metadata.promptgen.steps]]".into(),
                "eval" => "//! [package.metadata.promptgen.eval]".into(),
                _ => format!("//! {key} = "),
            };
            assert!(docs.contains(&line), "the module documentation's schema lacks `{key}`");
        }
        for key in EvalTable::KEYS {
            assert!(docs.contains(&format!("//! {key} = ")), "the module documentation's schema lacks `eval.{key}`");
        }
    }

    /// `docs/schema.md` is the users' reference: every key is written there as `key = ` at the
    /// start of a line, and every such line under a promptgen table header is a real key.
    #[test]
    fn the_schema_page_lists_every_key_and_only_keys() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/schema.md");
        let page = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("cannot read {path} ({e}): docs/schema.md is the schema's reference"));
        let lines: Vec<&str> = page.lines().collect();
        for key in ChainTable::KEYS.iter().chain(StepTable::KEYS) {
            let line = match *key {
                "steps" => "[[package.metadata.promptgen.steps]]".into(),
                "eval" => "[package.metadata.promptgen.eval]".into(),
                _ => format!("{key} = "),
            };
            assert!(lines.iter().any(|l| l.starts_with(&line)), "docs/schema.md lacks `{line}`");
        }
        for key in EvalTable::KEYS {
            assert!(lines.iter().any(|l| l.starts_with(&format!("{key} = "))), "docs/schema.md lacks `eval.{key} = `");
        }
        // Under `[package.metadata.promptgen...]` and `[workspace.metadata.promptgen]` headers,
        // a `key = ` line must name a key of that table.
        let mut keys: Option<&[&str]> = None;
        for line in &lines {
            if line.starts_with('[') {
                keys = match line.trim_start_matches('[').trim_end_matches(']') {
                    "package.metadata.promptgen" | "workspace.metadata.promptgen" => Some(ChainTable::KEYS),
                    "package.metadata.promptgen.steps" => Some(StepTable::KEYS),
                    "package.metadata.promptgen.eval" => Some(EvalTable::KEYS),
                    _ => None,
                };
            } else if let (Some(keys), Some((key, _))) = (keys, line.split_once(" = ")) {
                let known = keys.contains(&key) || ChainTable::ALIASES.iter().any(|(alias, _)| *alias == key);
                assert!(
                    known || key.trim_start().starts_with('#'),
                    "docs/schema.md documents `{key}`, which is no key: {line}"
                );
            } else if line.starts_with("```") {
                keys = None;
            }
        }
    }
}
