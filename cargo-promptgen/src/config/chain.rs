//! The resolved chain: what [`load`](super::load) returns, every value settled and every
//! file it names checked to exist.

use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroU32;
use std::ops::RangeInclusive;
use std::path::PathBuf;

use codegen_core::backend::{BackendConfig, BackendKind, ollama, openai};
use codegen_core::{Constrain, ToolProtocol};

use super::store::StoreSettings;
use crate::graph::Graph;

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
    // Where the cache is (see `super::store::default_dir`).
    "PROMPTGEN_CACHE_DIR",
    "XDG_CACHE_HOME",
    "HOME",
    "LOCALAPPDATA",
];

/// Where a package declares its chain.
pub const PACKAGE_PREFIX: &str = "package.metadata.promptgen";
/// Where a workspace declares the defaults of its packages' chains.
pub const WORKSPACE_PREFIX: &str = "workspace.metadata.promptgen";

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
    /// The server every step talks to, and how: the backend's kind, URL and key, the context
    /// window, the reply cap, the timeouts. Each step takes it as it is, with its script
    /// ([`StepConfig::backend`]).
    pub backend: BackendConfig,
    /// Where the backend's kind came from.
    pub backend_origin: Origin,
    /// Where [`BackendConfig::base_url`] came from ([`Origin::Default`] when it is `None`: the
    /// backend's default applies, see [`Chain::effective_base_url`]). `OLLAMA_HOST` is stored
    /// normalised (`http://host:port`).
    pub base_url_origin: Origin,
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
    /// Where the outputs the lock records are kept (`store`, the cache folder, `cache_url`).
    pub store: StoreSettings,
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

    /// The step with this id.
    pub fn step(&self, id: &str) -> Option<&StepConfig> {
        self.index(id).map(|i| &self.steps[i])
    }

    /// The step with this id, or the error that lists the ids there are.
    pub fn require_step(&self, id: &str) -> Result<&StepConfig, UnknownStep> {
        self.step(id).ok_or_else(|| UnknownStep {
            id: id.to_string(),
            package: self.package_name.clone(),
            known: self.steps.iter().map(|s| s.id.clone()).collect(),
        })
    }

    /// The URL the backend will talk to: [`Chain::base_url`], else the backend's default
    /// (`None` for `scripted`, which talks to no server).
    pub fn effective_base_url(&self) -> Option<String> {
        match (&self.backend.base_url, self.backend.kind) {
            (Some(url), _) => Some(url.clone()),
            (None, BackendKind::Ollama) => Some(ollama::DEFAULT_HOST.to_string()),
            (None, BackendKind::OpenAi) => Some(openai::DEFAULT_BASE_URL.to_string()),
            (None, BackendKind::Scripted) => None,
        }
    }

    /// ``backend `ollama` (from PROMPTGEN_BACKEND)``, or ``backend `ollama` (default)`` when nothing
    /// chose it.
    pub fn describe_backend(&self) -> String {
        format!("backend `{}` {}", self.backend.kind, from_phrase(self.backend_origin, ""))
    }
}

/// Whether `id` is a step id as the manifest allows it: `[A-Za-z0-9_-]+`. Step ids name
/// folders (`promptgen/<id>/`), so nothing else may be one.
pub fn is_step_id(id: &str) -> bool {
    !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// A step id the chain does not have (`--step`, `log STEP`, `diff --step`, `eval --step`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("there is no step `{id}` in {package}; its steps are: {}", known.join(", "))]
pub struct UnknownStep {
    /// The id asked for.
    pub id: String,
    /// The package.
    pub package: String,
    /// The ids it has.
    pub known: Vec<String>,
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
    /// Whether the server is asked to enforce the protocol (`constrain`, default `auto`).
    pub constrain: Constrain,
    /// How a step that has recorded outputs runs again (`regenerate`, default `edit`).
    pub regenerate: Regenerate,
    /// Files the step must write: relative forward-slash paths, normalised (no `.` or empty
    /// components), without `..`.
    pub outputs: Vec<String>,
    /// Files and folders the model may read, in the order declared.
    pub inputs: Vec<Input>,
    /// The server and how to talk to it: the chain's [`Chain::backend`], with the step's
    /// `script` (the file of canned turns of the `scripted` backend).
    pub backend: BackendConfig,
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

/// How a stale step that has recorded outputs runs again: `regenerate = "edit" | "fresh"`.
/// It never changes a step's key, nor when a step is stale.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Regenerate {
    /// From its recorded outputs: the model's tree holds them, it is told what changed since
    /// they were made, and it changes what that requires (with `edit_file`), keeping the rest.
    #[default]
    Edit,
    /// From nothing, as the first run did: every output written whole again.
    Fresh,
}

impl Regenerate {
    /// As the manifest spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Regenerate::Edit => "edit",
            Regenerate::Fresh => "fresh",
        }
    }
}

impl fmt::Display for Regenerate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
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
    /// Whether the step's requests are constrained where the server can be: `constrain` is
    /// `auto` and there is a server (the scripted backend replays turns, enforcing nothing).
    pub fn constrained(&self) -> bool {
        self.constrain == Constrain::Auto && self.backend.kind != BackendKind::Scripted
    }

    /// The seed of run `n` of the step, counting from 0: the configured seed (or none) for the
    /// first run, then the seeds after it, one per run (each retry of `seed_retries`, each
    /// trial of `eval`).
    pub fn seed_for_run(&self, n: u32) -> Option<u64> {
        if n == 0 { self.seed } else { Some(self.seed.unwrap_or(0) + u64::from(n)) }
    }

    /// ``model `x` (from PROMPTGEN_MODEL)``, ``model `x` (from step `01`)``, ...
    pub fn describe_model(&self) -> String {
        format!("model `{}` {}", self.model, from_phrase(self.model_origin, &self.id))
    }
}

pub(super) fn from_phrase(origin: Origin, step_id: &str) -> String {
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
