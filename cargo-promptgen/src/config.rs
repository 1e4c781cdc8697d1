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
//! Each key is declared once, in this module's `ChainTable` and `StepTable` (the keys they
//! share in `with_shared_keys!`); serde reads them and `serde_ignored` reports the keys nobody
//! declared. What serde cannot know is checked here by hand: files that must exist,
//! the rules for paths, value ranges, the order of the layers and where each value came from.
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
//! that holds it is a [`ConfigError::InputLink`] naming the link and its target. The
//! fingerprint and the sandbox walk input folders by the same rule
//! (`codegen_core::sandbox::input_files`).
#![allow(
    clippy::result_large_err,
    reason = "a `ConfigError` is made once, when a load fails, and travels a few frames: its size costs nothing \
              measurable, while boxing its variants would change every match on them"
)]

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::num::{NonZeroU32, NonZeroU64};
use std::ops::Range;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use codegen_core::ToolProtocol;
use codegen_core::backend::ollama::{self, parse_host};
use codegen_core::backend::{BackendConfig, BackendKind, HttpConfig, openai};
use codegen_core::sandbox::{SandboxError, input_files};

use crate::cache::{CACHE_DIR_VAR, CacheUrl};
use crate::graph::Graph;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

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

const PACKAGE_PREFIX: &str = "package.metadata.promptgen";
const WORKSPACE_PREFIX: &str = "workspace.metadata.promptgen";

// ---- The declaration, as serde reads it -------------------------------------------------------

/// Declares a table of the metadata: each key once, with its type and what it must hold (for
/// messages). Every key is optional to serde (`Option<Spanned<T>>`, so errors can point at
/// it); a required key is required by hand, with a message that says what to write.
/// `key | "old"` also accepts the key's old name.
macro_rules! keys_table {
    (
        $(#[$meta:meta])*
        struct $name:ident {
            $( $(#[doc = $doc:literal])* $key:ident $(| $alias:literal)? : $ty:ty => $expected:expr, )*
        }
    ) => {
        #[derive(Debug, Default, Deserialize)]
        $(#[$meta])*
        struct $name {
            $( $(#[doc = $doc])* $(#[serde(alias = $alias)])? $key: Option<Spanned<$ty>>, )*
        }

        impl $name {
            /// Its keys, as the manifest spells them.
            const KEYS: &'static [&'static str] = &[$(stringify!($key)),*];
            /// Old names still accepted, each with the key it stands for.
            const ALIASES: &'static [(&'static str, &'static str)] = &[$($(($alias, stringify!($key)),)?)*];

            /// What the key `name` (or its old name) must hold.
            fn expected(name: &str) -> Option<String> {
                $( if name == stringify!($key) $(|| name == $alias)? { return Some(($expected).to_string()); } )*
                None
            }
        }
    };
}

/// [`keys_table!`] with the keys a step shares with the chain-level tables appended.
macro_rules! with_shared_keys {
    ($(#[$meta:meta])* struct $name:ident { $($own:tt)* }) => {
        keys_table! {
            $(#[$meta])*
            struct $name {
                $($own)*
                /// The model's name.
                model: String => "a string, non-empty (the model's name, e.g. \"qwen2.5-coder:7b\")",
                /// The sampling seed.
                seed: u64 => "a non-negative integer (e.g. 123)",
                /// The sampling temperature.
                temperature: f64 => TEMPERATURE_EXPECTED,
                /// Model calls per step, repairs included.
                max_model_calls | "max_steps": NonZeroU32 => "an integer of at least 1 (the model calls the step may make, e.g. 8)",
                /// How the model calls tools.
                protocol: ToolProtocol => one_of::<ToolProtocol>(),
                /// A file of instructions sent before the prompt.
                system_prompt: String => "a string (a file, relative to the manifest's folder)",
                /// The check the output must pass.
                check: CheckValue => CHECK_EXPECTED,
                /// Failed checks answered with a repair round.
                check_rounds: u32 => "a non-negative integer (repair rounds after a failed check, e.g. 3)",
                /// Runs of a failed step with the next seed.
                seed_retries: u32 => "a non-negative integer (runs with the next seed after a failed run, e.g. 2)",
            }
        }
    };
}

const TEMPERATURE_EXPECTED: &str = "a number from 0 to 2 (e.g. 0.0)";
const JOBS_EXPECTED: &str = "a positive integer (the steps `cargo promptgen` runs at once, e.g. 4)";
const CHECK_EXPECTED: &str = "\"cargo check\", \"cargo test\", \"rustc\", \"none\", or a command as an array of strings (e.g. [\"make\", \"lint\"])";
const CACHE_URL_EXPECTED: &str = "an S3 URL such as \"s3://my-bucket/promptgen\" (a bucket of 3 to 63 lower-case letters, \
     digits, dots and hyphens, and an optional key prefix)";

/// Where the outputs the lock records are kept: `store = "repo" | "cache"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreMode {
    /// In the package's `promptgen/` folder, committed beside the lock.
    #[default]
    Repo,
    /// In the content-addressed cache ([`crate::cache`]); only the lock is committed.
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

with_shared_keys! {
    /// `[package.metadata.promptgen]` and `[workspace.metadata.promptgen]` (where `steps` is an
    /// error).
    #[serde(expecting = "a table")]
    struct ChainTable {
        /// Which backend every step uses.
        backend: BackendKind => one_of::<BackendKind>(),
        /// The server's URL.
        base_url: String => "a string, non-empty (the server's URL)",
        /// Ollama's context window.
        num_ctx: NonZeroU32 => "a positive integer number of tokens (e.g. 16384)",
        /// The most tokens one reply may have.
        max_output_tokens: NonZeroU32 => "a positive integer number of tokens per model reply (e.g. 4096)",
        /// Time allowed for one model request.
        request_timeout_secs: NonZeroU64 => "a positive number of seconds (e.g. 600)",
        /// How long a streamed reply may be silent before it begins.
        first_byte_timeout_secs: NonZeroU64 => "a positive number of seconds (e.g. 300)",
        /// How long a streamed reply may be silent between two of its pieces.
        idle_timeout_secs: NonZeroU64 => "a positive number of seconds (e.g. 60)",
        /// Where the outputs the lock records are kept.
        store: StoreMode => one_of::<StoreMode>(),
        /// The cache's shared S3 remote.
        cache_url: String => CACHE_URL_EXPECTED,
        /// Steps run at once.
        jobs: NonZeroU32 => JOBS_EXPECTED,
        /// What `cargo promptgen eval` requires.
        eval: EvalTable => "a table (`[package.metadata.promptgen.eval]`)",
        /// The chain's steps.
        steps: Vec<Spanned<StepTable>> => "an array of tables (`[[package.metadata.promptgen.steps]]`)",
    }
}

with_shared_keys! {
    /// One `[[package.metadata.promptgen.steps]]` table.
    #[serde(expecting = "a table (`[[package.metadata.promptgen.steps]]`)")]
    struct StepTable {
        /// The step's unique id.
        id: String => "a string of ASCII letters, digits, `_` and `-` only, non-empty (e.g. \"01\" or \"view\")",
        /// The prompt file.
        prompt: String => "a string (a file, relative to the package folder)",
        /// Files the step must write.
        outputs: Vec<Spanned<String>> => "an array of relative paths, e.g. [\"view.rs\"]",
        /// Files and folders the model may read.
        inputs: Vec<Spanned<String>> => "an array of files or folders, e.g. [\"src/domain.rs\"]",
        /// Canned turns for the `scripted` backend.
        script: String => "a string (a file, relative to the package folder)",
        /// The steps whose outputs this one builds on.
        after: Vec<Spanned<String>> => "an array of step ids, e.g. [\"01\", \"03\"] ([] for none)",
    }
}

keys_table! {
    /// `[package.metadata.promptgen.eval]` (and the workspace's, without `steps`).
    #[serde(expecting = "a table")]
    struct EvalTable {
        /// The pass rate every step × model must reach.
        min_pass_rate: f64 => RATE_EXPECTED,
        /// Per step id, a rate that replaces `min_pass_rate`.
        steps: BTreeMap<String, Spanned<f64>> => "a table of step ids and pass rates, e.g. { \"01\" = 0.8 }",
    }
}

const RATE_EXPECTED: &str = "a number from 0 to 1 (the share of trials that must pass, e.g. 0.8)";

/// `check` as written: a word or a command.
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "\"cargo check\", \"cargo test\", \"rustc\", \"none\", or a command as an array of strings"
)]
enum CheckValue {
    Word(String),
    Command(Vec<String>),
}

/// The parts of a package manifest `load` reads.
#[derive(Deserialize)]
struct Manifest {
    package: Option<Spanned<PackageTable>>,
    /// Set when the package is its own workspace root.
    workspace: Option<Spanned<WorkspaceTable>>,
}

#[derive(Deserialize)]
#[serde(expecting = "a table")]
struct PackageTable {
    name: Option<Spanned<String>>,
    edition: Option<Spanned<Edition>>,
    /// The path of the workspace root, when the package names it.
    workspace: Option<Spanned<String>>,
    metadata: Option<Metadata>,
}

#[derive(Deserialize)]
#[serde(untagged, expecting = "a string such as \"2021\", or `{ workspace = true }`")]
enum Edition {
    Named(String),
    Inherited { workspace: bool },
}

#[derive(Deserialize)]
#[serde(expecting = "a table")]
struct Metadata {
    promptgen: Option<Spanned<ChainTable>>,
}

/// The parts of a `[workspace]` table `load` reads.
#[derive(Deserialize)]
#[serde(expecting = "a table")]
struct WorkspaceTable {
    package: Option<WorkspacePackage>,
    metadata: Option<Metadata>,
}

#[derive(Deserialize)]
#[serde(expecting = "a table")]
struct WorkspacePackage {
    edition: Option<String>,
}

/// The workspace root's manifest, when it is not the package's.
#[derive(Deserialize)]
struct RootManifest {
    workspace: Option<Spanned<WorkspaceTable>>,
}

/// What the search for the workspace root reads of the manifests it meets on its way.
#[derive(Deserialize)]
struct Probe {
    package: Option<ProbePackage>,
    workspace: Option<ProbeWorkspace>,
}

#[derive(Deserialize)]
#[serde(expecting = "a table")]
struct ProbePackage {
    workspace: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(expecting = "a table")]
struct ProbeWorkspace {
    #[serde(default)]
    members: Vec<String>,
    #[serde(default)]
    exclude: Vec<String>,
}

/// `one of "a", "b", "c"`: the names `T`'s own `Deserialize` accepts.
fn one_of<T: DeserializeOwned>() -> String {
    let names: Vec<String> = variants::<T>().iter().map(|v| format!("\"{v}\"")).collect();
    format!("one of {}", names.join(", "))
}

/// The variant names of the enum `T`, as its derived `Deserialize` lists them when it refuses
/// a name.
fn variants<T: DeserializeOwned>() -> &'static [&'static str] {
    match parse_word::<T>("") {
        Err(Refused { variants }) => variants,
        Ok(_) => &[],
    }
}

/// `word` read by `T`'s own `Deserialize` (a unit-variant enum such as [`BackendKind`]).
fn parse_word<T: DeserializeOwned>(word: &str) -> Result<T, Refused> {
    T::deserialize(serde::de::value::StrDeserializer::<Refused>::new(word))
}

/// Why [`parse_word`] failed: the names that would have been accepted.
#[derive(Debug)]
struct Refused {
    variants: &'static [&'static str],
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "expected one of {:?}", self.variants)
    }
}

impl std::error::Error for Refused {}

impl serde::de::Error for Refused {
    fn custom<T: fmt::Display>(_: T) -> Refused {
        Refused { variants: &[] }
    }

    fn unknown_variant(_: &str, expected: &'static [&'static str]) -> Refused {
        Refused { variants: expected }
    }
}

// ---- What `load` returns ------------------------------------------------------------------------

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

/// A place in a manifest: line and column, both counted from 1 (columns in characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// The line.
    pub line: u32,
    /// The column.
    pub column: u32,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// A mistake in the declaration, the command line or the environment. Each names the file
/// with the line and column at fault (except for what is not in a file: an unreadable
/// manifest, a variable, a flag), the key (a dotted path, step indices counted from 0), and
/// says what is expected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The manifest cannot be read.
    #[error("cannot read `{}`", file.display())]
    Read {
        /// The manifest.
        file: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The manifest is not valid TOML.
    #[error("`{}:{at}` is not valid TOML: {message}", file.display())]
    Parse {
        /// The manifest.
        file: PathBuf,
        /// Where.
        at: Location,
        /// The TOML parser's message, with line and column.
        message: String,
    },
    /// The manifest has no `[package]` with a `name`.
    #[error("`{}:{at}`: `{key}` is missing: this is not a package manifest. Point at the `Cargo.toml` of the package that declares `[package.metadata.promptgen]`.", file.display())]
    NoPackage {
        /// The manifest.
        file: PathBuf,
        /// Where (the `[package]` table, or the start of the file).
        at: Location,
        /// `package.name`.
        key: String,
    },
    /// The package declares no chain.
    #[error("`{}:{at}` has no `[{key}]` table, so it declares no prompt chain. Declare one:\n\n[package.metadata.promptgen]\nmodel = \"qwen2.5-coder:7b\"\n\n[[package.metadata.promptgen.steps]]\nid = \"01\"\nprompt = \"prompts/01.md\"\noutputs = [\"generated.rs\"]", file.display())]
    NoChain {
        /// The manifest.
        file: PathBuf,
        /// Where (the `[package]` table).
        at: Location,
        /// `package.metadata.promptgen`.
        key: String,
    },
    /// A key that means nothing here (often a typo).
    #[error("`{}:{at}`: unknown key `{key}`{hint} Known keys here: {known}.", file.display())]
    UnknownKey {
        /// The manifest.
        file: PathBuf,
        /// Where.
        at: Location,
        /// The full key.
        key: String,
        /// ``; did you mean `x`?``, another hint ending in its punctuation, or `.`.
        hint: String,
        /// The keys accepted at that level, comma-separated.
        known: String,
    },
    /// A value of the wrong TOML type.
    #[error("`{}:{at}`: `{key}` must be {expected}, found {found}.", file.display())]
    WrongType {
        /// The manifest.
        file: PathBuf,
        /// Where.
        at: Location,
        /// The full key.
        key: String,
        /// What is expected.
        expected: String,
        /// What was found.
        found: String,
    },
    /// A value of the right type that is not allowed.
    #[error("`{}:{at}`: `{key}` = {value} is not allowed: expected {expected}.", file.display())]
    InvalidValue {
        /// The manifest.
        file: PathBuf,
        /// Where.
        at: Location,
        /// The full key.
        key: String,
        /// The value as found.
        value: String,
        /// What is expected.
        expected: String,
    },
    /// A key is set under its name and under its old name in one table.
    #[error("`{}:{at}`: `{key}` and `{old}` are both set, but they are one setting (`{old}` is its old name); keep one.", file.display())]
    SetTwice {
        /// The manifest.
        file: PathBuf,
        /// Where (the second of the two).
        at: Location,
        /// The full key.
        key: String,
        /// The full key under its old name.
        old: String,
    },
    /// A required key is missing (or `steps` is empty).
    #[error("`{}:{at}`: `{key}` is missing: {hint}", file.display())]
    Missing {
        /// The manifest.
        file: PathBuf,
        /// Where (the table that lacks it).
        at: Location,
        /// The full key.
        key: String,
        /// What to add.
        hint: String,
    },
    /// Two steps have the same id.
    #[error("`{}:{at}`: `{key}`: step id `{id}` is already used by `{first_key}`; step ids must be unique.", file.display())]
    DuplicateId {
        /// The manifest.
        file: PathBuf,
        /// Where (the second use).
        at: Location,
        /// The key of the second use.
        key: String,
        /// The id.
        id: String,
        /// The key of the first use.
        first_key: String,
    },
    /// `after` names a step the chain does not have.
    #[error("`{}:{at}`: `{key}`: step `{step}` runs after `{after}`, but there is no step `{after}`; the steps are: {}.", file.display(), known.join(", "))]
    UnknownAfter {
        /// The manifest.
        file: PathBuf,
        /// Where (the id in `after`).
        at: Location,
        /// The full key (`...steps[2].after[0]`).
        key: String,
        /// The step that declares it.
        step: String,
        /// The id it names.
        after: String,
        /// The ids there are.
        known: Vec<String>,
    },
    /// A step names itself in its own `after`.
    #[error("`{}:{at}`: `{key}`: step `{step}` names itself in `after`, but a step cannot run after itself; remove \"{step}\" from it.", file.display())]
    AfterItself {
        /// The manifest.
        file: PathBuf,
        /// Where (the id in `after`).
        at: Location,
        /// The full key.
        key: String,
        /// The step.
        step: String,
    },
    /// Steps wait for each other in a cycle, so none of them can start.
    #[error("`{}:{at}`: `{key}`: steps wait for each other in a cycle, so none of them can start: {}. Remove one of these from an `after` (a step without `after` runs after the step before it in id order).", file.display(), describe_cycle(cycle))]
    Cycle {
        /// The manifest.
        file: PathBuf,
        /// Where (an id in `after` that closes the cycle).
        at: Location,
        /// The full key of that id.
        key: String,
        /// The cycle: each link's step runs after the next link's step, the last after the first.
        cycle: Vec<CycleLink>,
    },
    /// Two steps of which neither runs after the other declare the same output.
    #[error("`{}:{at}`: `{key}` = {path:?}: steps `{first}` and `{second}` both declare `{path}`, and neither runs after the other, so which of their files the crate gets would depend on which ran last. Make one run after the other (e.g. `after = [\"{first}\"]` in step `{second}`), or give each its own file.", file.display())]
    SharedOutput {
        /// The manifest.
        file: PathBuf,
        /// Where (the second step's output).
        at: Location,
        /// The full key of the second step's output.
        key: String,
        /// The output, as normalised.
        path: String,
        /// The step that declares it first (in id order).
        first: String,
        /// The other.
        second: String,
    },
    /// A file the declaration names does not exist.
    #[error("`{}:{at}`: `{key}`: the {what}, `{}`, does not exist (paths are relative to `{}`).", file.display(), path.display(), relative_to.display())]
    FileNotFound {
        /// The manifest.
        file: PathBuf,
        /// Where.
        at: Location,
        /// The full key.
        key: String,
        /// The path it resolved to.
        path: PathBuf,
        /// The folder it is relative to.
        relative_to: PathBuf,
        /// What the file is for (``prompt of step `01` ``).
        what: String,
    },
    /// A file or folder the declaration names cannot be looked at, for another reason than
    /// not existing (permission denied, a path through a file, ...).
    #[error("`{}:{at}`: `{key}`: cannot use the {what}, `{}`", file.display(), path.display())]
    Unreadable {
        /// The manifest.
        file: PathBuf,
        /// Where.
        at: Location,
        /// The full key.
        key: String,
        /// The path it resolved to.
        path: PathBuf,
        /// What the file or folder is for.
        what: String,
        /// The operating system's reason.
        #[source]
        source: io::Error,
    },
    /// A symbolic link in an input folder leads outside the package, to nothing, or to a
    /// folder that holds it.
    #[error("`{}:{at}`: `{key}`: the symbolic link `{}` leads to `{}`, {reason}.", file.display(), link.display(), target.display())]
    InputLink {
        /// The manifest.
        file: PathBuf,
        /// Where (the input that holds the link).
        at: Location,
        /// The full key.
        key: String,
        /// The link.
        link: PathBuf,
        /// Where it leads.
        target: PathBuf,
        /// Why it is not followed, and what to do instead.
        reason: String,
    },
    /// A path that must be a file is something else (a folder).
    #[error("`{}:{at}`: `{key}` = {value:?}: `{}` is a folder, but the {what} must be a file.", file.display(), path.display())]
    NotAFile {
        /// The manifest.
        file: PathBuf,
        /// Where.
        at: Location,
        /// The full key.
        key: String,
        /// The path as written.
        value: String,
        /// The path it resolved to.
        path: PathBuf,
        /// What the file is for.
        what: String,
    },
    /// An output or input path breaks the rules for paths the model sees.
    #[error("`{}:{at}`: `{key}` = {value:?} {reason}.", file.display())]
    BadPath {
        /// The manifest.
        file: PathBuf,
        /// Where.
        at: Location,
        /// The full key.
        key: String,
        /// The path as written.
        value: String,
        /// What is wrong and what to write instead.
        reason: String,
    },
    /// No layer names a model for some steps.
    #[error("`{}:{at}`: `{key}` is missing and {} no `model` of {}: set `model` in `[package.metadata.promptgen]` (e.g. model = \"qwen2.5-coder:7b\"), in each step, in `[workspace.metadata.promptgen]`, or with PROMPTGEN_MODEL or --model.", file.display(), steps_without_model(steps), if steps.len() == 1 { "its own" } else { "their own" })]
    MissingModel {
        /// The package manifest.
        file: PathBuf,
        /// Where (the chain's table).
        at: Location,
        /// `package.metadata.promptgen.model`.
        key: String,
        /// The ids of the steps without a model.
        steps: Vec<String>,
    },
    /// The `scripted` backend is chosen and a step has no script.
    #[error("`{}:{at}`: `{key}` is missing: step `{step}` needs a script because the {backend} replays canned turns from a file. Set `script = \"scripts/{step}.toml\"` in the step, or choose another backend.", file.display())]
    MissingScript {
        /// The package manifest.
        file: PathBuf,
        /// Where (the step's table).
        at: Location,
        /// `package.metadata.promptgen.steps[i].script`.
        key: String,
        /// The step's id.
        step: String,
        /// ``backend `scripted` (from ...)``.
        backend: String,
    },
    /// An environment variable has a value that cannot be used.
    #[error("environment variable {key}={value:?} is not allowed: expected {expected} (while loading `{}`). Fix or unset {key}.", file.display())]
    Env {
        /// The package manifest being loaded.
        file: PathBuf,
        /// The variable's name.
        key: String,
        /// Its value.
        value: String,
        /// What is expected.
        expected: String,
    },
    /// `store = "cache"`, and the environment names no cache folder.
    #[error("`{}:{at}`: `{key}` = \"cache\" needs a cache folder, and the environment names none (neither {CACHE_DIR_VAR} nor the user's cache folder: XDG_CACHE_HOME or HOME, LOCALAPPDATA on Windows). Set {CACHE_DIR_VAR} to an absolute path.", file.display())]
    NoCacheDir {
        /// The manifest that sets `store`.
        file: PathBuf,
        /// Where.
        at: Location,
        /// The full key.
        key: String,
    },
    /// A command-line flag has a value that cannot be used.
    #[error("{key} {value:?} is not allowed: expected {expected} (while loading `{}`).", file.display())]
    Flag {
        /// The package manifest being loaded.
        file: PathBuf,
        /// The flag (`--backend`).
        key: String,
        /// Its value.
        value: String,
        /// What is expected.
        expected: String,
    },
}

/// One link of a [`ConfigError::Cycle`]: `step` runs after the next link's step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CycleLink {
    /// The step.
    pub step: String,
    /// Whether it runs after the next step because it declares no `after` (the next is the
    /// step before it in id order) rather than by its own `after`.
    pub implicit: bool,
}

/// `01 runs after 03, 03 runs after 02 (the step before it: it declares no `after`), and 02
/// runs after 01`.
fn describe_cycle(cycle: &[CycleLink]) -> String {
    let links: Vec<String> = cycle
        .iter()
        .zip(cycle.iter().cycle().skip(1))
        .map(|(link, next)| {
            let why = if link.implicit { " (the step before it: it declares no `after`)" } else { "" };
            format!("{} runs after {}{why}", link.step, next.step)
        })
        .collect();
    match links.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{}, and {last}", rest.join(", ")),
    }
}

/// ``step `02` sets`` or ``steps `02`, `03` set``.
fn steps_without_model(ids: &[String]) -> String {
    let list = ids.iter().map(|id| format!("`{id}`")).collect::<Vec<_>>().join(", ");
    if ids.len() == 1 { format!("step {list} sets") } else { format!("steps {list} set") }
}

impl ConfigError {
    /// The file at fault (for [`ConfigError::Env`] and [`ConfigError::Flag`], the manifest
    /// being loaded).
    pub fn file(&self) -> &Path {
        match self {
            ConfigError::Read { file, .. }
            | ConfigError::Parse { file, .. }
            | ConfigError::NoPackage { file, .. }
            | ConfigError::NoChain { file, .. }
            | ConfigError::UnknownKey { file, .. }
            | ConfigError::WrongType { file, .. }
            | ConfigError::InvalidValue { file, .. }
            | ConfigError::SetTwice { file, .. }
            | ConfigError::Missing { file, .. }
            | ConfigError::DuplicateId { file, .. }
            | ConfigError::UnknownAfter { file, .. }
            | ConfigError::AfterItself { file, .. }
            | ConfigError::Cycle { file, .. }
            | ConfigError::SharedOutput { file, .. }
            | ConfigError::FileNotFound { file, .. }
            | ConfigError::Unreadable { file, .. }
            | ConfigError::InputLink { file, .. }
            | ConfigError::NotAFile { file, .. }
            | ConfigError::BadPath { file, .. }
            | ConfigError::MissingModel { file, .. }
            | ConfigError::MissingScript { file, .. }
            | ConfigError::Env { file, .. }
            | ConfigError::NoCacheDir { file, .. }
            | ConfigError::Flag { file, .. } => file,
        }
    }

    /// The key at fault: a dotted path, an environment variable or a flag; `None` when the
    /// whole file is (unreadable, not TOML).
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Read { .. } | ConfigError::Parse { .. } => None,
            ConfigError::NoPackage { key, .. }
            | ConfigError::NoChain { key, .. }
            | ConfigError::UnknownKey { key, .. }
            | ConfigError::WrongType { key, .. }
            | ConfigError::InvalidValue { key, .. }
            | ConfigError::SetTwice { key, .. }
            | ConfigError::Missing { key, .. }
            | ConfigError::DuplicateId { key, .. }
            | ConfigError::UnknownAfter { key, .. }
            | ConfigError::AfterItself { key, .. }
            | ConfigError::Cycle { key, .. }
            | ConfigError::SharedOutput { key, .. }
            | ConfigError::FileNotFound { key, .. }
            | ConfigError::Unreadable { key, .. }
            | ConfigError::InputLink { key, .. }
            | ConfigError::NotAFile { key, .. }
            | ConfigError::BadPath { key, .. }
            | ConfigError::MissingModel { key, .. }
            | ConfigError::MissingScript { key, .. }
            | ConfigError::Env { key, .. }
            | ConfigError::NoCacheDir { key, .. }
            | ConfigError::Flag { key, .. } => Some(key),
        }
    }

    /// Where in [`ConfigError::file`] the mistake is; `None` for what is not in the file (an
    /// unreadable manifest, a variable, a flag).
    pub fn location(&self) -> Option<Location> {
        match self {
            ConfigError::Read { .. } | ConfigError::Env { .. } | ConfigError::Flag { .. } => None,
            ConfigError::Parse { at, .. }
            | ConfigError::NoPackage { at, .. }
            | ConfigError::NoChain { at, .. }
            | ConfigError::UnknownKey { at, .. }
            | ConfigError::WrongType { at, .. }
            | ConfigError::InvalidValue { at, .. }
            | ConfigError::SetTwice { at, .. }
            | ConfigError::Missing { at, .. }
            | ConfigError::DuplicateId { at, .. }
            | ConfigError::UnknownAfter { at, .. }
            | ConfigError::AfterItself { at, .. }
            | ConfigError::Cycle { at, .. }
            | ConfigError::SharedOutput { at, .. }
            | ConfigError::FileNotFound { at, .. }
            | ConfigError::Unreadable { at, .. }
            | ConfigError::InputLink { at, .. }
            | ConfigError::NotAFile { at, .. }
            | ConfigError::BadPath { at, .. }
            | ConfigError::MissingModel { at, .. }
            | ConfigError::MissingScript { at, .. }
            | ConfigError::NoCacheDir { at, .. } => Some(*at),
        }
    }
}

// ---- A manifest's text: reading it, and pointing into it ---------------------------------------

/// A manifest and its text, so that errors can say where.
struct Source {
    file: PathBuf,
    text: String,
}

/// Where a table sits, for the hints of unknown keys.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Package,
    Workspace,
    Step,
    /// `[package.metadata.promptgen.eval]`.
    Eval,
    /// `[workspace.metadata.promptgen.eval]`, where `steps` is an error.
    WorkspaceEval,
}

impl Source {
    fn read(file: &Path) -> Result<Source, ConfigError> {
        let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Read { file: file.into(), source })?;
        Ok(Source { file: file.into(), text })
    }

    /// The line and column of the byte `offset`.
    fn at(&self, offset: usize) -> Location {
        let before = self.text.get(..offset.min(self.text.len())).unwrap_or(&self.text);
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).saturating_add(1);
        Location { line: count(before.matches('\n').count()), column: count(before[line_start..].chars().count()) }
    }

    fn at_span<T>(&self, value: &Spanned<T>) -> Location {
        self.at(value.span().start)
    }

    /// The document as `T`, reporting the first key nobody declared under one of `watched`
    /// (dotted prefixes such as `package.metadata.promptgen`) as [`ConfigError::UnknownKey`].
    fn parse<T: DeserializeOwned>(&self, watched: &[&str]) -> Result<T, ConfigError> {
        let deserializer = toml::de::Deserializer::parse(&self.text).map_err(|e| self.syntax(&e))?;
        let mut unknown = Vec::new();
        let result = serde_ignored::deserialize(deserializer, |path| {
            let key = dotted(&path);
            if watched.iter().any(|prefix| key.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('.'))) {
                unknown.push(key);
            }
        });
        // A misspelt key explains more than what follows from it.
        if let Some(key) = unknown.first() {
            return Err(self.unknown_key(key));
        }
        result.map_err(|e| self.mistake(&e))
    }

    /// A TOML syntax error.
    fn syntax(&self, error: &toml::de::Error) -> ConfigError {
        ConfigError::Parse {
            file: self.file.clone(),
            at: self.at(error.span().map_or(0, |s| s.start)),
            message: error.to_string().trim_end().to_string(),
        }
    }

    fn unknown_key(&self, key: &str) -> ConfigError {
        let (table, name) = key.rsplit_once('.').unwrap_or(("", key));
        let level = if table.contains(".steps[") {
            Level::Step
        } else if table == format!("{WORKSPACE_PREFIX}.eval") {
            Level::WorkspaceEval
        } else if table == format!("{PACKAGE_PREFIX}.eval") {
            Level::Eval
        } else if table.starts_with("workspace.") {
            Level::Workspace
        } else {
            Level::Package
        };
        let span = Doc::parse(&self.text).and_then(|doc| doc.key_span(key)).unwrap_or(0..0);
        unknown_key_error(&self.file, self.at(span.start), level, table, name)
    }

    /// A value serde refused, as the error that names its key and says what it must be.
    fn mistake(&self, error: &toml::de::Error) -> ConfigError {
        let span = error.span().unwrap_or(0..0);
        let at = self.at(span.start);
        let message = error.message();
        let Some(doc) = Doc::parse(&self.text) else { return self.syntax(error) };
        let Some((key, value)) = doc.value_at(&span) else {
            return ConfigError::Parse { file: self.file.clone(), at, message: message.to_string() };
        };
        if message.starts_with("duplicate field") {
            // TOML refuses a key set twice, so serde sees one only when a key meets its old name.
            let aliases = if key.contains(".steps[") { StepTable::ALIASES } else { ChainTable::ALIASES };
            if let Some((old, new)) = aliases.iter().find(|(_, new)| message.contains(&format!("`{new}`"))) {
                let (old, new) = (format!("{key}.{old}"), format!("{key}.{new}"));
                let second = [&old, &new].iter().filter_map(|k| doc.key_span(k)).map(|s| s.start).max();
                return ConfigError::SetTwice {
                    file: self.file.clone(),
                    at: self.at(second.unwrap_or(span.start)),
                    key: new,
                    old,
                };
            }
        }
        // serde's own words for what it wanted, kept when the key has no description.
        let serde_expected = message.rsplit_once(", expected ").map(|(_, e)| e.to_string());
        let expected = expected_of(&key).or(serde_expected).unwrap_or_else(|| message.to_string());
        let raw = self.text.get(value.span()).unwrap_or_default().trim().to_string();
        let wrong_value = message.starts_with("invalid value")
            || message.starts_with("unknown variant")
            // An untagged value (`check`) of a type it can take, with the wrong contents.
            || (!message.starts_with("invalid type")
                && matches!(value.get_ref(), DeValue::String(_) | DeValue::Array(_)));
        if wrong_value {
            ConfigError::InvalidValue { file: self.file.clone(), at, key, value: raw, expected }
        } else {
            ConfigError::WrongType { file: self.file.clone(), at, key, expected, found: describe(value.get_ref()) }
        }
    }
}

/// `package.metadata.promptgen.steps[0].promt`: a path as serde_ignored reports it, without
/// the wrappers (`Option`, `Spanned`) it passes through.
fn dotted(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path as P;
    match path {
        P::Root => String::new(),
        P::Seq { parent, index } => format!("{}[{index}]", dotted(parent)),
        P::Map { parent, key } if key.starts_with("$__serde_spanned_private") => dotted(parent),
        P::Map { parent, key } => match dotted(parent) {
            parent if parent.is_empty() => key.clone(),
            parent => format!("{parent}.{key}"),
        },
        P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => dotted(parent),
    }
}

/// What the promptgen key at the end of the dotted path `key` must hold, if it is one.
fn expected_of(key: &str) -> Option<String> {
    let (table, name) = key.rsplit_once('.')?;
    let in_promptgen = [PACKAGE_PREFIX, WORKSPACE_PREFIX].iter().any(|p| table.starts_with(p));
    if !in_promptgen || name.ends_with(']') {
        None
    } else if table.contains(".steps[") {
        StepTable::expected(name)
    } else if table.ends_with(".eval.steps") {
        Some(format!("{RATE_EXPECTED}: the rate step `{name}` must reach"))
    } else if table.ends_with(".eval") {
        EvalTable::expected(name)
    } else {
        ChainTable::expected(name)
    }
}

/// The error for the key `name` that nobody declared in the table `table` at `level`.
fn unknown_key_error(file: &Path, at: Location, level: Level, table: &str, name: &str) -> ConfigError {
    let (known, aliases) = match level {
        Level::Step => (StepTable::KEYS, StepTable::ALIASES),
        Level::Eval | Level::WorkspaceEval => (EvalTable::KEYS, EvalTable::ALIASES),
        Level::Package | Level::Workspace => (ChainTable::KEYS, ChainTable::ALIASES),
    };
    let in_workspace = matches!(level, Level::Workspace | Level::WorkspaceEval);
    let known: Vec<&str> = known.iter().copied().filter(|k| !in_workspace || *k != "steps").collect();
    let step_only = |k: &&str| StepTable::KEYS.contains(k) && !ChainTable::KEYS.contains(k);
    let chain_only = |k: &&str| ChainTable::KEYS.contains(k) && !StepTable::KEYS.contains(k);
    let hint = if name == "api_key" {
        "; API keys do not belong in Cargo.toml: set OPENAI_API_KEY in the environment.".to_string()
    } else if matches!(level, Level::Package | Level::Workspace) && step_only(&name) {
        format!("; `{name}` belongs to a step: put it under `[[package.metadata.promptgen.steps]]`.")
    } else if level == Level::Step && chain_only(&name) {
        format!("; `{name}` applies to the whole chain: set it in `[package.metadata.promptgen]`.")
    } else if level == Level::Workspace && name == "steps" {
        "; steps are declared by each package, in `[[package.metadata.promptgen.steps]]`.".to_string()
    } else if level == Level::WorkspaceEval && name == "steps" {
        "; per-step rates name one package's steps: set them in that package's `[package.metadata.promptgen.eval]`."
            .to_string()
    } else {
        let candidates = known.iter().copied().chain(aliases.iter().map(|(old, _)| *old));
        match closest(name, candidates) {
            Some(candidate) => {
                let new = aliases.iter().find(|(old, _)| *old == candidate).map_or(candidate, |(_, new)| *new);
                format!("; did you mean `{new}`?")
            }
            None => ".".to_string(),
        }
    };
    ConfigError::UnknownKey {
        file: file.into(),
        at,
        key: format!("{table}.{name}"),
        hint,
        known: known.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", "),
    }
}

/// The known key nearest to `name`, if it is at most 2 edits away.
fn closest<'k>(name: &str, known: impl Iterator<Item = &'k str>) -> Option<&'k str> {
    known
        .map(|k| (edit_distance(&name.to_ascii_lowercase(), k), k))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

fn describe(value: &DeValue<'_>) -> String {
    match value {
        DeValue::String(s) => format!("the string {s:?}"),
        DeValue::Integer(i) => format!("the integer {}", i.as_str()),
        DeValue::Float(f) => format!("the float {}", f.as_str()),
        DeValue::Boolean(b) => format!("the boolean {b}"),
        DeValue::Datetime(d) => format!("the datetime {d}"),
        DeValue::Array(_) => "an array".into(),
        DeValue::Table(_) => "a table".into(),
    }
}

/// A manifest parsed with the span of every key and value, to find what an error is about
/// (only errors need it).
struct Doc<'t> {
    root: Spanned<DeValue<'t>>,
}

/// A key's dotted path (`a.steps[0].b`; an array's items are `a[0]`), its span, its value.
type Entry<'a, 't> = (String, Range<usize>, &'a Spanned<DeValue<'t>>);

impl<'t> Doc<'t> {
    fn parse(text: &'t str) -> Option<Doc<'t>> {
        let root = DeTable::parse(text).ok()?;
        Some(Doc { root: Spanned::new(root.span(), DeValue::Table(root.into_inner())) })
    }

    fn entries(&self) -> Vec<Entry<'_, 't>> {
        fn walk<'a, 't>(
            path: String,
            key: Range<usize>,
            value: &'a Spanned<DeValue<'t>>,
            out: &mut Vec<Entry<'a, 't>>,
        ) {
            match value.get_ref() {
                DeValue::Table(table) => {
                    for (k, v) in table.iter() {
                        let inner =
                            if path.is_empty() { k.get_ref().to_string() } else { format!("{path}.{}", k.get_ref()) };
                        walk(inner, k.span(), v, out);
                    }
                }
                DeValue::Array(items) => {
                    for (i, item) in items.iter().enumerate() {
                        walk(format!("{path}[{i}]"), item.span(), item, out);
                    }
                }
                _ => {}
            }
            out.push((path, key, value));
        }
        let mut out = Vec::new();
        walk(String::new(), 0..0, &self.root, &mut out);
        out
    }

    /// The span of the key at the dotted path `key`.
    fn key_span(&self, key: &str) -> Option<Range<usize>> {
        self.entries().into_iter().find(|(path, _, _)| path == key).map(|(_, span, _)| span)
    }

    /// The dotted path and the value of the smallest value whose span holds `span`.
    fn value_at(&self, span: &Range<usize>) -> Option<(String, &Spanned<DeValue<'t>>)> {
        let holds = |s: &Range<usize>| s.start <= span.start && span.end <= s.end && !s.is_empty();
        let entries = self.entries().into_iter().filter(|(path, _, v)| !path.is_empty() && holds(&v.span()));
        // A value comes after what it holds, so of equal spans (an array of tables and its
        // item) the first, the deepest, wins.
        entries.min_by_key(|(_, _, v)| v.span().len()).map(|(path, _, value)| (path, value))
    }
}

// ---- Loading ------------------------------------------------------------------------------------

// ---- Editing the manifest ----------------------------------------------------------------------

/// `text`, a package manifest, with `store = "<mode>"` in its `[package.metadata.promptgen]`
/// table: the value replaced where the table sets it, else a line added under the table's
/// header, everything else byte for byte as it was. `Err` says the line to add by hand when the
/// table has no header of its own (written inline, or with dotted keys under `[package]`), or
/// when the result would not read back as that mode.
pub fn with_store(text: &str, mode: StoreMode) -> Result<String, String> {
    let line = format!("store = \"{mode}\"");
    let by_hand = || format!("add `{line}` to its `[{PACKAGE_PREFIX}]` table");
    let doc = Doc::parse(text).ok_or_else(by_hand)?;
    let key = format!("{PACKAGE_PREFIX}.store");
    let set = doc.entries().into_iter().find(|(path, _, _)| *path == key).map(|(_, _, value)| value.span());
    let edited = match set {
        Some(span) => format!("{}\"{mode}\"{}", &text[..span.start], &text[span.end..]),
        None => {
            // Just after the line `[package.metadata.promptgen]` (spaces and a comment allowed).
            let mut offset = 0;
            let mut after_header = None;
            for candidate in text.split_inclusive('\n') {
                let code = candidate.split('#').next().unwrap_or("");
                let compact: String = code.chars().filter(|c| !c.is_whitespace()).collect();
                offset += candidate.len();
                if compact == format!("[{PACKAGE_PREFIX}]") {
                    after_header = Some((offset, candidate.ends_with('\n')));
                    break;
                }
            }
            let (at, newline) = after_header.ok_or_else(by_hand)?;
            let newline = if newline { "" } else { "\n" };
            format!("{}{newline}{line}\n{}", &text[..at], &text[at..])
        }
    };
    let read: toml::Table = toml::from_str(&edited).map_err(|_| by_hand())?;
    let store = read
        .get("package")
        .and_then(|v| v.get("metadata"))
        .and_then(|v| v.get("promptgen"))
        .and_then(|v| v.get("store"))
        .and_then(|v| v.as_str());
    if store == Some(mode.as_str()) { Ok(edited) } else { Err(by_hand()) }
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
    let file = manifest_path.as_path();
    let package_dir = file.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    let manifest: Manifest = src.parse(&[PACKAGE_PREFIX, WORKSPACE_PREFIX])?;

    let no_package = |at| ConfigError::NoPackage { file: file.into(), at, key: "package.name".into() };
    let package = manifest.package.as_ref().ok_or_else(|| no_package(Location { line: 1, column: 1 }))?;
    let package_name =
        package.get_ref().name.as_ref().ok_or_else(|| no_package(src.at_span(package)))?.get_ref().clone();
    let chain_table = package.get_ref().metadata.as_ref().and_then(|m| m.promptgen.as_ref()).ok_or_else(|| {
        ConfigError::NoChain { file: file.into(), at: src.at_span(package), key: PACKAGE_PREFIX.into() }
    })?;

    let package_ctx = Ctx { src: &src, prefix: PACKAGE_PREFIX.into(), base: &package_dir };
    let package_layer = Layer::check(&package_ctx, chain_table.get_ref(), Origin::Package)?;
    let declared = check_steps(&package_ctx, chain_table)?;

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
        if let Some(steps) = &chain.get_ref().steps {
            let at = ws_src
                .at(Doc::parse(&ws_src.text).and_then(|d| d.key_span(&ctx.key("steps"))).unwrap_or(steps.span()).start);
            return Err(unknown_key_error(&ws_src.file, at, Level::Workspace, WORKSPACE_PREFIX, "steps"));
        }
        if let Some(steps) = chain.get_ref().eval.as_ref().and_then(|e| e.get_ref().steps.as_ref()) {
            let key = ctx.key("eval.steps");
            let at = ws_src.at(Doc::parse(&ws_src.text).and_then(|d| d.key_span(&key)).unwrap_or(steps.span()).start);
            return Err(unknown_key_error(&ws_src.file, at, Level::WorkspaceEval, &ctx.key("eval"), "steps"));
        }
        layers.push(Layer::check(&ctx, chain.get_ref(), Origin::Workspace)?);
    }
    // The first layer that sets a chain-level value, with its origin.
    fn pick<T>(layers: &[Layer<'_>], get: impl Fn(&ChainTable) -> Option<T>) -> Option<(T, Origin)> {
        layers.iter().find_map(|layer| get(layer.table).map(|v| (v, layer.origin)))
    }

    let flag = |value: &Option<String>| value.as_deref().map(str::trim).filter(|v| !v.is_empty()).map(str::to_string);
    let var = |name: &'static str| env(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());

    // Backend.
    let backend_expected = || one_of::<BackendKind>();
    let (backend, backend_origin) = if let Some(value) = flag(&overrides.backend) {
        let kind = parse_word::<BackendKind>(&value).map_err(|_| ConfigError::Flag {
            file: file.into(),
            key: "--backend".into(),
            value: value.clone(),
            expected: backend_expected(),
        })?;
        (kind, Origin::Flag)
    } else if let Some(value) = var("PROMPTGEN_BACKEND") {
        let kind = parse_word::<BackendKind>(&value).map_err(|_| ConfigError::Env {
            file: file.into(),
            key: "PROMPTGEN_BACKEND".into(),
            value: value.clone(),
            expected: backend_expected(),
        })?;
        (kind, Origin::Env("PROMPTGEN_BACKEND"))
    } else {
        pick(&layers, |t| value(&t.backend)).unwrap_or((BackendKind::Ollama, Origin::Default))
    };

    // Base URL and key.
    let backend_var = match backend {
        BackendKind::Ollama => Some("OLLAMA_HOST"),
        BackendKind::OpenAi => Some("OPENAI_BASE_URL"),
        BackendKind::Scripted => None,
    };
    let (base_url, base_url_origin) = if let Some(value) = flag(&overrides.base_url) {
        (Some(value), Origin::Flag)
    } else if let Some(value) = var("PROMPTGEN_BASE_URL") {
        (Some(value), Origin::Env("PROMPTGEN_BASE_URL"))
    } else if let Some((name, value)) = backend_var.and_then(|name| var(name).map(|v| (name, v))) {
        let value = if backend == BackendKind::Ollama { parse_host(&value) } else { value };
        (Some(value), Origin::Env(name))
    } else {
        match pick(&layers, |t| t.base_url.as_ref().map(|u| u.get_ref().clone())) {
            Some((url, origin)) => (Some(url), origin),
            None => (None, Origin::Default),
        }
    };
    let api_key = if backend == BackendKind::OpenAi { var("OPENAI_API_KEY") } else { None };

    let num_ctx = pick(&layers, |t| value(&t.num_ctx)).map_or(BackendConfig::DEFAULT_NUM_CTX, |(v, _)| v.get());
    let max_output_tokens = pick(&layers, |t| value(&t.max_output_tokens))
        .map_or(BackendConfig::DEFAULT_MAX_OUTPUT_TOKENS, |(v, _)| v.get());
    let request_timeout = pick(&layers, |t| value(&t.request_timeout_secs))
        .map_or(HttpConfig::default().request_timeout, |(secs, _)| Duration::from_secs(secs.get()));
    let first_byte_timeout = pick(&layers, |t| value(&t.first_byte_timeout_secs))
        .map_or(HttpConfig::default().first_byte_timeout, |(secs, _)| Duration::from_secs(secs.get()));
    let idle_timeout = pick(&layers, |t| value(&t.idle_timeout_secs))
        .map_or(HttpConfig::default().idle_timeout, |(secs, _)| Duration::from_secs(secs.get()));

    let jobs = if let Some(jobs) = overrides.jobs {
        jobs.get()
    } else if let Some(value) = var("PROMPTGEN_JOBS") {
        value
            .parse::<NonZeroU32>()
            .map_err(|_| ConfigError::Env {
                file: file.into(),
                key: "PROMPTGEN_JOBS".into(),
                value: value.clone(),
                expected: JOBS_EXPECTED.into(),
            })?
            .get()
    } else {
        pick(&layers, |t| value(&t.jobs)).map_or(Chain::DEFAULT_JOBS as u32, |(jobs, _)| jobs.get())
    };
    let jobs = usize::try_from(jobs).unwrap_or(usize::MAX);

    let model_override = flag(&overrides.model)
        .map(|m| (m, Origin::Flag))
        .or_else(|| var("PROMPTGEN_MODEL").map(|m| (m, Origin::Env("PROMPTGEN_MODEL"))));

    let mut steps = Vec::with_capacity(declared.len());
    let mut without_model = Vec::new();
    let mut graph_decls = Vec::with_capacity(declared.len());
    for step in declared {
        graph_decls.push(step.graph);
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
            return Err(ConfigError::MissingScript {
                file: file.into(),
                at: src.at(step.at),
                key: format!("{}.script", step.key),
                step: step.id.clone(),
                backend: format!("backend `scripted` {}", from_phrase(backend_origin, &step.id)),
            });
        }
        let check = layered!(check).unwrap_or_else(|| {
            if step.outputs.iter().any(|o| o.ends_with(".rs")) { CheckSpec::CargoCheck } else { CheckSpec::None }
        });
        steps.push(StepConfig {
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
        });
    }
    if !without_model.is_empty() {
        return Err(ConfigError::MissingModel {
            file: file.into(),
            at: src.at_span(chain_table),
            key: format!("{PACKAGE_PREFIX}.model"),
            steps: without_model,
        });
    }
    steps.sort_by(|a, b| a.id.cmp(&b.id));
    let graph = resolve_graph(&src, &mut steps, graph_decls)?;
    let eval = eval_settings(&package_ctx, chain_table.get_ref(), &layers, &steps)?;
    let edition = package_edition(&src, package.get_ref(), workspace_table.map(|(_, table, _)| table))?;

    // Where the outputs live, and the cache folder (needed in cache mode, and to switch to it).
    let store = pick(&layers, |t| value(&t.store)).map_or(StoreMode::Repo, |(mode, _)| mode);
    let cache_url = layers.iter().find_map(|l| l.cache_url.clone());
    let cache_dir = crate::cache::default_dir(env).map_err(|(key, value)| ConfigError::Env {
        file: file.into(),
        key: key.into(),
        value,
        expected: "an absolute path to the cache folder".into(),
    })?;
    if store == StoreMode::Cache
        && cache_dir.is_none()
        && let Some((file, at, key)) = layers.iter().find_map(|l| l.store_at.clone())
    {
        return Err(ConfigError::NoCacheDir { file, at, key });
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

/// `[package.metadata.promptgen.eval]` over the workspace's: the package's `min_pass_rate`
/// beats the workspace's, and each rate of `steps` must be for a step of the chain.
fn eval_settings(
    ctx: &Ctx<'_>,
    package: &ChainTable,
    layers: &[Layer<'_>],
    steps: &[StepConfig],
) -> Result<EvalSettings, ConfigError> {
    let min_pass_rate = layers.iter().find_map(|l| l.min_pass_rate);
    let mut per_step = BTreeMap::new();
    let declared = package.eval.as_ref().and_then(|e| e.get_ref().steps.as_ref());
    for (id, rate) in declared.map(Spanned::get_ref).into_iter().flatten() {
        let name = format!("eval.steps.{id}");
        if steps.iter().all(|s| s.id != *id) {
            let ids = || steps.iter().map(|s| s.id.as_str());
            return Err(ConfigError::UnknownKey {
                file: ctx.src.file.clone(),
                at: ctx.src.at_span(rate),
                key: ctx.key(&name),
                hint: match closest(id, ids()) {
                    Some(near) => format!(": the chain has no step `{id}`; did you mean `{near}`?"),
                    None => format!(": the chain has no step `{id}`."),
                },
                known: ids().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", "),
            });
        }
        per_step.insert(id.clone(), ctx.rate(&name, rate)?);
    }
    Ok(EvalSettings { min_pass_rate, steps: per_step })
}

/// The value of an optional key, without its span.
fn value<T: Copy>(key: &Option<Spanned<T>>) -> Option<T> {
    key.as_ref().map(|v| *v.get_ref())
}

/// One table being checked: the manifest, the table's dotted path, and the folder its paths
/// are relative to.
struct Ctx<'a> {
    src: &'a Source,
    prefix: String,
    base: &'a Path,
}

impl Ctx<'_> {
    fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.prefix)
    }

    fn invalid<T>(&self, name: &str, at: &Spanned<T>, value: impl fmt::Display) -> ConfigError {
        ConfigError::InvalidValue {
            file: self.src.file.clone(),
            at: self.src.at_span(at),
            key: self.key(name),
            value: value.to_string(),
            expected: expected_of(&self.key(name)).unwrap_or_default(),
        }
    }

    fn missing<T>(&self, name: &str, table: &Spanned<T>, hint: String) -> ConfigError {
        ConfigError::Missing { file: self.src.file.clone(), at: self.src.at_span(table), key: self.key(name), hint }
    }

    fn bad_path(&self, key: &str, at: &Spanned<String>, reason: String) -> ConfigError {
        ConfigError::BadPath {
            file: self.src.file.clone(),
            at: self.src.at_span(at),
            key: key.into(),
            value: at.get_ref().clone(),
            reason,
        }
    }

    fn non_empty(&self, name: &str, value: &Spanned<String>) -> Result<String, ConfigError> {
        match value.get_ref() {
            s if s.trim().is_empty() => Err(self.invalid(name, value, format!("{s:?}"))),
            s => Ok(s.clone()),
        }
    }

    /// A pass rate, from 0 to 1, at the key `name`.
    fn rate(&self, name: &str, value: &Spanned<f64>) -> Result<f64, ConfigError> {
        let rate = *value.get_ref();
        if (0.0..=1.0).contains(&rate) { Ok(rate) } else { Err(self.invalid(name, value, rate)) }
    }

    fn temperature(&self, value: &Spanned<f64>) -> Result<f64, ConfigError> {
        let t = *value.get_ref();
        if (0.0..=2.0).contains(&t) { Ok(t) } else { Err(self.invalid("temperature", value, t)) }
    }

    fn check(&self, value: &Spanned<CheckValue>) -> Result<CheckSpec, ConfigError> {
        match value.get_ref() {
            CheckValue::Word(word) if word == "cargo check" => Ok(CheckSpec::CargoCheck),
            CheckValue::Word(word) if word == "cargo test" => Ok(CheckSpec::CargoTest),
            CheckValue::Word(word) if word == "rustc" => Ok(CheckSpec::Rustc),
            CheckValue::Word(word) if word == "none" => Ok(CheckSpec::None),
            CheckValue::Command(words) if words.first().is_some_and(|w| !w.trim().is_empty()) => {
                Ok(CheckSpec::Command(words.clone()))
            }
            _ => {
                let written = self.src.text.get(value.span()).unwrap_or_default().trim();
                Err(self.invalid("check", value, written))
            }
        }
    }

    /// The file the key `name` names, relative to the table's folder; it must exist.
    fn existing_file(&self, name: &str, written: &Spanned<String>, what: &str) -> Result<PathBuf, ConfigError> {
        if written.get_ref().trim().is_empty() {
            return Err(ConfigError::InvalidValue {
                file: self.src.file.clone(),
                at: self.src.at_span(written),
                key: self.key(name),
                value: "\"\"".into(),
                expected: "a path to a file".into(),
            });
        }
        self.file_at(name, written, lexical_join(self.base, written.get_ref()), what)
    }

    /// `path`, which the key `name` names (as `written`), if it is a file.
    fn file_at(
        &self,
        name: &str,
        written: &Spanned<String>,
        path: PathBuf,
        what: &str,
    ) -> Result<PathBuf, ConfigError> {
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => Ok(path),
            Ok(_) => Err(ConfigError::NotAFile {
                file: self.src.file.clone(),
                at: self.src.at_span(written),
                key: self.key(name),
                value: written.get_ref().clone(),
                path,
                what: what.into(),
            }),
            Err(e) => Err(self.not_there(self.key(name), written, path, what.into(), e)),
        }
    }

    /// `path`, named by `key` as `written`, cannot be looked at: missing, or `error`.
    fn not_there(
        &self,
        key: String,
        written: &Spanned<String>,
        path: PathBuf,
        what: String,
        error: io::Error,
    ) -> ConfigError {
        let (file, at) = (self.src.file.clone(), self.src.at_span(written));
        match error.kind() {
            io::ErrorKind::NotFound => {
                ConfigError::FileNotFound { file, at, key, path, relative_to: self.base.into(), what }
            }
            _ => ConfigError::Unreadable { file, at, key, path, what, source: error },
        }
    }

    /// Why the input folder named by `key` (as `written`) cannot be walked.
    fn walk_error(&self, key: &str, written: &Spanned<String>, step_id: &str, error: SandboxError) -> ConfigError {
        let (file, at, key) = (self.src.file.clone(), self.src.at_span(written), key.to_string());
        match error {
            SandboxError::InputLink { link, target, reason } => {
                ConfigError::InputLink { file, at, key, link, target, reason }
            }
            SandboxError::Fs(e) => self.not_there(key, written, e.path, format!("input of step `{step_id}`"), e.source),
            other => {
                ConfigError::BadPath { file, at, key, value: written.get_ref().clone(), reason: other.to_string() }
            }
        }
    }

    fn outputs(&self, list: &[Spanned<String>]) -> Result<Vec<String>, ConfigError> {
        let mut outputs: Vec<String> = Vec::new();
        for (i, written) in list.iter().enumerate() {
            let bad = |reason: String| self.bad_path(&self.key(&format!("outputs[{i}]")), written, reason);
            let normalized = output_path(written.get_ref()).map_err(bad)?;
            if outputs.contains(&normalized) {
                return Err(bad("is listed twice".into()));
            }
            outputs.push(normalized);
        }
        Ok(outputs)
    }

    fn inputs(&self, list: &[Spanned<String>], step_id: &str) -> Result<Vec<Input>, ConfigError> {
        let mut inputs: Vec<Input> = Vec::new();
        for (i, written) in list.iter().enumerate() {
            let key = self.key(&format!("inputs[{i}]"));
            let bad = |reason: String| self.bad_path(&key, written, reason);
            let virtual_path = input_virtual_path(written.get_ref()).map_err(bad)?;
            let real_path = lexical_join(self.base, written.get_ref());
            let is_dir = match std::fs::metadata(&real_path) {
                Ok(meta) if meta.is_dir() => true,
                Ok(meta) if meta.is_file() => false,
                Ok(_) => {
                    return Err(bad(format!("names `{}`, which is neither a file nor a folder", real_path.display())));
                }
                Err(e) => return Err(self.not_there(key, written, real_path, format!("input of step `{step_id}`"), e)),
            };
            if is_dir {
                // Its links are followed inside the package only, as the fingerprint and the
                // sandbox follow them.
                input_files(&real_path, Some(self.base)).map_err(|e| self.walk_error(&key, written, step_id, e))?;
            }
            if inputs.iter().any(|i| i.virtual_path == virtual_path) {
                return Err(bad(format!(
                    "is seen by the model as `{virtual_path}`, like an earlier input of the step; list each input once"
                )));
            }
            inputs.push(Input { virtual_path, real_path, is_dir });
        }
        Ok(inputs)
    }
}

/// The keys a step shares with the chain-level tables, checked; `None` where a table is silent.
#[derive(Debug, Default)]
struct Shared {
    model: Option<String>,
    seed: Option<u64>,
    temperature: Option<f64>,
    max_model_calls: Option<u32>,
    protocol: Option<ToolProtocol>,
    system_prompt: Option<PathBuf>,
    check: Option<CheckSpec>,
    check_rounds: Option<u32>,
    seed_retries: Option<u32>,
}

/// The shared keys of `$table` (a `ChainTable` or a `StepTable`), checked in `$ctx`;
/// `$what` names the system prompt in messages.
macro_rules! check_shared {
    ($ctx:expr, $table:expr, $what:expr) => {{
        let (ctx, table): (&Ctx<'_>, _) = ($ctx, $table);
        Shared {
            model: table.model.as_ref().map(|v| ctx.non_empty("model", v)).transpose()?,
            seed: value(&table.seed),
            temperature: table.temperature.as_ref().map(|v| ctx.temperature(v)).transpose()?,
            max_model_calls: value(&table.max_model_calls).map(NonZeroU32::get),
            protocol: value(&table.protocol),
            system_prompt: table
                .system_prompt
                .as_ref()
                .map(|v| ctx.existing_file("system_prompt", v, $what))
                .transpose()?,
            check: table.check.as_ref().map(|v| ctx.check(v)).transpose()?,
            check_rounds: value(&table.check_rounds),
            seed_retries: value(&table.seed_retries),
        }
    }};
}

/// A chain-level table, checked.
struct Layer<'a> {
    origin: Origin,
    table: &'a ChainTable,
    shared: Shared,
    /// `cache_url`, checked.
    cache_url: Option<CacheUrl>,
    /// Where `store` is set: the manifest, the place and the full key.
    store_at: Option<(PathBuf, Location, String)>,
    /// `eval.min_pass_rate`, checked.
    min_pass_rate: Option<f64>,
}

impl<'a> Layer<'a> {
    fn check(ctx: &Ctx<'_>, table: &'a ChainTable, origin: Origin) -> Result<Layer<'a>, ConfigError> {
        if let Some(url) = &table.base_url {
            ctx.non_empty("base_url", url)?;
        }
        let cache_url = match &table.cache_url {
            Some(url) => Some(CacheUrl::parse(url.get_ref()).map_err(|reason| ConfigError::InvalidValue {
                file: ctx.src.file.clone(),
                at: ctx.src.at_span(url),
                key: ctx.key("cache_url"),
                value: format!("{:?}", url.get_ref()),
                expected: format!("{CACHE_URL_EXPECTED}; {reason}"),
            })?),
            None => None,
        };
        let store_at =
            table.store.as_ref().map(|store| (ctx.src.file.clone(), ctx.src.at_span(store), ctx.key("store")));
        let eval = table.eval.as_ref().map(Spanned::get_ref);
        let min_pass_rate = eval.and_then(|e| e.min_pass_rate.as_ref()).map(|r| ctx.rate("eval.min_pass_rate", r));
        Ok(Layer {
            origin,
            table,
            shared: check_shared!(ctx, table, "system prompt"),
            cache_url,
            store_at,
            min_pass_rate: min_pass_rate.transpose()?,
        })
    }
}

/// A step as declared and checked, its own values only.
struct DeclaredStep {
    /// `package.metadata.promptgen.steps[i]`.
    key: String,
    /// Where the step's table starts, a byte offset: [`Source::at`] scans the text, so it is
    /// made a line and column only for an error (once per step, that scan was quadratic).
    at: usize,
    id: String,
    prompt: PathBuf,
    prompt_display: String,
    outputs: Vec<String>,
    inputs: Vec<Input>,
    script: Option<PathBuf>,
    shared: Shared,
    graph: GraphDecl,
}

/// What a step declares of the graph, with the places to point at.
struct GraphDecl {
    id: String,
    /// `after`, when declared: each id with its place and key.
    after: Option<Vec<Named>>,
    /// The place (a byte offset in the manifest: [`Source::at`] makes it a line and column
    /// only for an error, as that scans the text) and key of each output, in the order of
    /// [`DeclaredStep::outputs`].
    outputs_at: Vec<(usize, String)>,
}

/// A step id as written in `after`.
struct Named {
    id: String,
    /// A byte offset in the manifest, as in [`GraphDecl::outputs_at`].
    at: usize,
    key: String,
}

fn check_steps(ctx: &Ctx<'_>, chain: &Spanned<ChainTable>) -> Result<Vec<DeclaredStep>, ConfigError> {
    let empty_hint = || {
        "a chain needs at least one step: add a `[[package.metadata.promptgen.steps]]` table with \
         `id = \"01\"` and `prompt = \"prompts/01.md\"`"
            .to_string()
    };
    let list = match &chain.get_ref().steps {
        None => return Err(ctx.missing("steps", chain, empty_hint())),
        Some(list) if list.get_ref().is_empty() => return Err(ctx.missing("steps", list, empty_hint())),
        Some(list) => list.get_ref(),
    };
    let mut steps = Vec::with_capacity(list.len());
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for (index, step) in list.iter().enumerate() {
        let ctx = Ctx { src: ctx.src, prefix: ctx.key(&format!("steps[{index}]")), base: ctx.base };
        let table = step.get_ref();
        let Some(id_value) = &table.id else {
            let hint = "every step needs a unique `id` of letters, digits, `_` and `-`, e.g. `id = \"01\"`";
            return Err(ctx.missing("id", step, hint.into()));
        };
        let id = id_value.get_ref().clone();
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            return Err(ctx.invalid("id", id_value, format!("{id:?}")));
        }
        if let Some(first_key) = seen.get(&id) {
            return Err(ConfigError::DuplicateId {
                file: ctx.src.file.clone(),
                at: ctx.src.at_span(id_value),
                key: ctx.key("id"),
                id,
                first_key: first_key.clone(),
            });
        }
        seen.insert(id.clone(), ctx.key("id"));

        let what = |thing: &str| format!("{thing} of step `{id}`");
        let Some(prompt_value) = &table.prompt else {
            let hint = format!(
                "step `{id}` needs `prompt`, a file relative to the package folder `{}`, e.g. `prompt = \"prompts/{id}.md\"`",
                ctx.base.display()
            );
            return Err(ctx.missing("prompt", step, hint));
        };
        let prompt = ctx.existing_file("prompt", prompt_value, &what("prompt"))?;
        let shared = check_shared!(&ctx, table, &what("system prompt"));
        let script = table.script.as_ref().map(|s| ctx.existing_file("script", s, &what("script"))).transpose()?;
        let outputs = ctx.outputs(table.outputs.as_ref().map_or(&[], |l| l.get_ref()))?;
        let inputs = ctx.inputs(table.inputs.as_ref().map_or(&[], |l| l.get_ref()), &id)?;
        let places = |list: &[Spanned<String>], name: &str| -> Vec<(usize, String)> {
            list.iter().enumerate().map(|(j, v)| (v.span().start, ctx.key(&format!("{name}[{j}]")))).collect()
        };
        let after = table.after.as_ref().map(|list| {
            let list = list.get_ref();
            let places = places(list, "after");
            list.iter().zip(places).map(|(id, (at, key))| Named { id: id.get_ref().clone(), at, key }).collect()
        });
        let outputs_at = places(table.outputs.as_ref().map_or(&[], |l| l.get_ref()), "outputs");
        let graph = GraphDecl { id: id.clone(), after, outputs_at };
        steps.push(DeclaredStep {
            key: ctx.prefix.clone(),
            at: step.span().start,
            id,
            prompt,
            prompt_display: prompt_value.get_ref().clone(),
            outputs,
            inputs,
            script,
            shared,
            graph,
        });
    }
    Ok(steps)
}

/// Resolves each step's `after` into [`StepConfig::after`] and the chain's [`Graph`]: an id
/// `after` names must be another step of the chain, the steps may not wait for each other in a
/// cycle, and an output may not be declared by two steps of which neither runs after the other.
/// `steps` are in id order; `declared` says what each declares, by id.
fn resolve_graph(src: &Source, steps: &mut [StepConfig], declared: Vec<GraphDecl>) -> Result<Graph, ConfigError> {
    let file = src.file.as_path();
    let ids: Vec<String> = steps.iter().map(|s| s.id.clone()).collect();
    let index = |id: &str| ids.binary_search_by(|s| s.as_str().cmp(id)).ok();
    let declared: BTreeMap<String, GraphDecl> = declared.into_iter().map(|d| (d.id.clone(), d)).collect();
    let decl = |i: usize| declared.get(&ids[i]);
    let mut after = Vec::with_capacity(steps.len());
    for (i, step) in steps.iter_mut().enumerate() {
        let deps = match decl(i).and_then(|d| d.after.as_ref()) {
            None => i.checked_sub(1).into_iter().collect(),
            Some(list) => {
                let mut deps: Vec<usize> = Vec::with_capacity(list.len());
                for named in list {
                    let (at, key) = (src.at(named.at), named.key.clone());
                    if named.id == step.id {
                        return Err(ConfigError::AfterItself { file: file.into(), at, key, step: step.id.clone() });
                    }
                    let Some(dep) = index(&named.id) else {
                        return Err(ConfigError::UnknownAfter {
                            file: file.into(),
                            at,
                            key,
                            step: step.id.clone(),
                            after: named.id.clone(),
                            known: ids.clone(),
                        });
                    };
                    if deps.contains(&dep) {
                        return Err(ConfigError::InvalidValue {
                            file: file.into(),
                            at,
                            key,
                            value: format!("{:?}", named.id),
                            expected: "each step id once in `after`".into(),
                        });
                    }
                    deps.push(dep);
                }
                deps.sort_unstable();
                deps
            }
        };
        step.after_declared = decl(i).is_some_and(|d| d.after.is_some());
        step.after = deps.iter().map(|&d| ids[d].clone()).collect();
        after.push(deps);
    }
    let graph = Graph::new(after).map_err(|cycle| {
        let links: Vec<CycleLink> =
            cycle.iter().map(|&i| CycleLink { step: ids[i].clone(), implicit: !steps[i].after_declared }).collect();
        // Point at an id in `after` that closes the cycle (an implicit link goes to a lower id,
        // so a cycle has at least one declared link).
        let place = cycle.iter().zip(cycle.iter().cycle().skip(1)).find_map(|(&step, &next)| {
            let list = decl(step)?.after.as_ref()?;
            list.iter().find(|named| named.id == ids[next]).map(|named| (src.at(named.at), named.key.clone()))
        });
        let (at, key) = place.unwrap_or((Location { line: 1, column: 1 }, format!("{PACKAGE_PREFIX}.steps")));
        ConfigError::Cycle { file: file.into(), at, key, cycle: links }
    })?;
    let mut owners: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, step) in steps.iter().enumerate() {
        for (k, output) in step.outputs.iter().enumerate() {
            let earlier = owners.entry(output.as_str()).or_default();
            if let Some(&first) = earlier.iter().find(|&&j| graph.independent(i, j)) {
                let (at, key) = decl(i)
                    .and_then(|d| d.outputs_at.get(k))
                    .map(|(offset, key)| (src.at(*offset), key.clone()))
                    .unwrap_or((Location { line: 1, column: 1 }, format!("{PACKAGE_PREFIX}.steps")));
                return Err(ConfigError::SharedOutput {
                    file: file.into(),
                    at,
                    key,
                    path: output.clone(),
                    first: ids[first].clone(),
                    second: step.id.clone(),
                });
            }
            earlier.push(i);
        }
    }
    Ok(graph)
}

/// `package.edition`, or the workspace's `workspace.package.edition` when the package
/// inherits it; `2015` when absent, as cargo does.
fn package_edition(
    src: &Source,
    package: &PackageTable,
    workspace: Option<&WorkspaceTable>,
) -> Result<String, ConfigError> {
    let Some(edition) = &package.edition else { return Ok("2015".into()) };
    match edition.get_ref() {
        Edition::Named(name) => Ok(name.clone()),
        Edition::Inherited { workspace: true } => {
            workspace.and_then(|ws| ws.package.as_ref()?.edition.clone()).ok_or_else(|| ConfigError::Missing {
                file: src.file.clone(),
                at: src.at_span(edition),
                key: "package.edition".into(),
                hint:
                    "`edition.workspace = true` needs `[workspace.package] edition = ...` in the workspace's Cargo.toml"
                        .into(),
            })
        }
        Edition::Inherited { workspace: false } => Err(ConfigError::WrongType {
            file: src.file.clone(),
            at: src.at_span(edition),
            key: "package.edition".into(),
            expected: "a string such as \"2021\", or `{ workspace = true }`".into(),
            found: "`{ workspace = false }`".into(),
        }),
    }
}

/// The workspace a package belongs to: its root folder, and the root's manifest when it is
/// not the package's own.
struct WorkspaceRoot {
    dir: PathBuf,
    manifest: Option<(Source, RootManifest)>,
}

impl WorkspaceRoot {
    /// The workspace whose root is `dir`, if `dir/Cargo.toml` has a `[workspace]` table.
    fn open(dir: &Path) -> Result<Option<WorkspaceRoot>, ConfigError> {
        let src = Source::read(&dir.join("Cargo.toml"))?;
        let root: RootManifest = src.parse(&[WORKSPACE_PREFIX])?;
        Ok(root.workspace.is_some().then(|| WorkspaceRoot { dir: dir.to_path_buf(), manifest: Some((src, root)) }))
    }
}

/// Finds the workspace of the package in `package_dir` the way cargo does:
///
/// 1. the root the caller was told ([`Overrides::workspace_root`], from `cargo metadata`);
/// 2. else the package's own manifest, when it has a `[workspace]` table;
/// 3. else the root that `package.workspace = "path"` names;
/// 4. else the nearest manifest in the parent folders with a `[workspace]` table that does not
///    exclude the package (cargo walks on past a workspace that excludes it), or that itself
///    names its root with
///    `package.workspace`. The walk stops below a `target/package` folder, as cargo's does.
fn find_workspace(
    src: &Source,
    manifest: &Manifest,
    package_dir: &Path,
    told: Option<&Path>,
) -> Result<Option<WorkspaceRoot>, ConfigError> {
    let own = || WorkspaceRoot { dir: package_dir.to_path_buf(), manifest: None };
    if let Some(root) = told.map(absolute) {
        return if root == package_dir {
            Ok(manifest.workspace.is_some().then(own))
        } else {
            WorkspaceRoot::open(&root)
        };
    }
    if manifest.workspace.is_some() {
        return Ok(Some(own()));
    }
    if let Some(pointer) = manifest.package.as_ref().and_then(|p| p.get_ref().workspace.as_ref()) {
        return named_root(src, pointer, package_dir).map(Some);
    }
    let package_manifest = package_dir.join("Cargo.toml");
    for dir in package_dir.ancestors().skip(1).take_while(|dir| !dir.ends_with("target/package")) {
        let candidate = dir.join("Cargo.toml");
        if !candidate.is_file() {
            continue;
        }
        let ancestor = Source::read(&candidate)?;
        let probe: Probe = ancestor.parse(&[])?;
        match (probe.workspace, probe.package.and_then(|p| p.workspace)) {
            (Some(ws), _) if !ws.excludes(dir, &package_manifest) => return WorkspaceRoot::open(dir),
            (Some(_), _) => {}
            (None, Some(pointer)) => return named_root(&ancestor, &pointer, dir).map(Some),
            (None, None) => {}
        }
    }
    Ok(None)
}

/// The workspace whose root `package.workspace = pointer` names, in the manifest `src` of the
/// folder `dir`.
fn named_root(src: &Source, pointer: &Spanned<String>, dir: &Path) -> Result<WorkspaceRoot, ConfigError> {
    let ctx = Ctx { src, prefix: "package".into(), base: dir };
    let root = lexical_join(dir, pointer.get_ref());
    ctx.file_at("workspace", pointer, root.join("Cargo.toml"), "workspace root's manifest")?;
    WorkspaceRoot::open(&root)?.ok_or_else(|| ConfigError::InvalidValue {
        file: src.file.clone(),
        at: src.at_span(pointer),
        key: "package.workspace".into(),
        value: format!("{:?}", pointer.get_ref()),
        expected: format!(
            "the folder of a workspace root, but `{}` has no `[workspace]` table",
            root.join("Cargo.toml").display()
        ),
    })
}

impl ProbeWorkspace {
    /// Whether this workspace, rooted in `root`, leaves out the package whose manifest is
    /// `package_manifest`. Cargo's rule: an `exclude` entry holds it and no `members` entry
    /// does (both compared as paths, globs unexpanded).
    fn excludes(&self, root: &Path, package_manifest: &Path) -> bool {
        let holds = |paths: &[String]| paths.iter().any(|path| package_manifest.starts_with(lexical_join(root, path)));
        holds(&self.exclude) && !holds(&self.members)
    }
}

// ---- Paths --------------------------------------------------------------------------------------

/// The problems shared by output and input paths, which the model sees: `Err` says why.
fn path_shape(written: &str) -> Result<Vec<&str>, String> {
    if written.is_empty() {
        return Err("is empty; write a relative path such as `src/view.rs`".into());
    }
    if written.contains('\\') {
        return Err("contains a backslash; write paths with forward slashes, e.g. `src/view.rs`".into());
    }
    let bytes = written.as_bytes();
    if written.starts_with('/') || (bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':') {
        return Err("is absolute; write a path relative to the package folder".into());
    }
    if written.chars().any(char::is_control) {
        return Err("contains a control character".into());
    }
    let components: Vec<&str> = written.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    if components.iter().any(|c| c.contains(':')) {
        return Err("contains `:` in a name, which is not portable (a Windows drive or stream)".into());
    }
    Ok(components)
}

fn output_path(written: &str) -> Result<String, String> {
    let components = path_shape(written)?;
    if components.contains(&"..") {
        return Err("contains `..`; outputs are written inside the output folder, e.g. `view.rs`".into());
    }
    if components.is_empty() {
        return Err("names the output folder itself; name a file, e.g. `view.rs`".into());
    }
    Ok(components.join("/"))
}

fn input_virtual_path(written: &str) -> Result<String, String> {
    let mut stack: Vec<&str> = Vec::new();
    for component in path_shape(written)? {
        if component == ".." && stack.last().is_some_and(|last| *last != "..") {
            stack.pop();
        } else {
            stack.push(component);
        }
    }
    let visible: Vec<&str> = stack.into_iter().skip_while(|c| *c == "..").collect();
    if visible.is_empty() {
        return Err("names no file or folder the model could see (it is the package folder or above it); \
                    name a file or folder, e.g. `src` or `src/domain.rs`"
            .into());
    }
    Ok(visible.join("/"))
}

/// `base` joined with `relative`, with `.` dropped and `..` folded lexically.
fn lexical_join(base: &Path, relative: &str) -> PathBuf {
    let joined = base.join(relative);
    let mut out = PathBuf::new();
    for component in joined.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => match out.components().next_back() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                Some(Component::RootDir | Component::Prefix(_)) => {}
                _ => out.push(".."),
            },
            other => out.push(other),
        }
    }
    out
}

fn absolute(path: &Path) -> PathBuf {
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    // Fold `.` and `..` so parents walk the real folders.
    lexical_join(&path, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_and_suggestions() {
        assert_eq!(edit_distance("max_step", "max_steps"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        let keys = || ChainTable::KEYS.iter().copied();
        assert_eq!(closest("max_model_call", keys()), Some("max_model_calls"));
        assert_eq!(ChainTable::ALIASES, [("max_steps", "max_model_calls")]);
        assert!(StepTable::expected("max_steps").is_some());
        assert_eq!(closest("Model", keys()), Some("model"));
        assert_eq!(closest("completely_else", keys()), None);
    }

    #[test]
    fn enum_names_come_from_their_own_deserialize() {
        assert_eq!(variants::<BackendKind>(), ["ollama", "openai", "scripted"]);
        assert_eq!(one_of::<ToolProtocol>(), "one of \"native\", \"json\", \"blocks\"");
        assert_eq!(parse_word::<BackendKind>("openai").unwrap(), BackendKind::OpenAi);
        assert!(parse_word::<BackendKind>("Ollama").is_err());
    }

    #[test]
    fn every_key_says_what_it_expects() {
        for key in ChainTable::KEYS {
            assert!(ChainTable::expected(key).is_some_and(|e| !e.is_empty()), "{key}");
        }
        for key in StepTable::KEYS {
            assert!(StepTable::expected(key).is_some_and(|e| !e.is_empty()), "{key}");
        }
        for key in EvalTable::KEYS {
            assert!(EvalTable::expected(key).is_some_and(|e| !e.is_empty()), "{key}");
        }
    }

    #[test]
    fn the_module_documentation_lists_every_key() {
        let docs = include_str!("config.rs");
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

    #[test]
    fn the_store_is_set_in_the_manifest_and_nothing_else_changes() {
        let manifest = "[package]\nname = \"x\"\n\n[package.metadata.promptgen] # the chain\nmodel = \"m\"\n";
        let cache = with_store(manifest, StoreMode::Cache).unwrap();
        assert_eq!(cache, manifest.replace("# the chain\n", "# the chain\nstore = \"cache\"\n"));
        let repo = with_store(&cache, StoreMode::Repo).unwrap();
        assert_eq!(repo, cache.replace("store = \"cache\"", "store = \"repo\""));
        let no_newline = "[package]\nname = \"x\"\n[package.metadata.promptgen]";
        assert_eq!(with_store(no_newline, StoreMode::Cache).unwrap(), format!("{no_newline}\nstore = \"cache\"\n"));
        let inline = "[package]\nname = \"x\"\nmetadata.promptgen = { model = \"m\" }\n";
        let err = with_store(inline, StoreMode::Cache).unwrap_err();
        assert_eq!(err, "add `store = \"cache\"` to its `[package.metadata.promptgen]` table");
    }

    #[test]
    fn locations_count_lines_and_characters_from_one() {
        let src = Source { file: "Cargo.toml".into(), text: "a = 1\nbé = 2\n".into() };
        assert_eq!(src.at(0), Location { line: 1, column: 1 });
        assert_eq!(src.at(6), Location { line: 2, column: 1 });
        assert_eq!(src.at(10), Location { line: 2, column: 4 });
        assert_eq!(src.at(999).line, 3);
    }

    #[test]
    fn paths_are_normalised() {
        assert_eq!(output_path("./src//view.rs/").unwrap(), "src/view.rs");
        assert!(output_path("../x.rs").is_err());
        assert!(output_path("/x.rs").is_err());
        assert!(output_path("C:/x.rs").is_err());
        assert!(output_path("src\\x.rs").is_err());
        assert!(output_path("./").is_err());
        assert_eq!(input_virtual_path("./src/").unwrap(), "src");
        assert_eq!(input_virtual_path("../prompts/shared.md").unwrap(), "prompts/shared.md");
        assert_eq!(input_virtual_path("src/../lib.rs").unwrap(), "lib.rs");
        assert!(input_virtual_path("..").is_err());
        assert_eq!(lexical_join(Path::new("/a/b"), "../c/./d.md"), PathBuf::from("/a/c/d.md"));
        assert_eq!(lexical_join(Path::new("/"), "../x"), PathBuf::from("/x"));
    }
}
