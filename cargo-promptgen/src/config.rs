//! The chain a package declares in its `Cargo.toml`, read, checked and fully resolved.
//!
//! [`load`] reads `[package.metadata.promptgen]` (and the defaults of
//! `[workspace.metadata.promptgen]`), applies the command line and the environment, and returns
//! a [`Chain`] in which every value is settled and every file it names exists. Every mistake is
//! a [`ConfigError`] that names the manifest, the exact key (a dotted path such as
//! `package.metadata.promptgen.steps[1].prompt`) and what is expected instead; nothing here
//! panics on user input.
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
//! max_steps = 8                         # optional, >= 1 (default Step::DEFAULT_MAX_STEPS)
//! protocol = "native"                   # "native" | "json" | "blocks" (default "native")
//! system_prompt = "prompts/system.md"   # optional file, relative to the package directory
//! num_ctx = 16384                       # optional, Ollama's context window
//! max_output_tokens = 4096              # optional, >= 1: the most tokens one reply may have
//! request_timeout_secs = 600            # optional, >= 1
//!
//! [[package.metadata.promptgen.steps]]
//! id = "01"                             # required, unique, [A-Za-z0-9_-]+
//! prompt = "../prompts/step_01_view.md" # required file, relative to the package directory
//! outputs = ["view.rs"]                 # optional relative forward-slash paths
//! inputs = ["src/domain.rs", "src"]     # optional existing files or folders
//! script = "../prompts/scripts/01.toml" # canned turns; required with backend "scripted"
//! # optional per-step overrides: model, seed, temperature, max_steps, protocol, system_prompt
//! ```
//!
//! `[workspace.metadata.promptgen]` may set every chain-level key except `steps`; its file
//! paths are relative to the workspace root, which is found the way cargo finds it: the
//! nearest `Cargo.toml` with a `[workspace]` table, starting with the package's own manifest
//! and then walking up through the parent folders.
//!
//! # Precedence
//!
//! Strongest first: the command line ([`Overrides`]); `PROMPTGEN_BACKEND`, `PROMPTGEN_MODEL`,
//! `PROMPTGEN_BASE_URL`; the backend's own variables (`OLLAMA_HOST` for `ollama`, normalised
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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use codegen_core::ToolProtocol;
use codegen_core::backend::ollama::{self, parse_host};
use codegen_core::backend::{BackendConfig, BackendKind, HttpConfig, openai};
use toml::{Table, Value};

/// The names of every environment variable `load` reads (for build scripts'
/// `cargo:rerun-if-env-changed`).
pub const ENV_VARS: &[&str] =
    &["PROMPTGEN_BACKEND", "PROMPTGEN_MODEL", "PROMPTGEN_BASE_URL", "OLLAMA_HOST", "OPENAI_BASE_URL", "OPENAI_API_KEY"];

/// The keys `[package.metadata.promptgen]` accepts.
pub const CHAIN_KEYS: &[&str] = &[
    "backend",
    "model",
    "base_url",
    "seed",
    "temperature",
    "max_steps",
    "protocol",
    "system_prompt",
    "num_ctx",
    "max_output_tokens",
    "request_timeout_secs",
    "check",
    "check_rounds",
    "steps",
];

/// The keys `[workspace.metadata.promptgen]` accepts: the chain-level keys without `steps`.
pub const WORKSPACE_KEYS: &[&str] = &[
    "backend",
    "model",
    "base_url",
    "seed",
    "temperature",
    "max_steps",
    "protocol",
    "system_prompt",
    "num_ctx",
    "max_output_tokens",
    "request_timeout_secs",
    "check",
    "check_rounds",
];

/// The keys a `[[package.metadata.promptgen.steps]]` table accepts.
pub const STEP_KEYS: &[&str] = &[
    "id",
    "prompt",
    "outputs",
    "inputs",
    "script",
    "model",
    "seed",
    "temperature",
    "max_steps",
    "protocol",
    "system_prompt",
    "check",
    "check_rounds",
];

const PACKAGE_PREFIX: &str = "package.metadata.promptgen";
const WORKSPACE_PREFIX: &str = "workspace.metadata.promptgen";
const BACKENDS_EXPECTED: &str = "one of \"ollama\", \"openai\", \"scripted\"";
const PROTOCOLS_EXPECTED: &str = "one of \"native\", \"json\", \"blocks\"";

/// Values given on the command line; they beat every other layer. Empty strings count as unset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--backend`: `ollama`, `openai` or `scripted`.
    pub backend: Option<String>,
    /// `--model`: the model for every step.
    pub model: Option<String>,
    /// `--base-url`: the server's URL.
    pub base_url: Option<String>,
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
    /// The folder of the nearest manifest with a `[workspace]` table, if any.
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
    /// The package's Rust edition (`package.edition`, inherited from the workspace when it
    /// says `edition.workspace = true`; `2015` when absent, as cargo does).
    pub edition: String,
    /// The steps, sorted by id in plain string (byte) order: `"01" < "02" < "10" < "a"`, so
    /// zero-padded numeric ids run in numeric order.
    pub steps: Vec<StepConfig>,
}

impl Chain {
    /// The backend configuration for `step`: this chain's backend, URL, key, context window
    /// and request timeout, and the step's script.
    pub fn backend_config(&self, step: &StepConfig) -> BackendConfig {
        let mut config = BackendConfig::new(self.backend);
        config.base_url = self.base_url.clone();
        config.api_key = self.api_key.clone();
        config.num_ctx = self.num_ctx;
        config.max_output_tokens = self.max_output_tokens;
        config.script = step.script.clone();
        config.http = HttpConfig { request_timeout: self.request_timeout, ..HttpConfig::default() };
        config
    }

    /// The step with this id.
    pub fn step(&self, id: &str) -> Option<&StepConfig> {
        self.steps.iter().find(|s| s.id == id)
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
    pub max_steps: u32,
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
}

/// The check a step's output must pass: `check = "rustc"`, `"none"`, or a command
/// (`["cargo", "check"]`). Without `check`, steps that declare `.rs` outputs get `rustc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckSpec {
    /// Type-check the generated tree with rustc, mounted as the crate mounts it.
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

/// A mistake in the declaration, the command line or the environment. Each names the file
/// and the key (a dotted path, step indices counted from 0) and says what is expected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The manifest cannot be read.
    #[error("cannot read `{}`: {source}", file.display())]
    Read {
        /// The manifest.
        file: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The manifest is not valid TOML.
    #[error("`{}` is not valid TOML: {message}", file.display())]
    Parse {
        /// The manifest.
        file: PathBuf,
        /// The TOML parser's message, with line and column.
        message: String,
    },
    /// The manifest has no `[package]` with a `name`.
    #[error("`{}`: `{key}` is missing: this is not a package manifest. Point at the `Cargo.toml` of the package that declares `[package.metadata.promptgen]`.", file.display())]
    NoPackage {
        /// The manifest.
        file: PathBuf,
        /// `package.name`.
        key: String,
    },
    /// The package declares no chain.
    #[error("`{}` has no `[{key}]` table, so it declares no prompt chain. Declare one:\n\n[package.metadata.promptgen]\nmodel = \"qwen2.5-coder:7b\"\n\n[[package.metadata.promptgen.steps]]\nid = \"01\"\nprompt = \"prompts/01.md\"\noutputs = [\"generated.rs\"]", file.display())]
    NoChain {
        /// The manifest.
        file: PathBuf,
        /// `package.metadata.promptgen`.
        key: String,
    },
    /// A key that means nothing here (often a typo).
    #[error("`{}`: unknown key `{key}`{hint} Known keys here: {known}.", file.display())]
    UnknownKey {
        /// The manifest.
        file: PathBuf,
        /// The full key.
        key: String,
        /// ``; did you mean `x`?``, another hint ending in its punctuation, or `.`.
        hint: String,
        /// The keys accepted at that level, comma-separated.
        known: String,
    },
    /// A value of the wrong TOML type.
    #[error("`{}`: `{key}` must be {expected}, found {found}.", file.display())]
    WrongType {
        /// The manifest.
        file: PathBuf,
        /// The full key.
        key: String,
        /// What is expected.
        expected: String,
        /// What was found.
        found: String,
    },
    /// A value of the right type that is not allowed.
    #[error("`{}`: `{key}` = {value} is not allowed: expected {expected}.", file.display())]
    InvalidValue {
        /// The manifest.
        file: PathBuf,
        /// The full key.
        key: String,
        /// The value as found.
        value: String,
        /// What is expected.
        expected: String,
    },
    /// A required key is missing (or `steps` is empty).
    #[error("`{}`: `{key}` is missing: {hint}", file.display())]
    Missing {
        /// The manifest.
        file: PathBuf,
        /// The full key.
        key: String,
        /// What to add.
        hint: String,
    },
    /// Two steps have the same id.
    #[error("`{}`: `{key}`: step id `{id}` is already used by `{first_key}`; step ids must be unique.", file.display())]
    DuplicateId {
        /// The manifest.
        file: PathBuf,
        /// The key of the second use.
        key: String,
        /// The id.
        id: String,
        /// The key of the first use.
        first_key: String,
    },
    /// A file the declaration names does not exist.
    #[error("`{}`: `{key}`: the {what}, `{}`, does not exist (paths are relative to `{}`).", file.display(), path.display(), relative_to.display())]
    FileNotFound {
        /// The manifest.
        file: PathBuf,
        /// The full key.
        key: String,
        /// The path it resolved to.
        path: PathBuf,
        /// The folder it is relative to.
        relative_to: PathBuf,
        /// What the file is for (``prompt of step `01` ``).
        what: String,
    },
    /// A path that must be a file is something else (a folder).
    #[error("`{}`: `{key}` = {value:?}: `{}` is a folder, but the {what} must be a file.", file.display(), path.display())]
    NotAFile {
        /// The manifest.
        file: PathBuf,
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
    #[error("`{}`: `{key}` = {value:?} {reason}.", file.display())]
    BadPath {
        /// The manifest.
        file: PathBuf,
        /// The full key.
        key: String,
        /// The path as written.
        value: String,
        /// What is wrong and what to write instead.
        reason: String,
    },
    /// No layer names a model for some steps.
    #[error("`{}`: `{key}` is missing and {} no `model` of {}: set `model` in `[package.metadata.promptgen]` (e.g. model = \"qwen2.5-coder:7b\"), in each step, in `[workspace.metadata.promptgen]`, or with PROMPTGEN_MODEL or --model.", file.display(), steps_without_model(steps), if steps.len() == 1 { "its own" } else { "their own" })]
    MissingModel {
        /// The package manifest.
        file: PathBuf,
        /// `package.metadata.promptgen.model`.
        key: String,
        /// The ids of the steps without a model.
        steps: Vec<String>,
    },
    /// The `scripted` backend is chosen and a step has no script.
    #[error("`{}`: `{key}` is missing: step `{step}` needs a script because the {backend} replays canned turns from a file. Set `script = \"scripts/{step}.toml\"` in the step, or choose another backend.", file.display())]
    MissingScript {
        /// The package manifest.
        file: PathBuf,
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
            | ConfigError::Missing { file, .. }
            | ConfigError::DuplicateId { file, .. }
            | ConfigError::FileNotFound { file, .. }
            | ConfigError::NotAFile { file, .. }
            | ConfigError::BadPath { file, .. }
            | ConfigError::MissingModel { file, .. }
            | ConfigError::MissingScript { file, .. }
            | ConfigError::Env { file, .. }
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
            | ConfigError::Missing { key, .. }
            | ConfigError::DuplicateId { key, .. }
            | ConfigError::FileNotFound { key, .. }
            | ConfigError::NotAFile { key, .. }
            | ConfigError::BadPath { key, .. }
            | ConfigError::MissingModel { key, .. }
            | ConfigError::MissingScript { key, .. }
            | ConfigError::Env { key, .. }
            | ConfigError::Flag { key, .. } => Some(key),
        }
    }
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
    let file = manifest_path.as_path();
    let doc = read_manifest(file)?;
    let package_dir = file.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));

    let package_name = match doc.get("package") {
        Some(Value::Table(package)) => match package.get("name") {
            Some(Value::String(name)) => name.clone(),
            Some(other) => return Err(wrong_type(file, "package.name", "a string", other)),
            None => return Err(ConfigError::NoPackage { file: file.into(), key: "package.name".into() }),
        },
        Some(other) => return Err(wrong_type(file, "package", "a table", other)),
        None => return Err(ConfigError::NoPackage { file: file.into(), key: "package.name".into() }),
    };

    let no_chain = || ConfigError::NoChain { file: file.into(), key: PACKAGE_PREFIX.into() };
    let meta = match doc.get("package").and_then(|p| p.get("metadata")) {
        None => return Err(no_chain()),
        Some(Value::Table(metadata)) => match metadata.get("promptgen") {
            None => return Err(no_chain()),
            Some(Value::Table(table)) => table,
            Some(other) => return Err(wrong_type(file, PACKAGE_PREFIX, "a table", other)),
        },
        Some(other) => return Err(wrong_type(file, "package.metadata", "a table", other)),
    };

    let package_layer = Layer::parse(meta, file, PACKAGE_PREFIX, CHAIN_KEYS, &package_dir, Level::Package)?;
    let raw_steps = parse_steps(meta, file, &package_dir)?;

    let workspace = find_workspace(&doc, file, &package_dir)?;
    let workspace_root = workspace.as_ref().map(|(root, _, _)| root.clone());
    let workspace_layer = match &workspace {
        Some((root, ws_file, ws_doc)) => {
            let ws_doc = ws_doc.as_ref().unwrap_or(&doc);
            match ws_doc.get("workspace").and_then(|w| w.get("metadata")) {
                None => None,
                Some(Value::Table(metadata)) => match metadata.get("promptgen") {
                    None => None,
                    Some(Value::Table(table)) => {
                        Some(Layer::parse(table, ws_file, WORKSPACE_PREFIX, WORKSPACE_KEYS, root, Level::Workspace)?)
                    }
                    Some(other) => return Err(wrong_type(ws_file, WORKSPACE_PREFIX, "a table", other)),
                },
                Some(other) => return Err(wrong_type(ws_file, "workspace.metadata", "a table", other)),
            }
        }
        None => None,
    };
    let layers: Vec<&Layer> = std::iter::once(&package_layer).chain(workspace_layer.as_ref()).collect();
    // The first layer that sets a chain-level value, with its origin.
    fn pick<T: Clone>(layers: &[&Layer], get: impl Fn(&Layer) -> Option<T>) -> Option<(T, Origin)> {
        layers.iter().find_map(|layer| get(layer).map(|v| (v, layer.origin)))
    }

    let flag = |value: &Option<String>| value.as_deref().map(str::trim).filter(|v| !v.is_empty()).map(str::to_string);
    let var = |name: &'static str| env(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());

    // Backend.
    let (backend, backend_origin) = if let Some(value) = flag(&overrides.backend) {
        let kind = value.parse::<BackendKind>().map_err(|_| ConfigError::Flag {
            file: file.into(),
            key: "--backend".into(),
            value: value.clone(),
            expected: BACKENDS_EXPECTED.into(),
        })?;
        (kind, Origin::Flag)
    } else if let Some(value) = var("PROMPTGEN_BACKEND") {
        let kind = value.parse::<BackendKind>().map_err(|_| ConfigError::Env {
            file: file.into(),
            key: "PROMPTGEN_BACKEND".into(),
            value: value.clone(),
            expected: BACKENDS_EXPECTED.into(),
        })?;
        (kind, Origin::Env("PROMPTGEN_BACKEND"))
    } else {
        pick(&layers, |l| l.backend).unwrap_or((BackendKind::Ollama, Origin::Default))
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
        match pick(&layers, |l| l.base_url.clone()) {
            Some((url, origin)) => (Some(url), origin),
            None => (None, Origin::Default),
        }
    };
    let api_key = if backend == BackendKind::OpenAi { var("OPENAI_API_KEY") } else { None };

    let num_ctx = pick(&layers, |l| l.num_ctx).map_or(BackendConfig::DEFAULT_NUM_CTX, |(v, _)| v);
    let max_output_tokens =
        pick(&layers, |l| l.max_output_tokens).map_or(BackendConfig::DEFAULT_MAX_OUTPUT_TOKENS, |(v, _)| v);
    let request_timeout = pick(&layers, |l| l.request_timeout_secs)
        .map_or(HttpConfig::default().request_timeout, |(secs, _)| Duration::from_secs(secs));

    let model_override = flag(&overrides.model)
        .map(|m| (m, Origin::Flag))
        .or_else(|| var("PROMPTGEN_MODEL").map(|m| (m, Origin::Env("PROMPTGEN_MODEL"))));
    let chain_model = pick(&layers, |l| l.model.clone());

    let mut steps = Vec::with_capacity(raw_steps.len());
    let mut without_model = Vec::new();
    for raw in raw_steps {
        let model = model_override
            .clone()
            .or_else(|| raw.model.clone().map(|m| (m, Origin::Step)))
            .or_else(|| chain_model.clone());
        let Some((model, model_origin)) = model else {
            without_model.push(raw.id.clone());
            continue;
        };
        if backend == BackendKind::Scripted && raw.script.is_none() {
            return Err(ConfigError::MissingScript {
                file: file.into(),
                key: format!("{}.script", raw.key),
                step: raw.id.clone(),
                backend: format!("backend `scripted` {}", from_phrase(backend_origin, &raw.id)),
            });
        }
        steps.push(StepConfig {
            system_prompt: raw
                .system_prompt
                .clone()
                .or_else(|| pick(&layers, |l| l.system_prompt.clone()).map(|(p, _)| p)),
            seed: raw.seed.or_else(|| pick(&layers, |l| l.seed).map(|(v, _)| v)),
            temperature: raw.temperature.or_else(|| pick(&layers, |l| l.temperature).map(|(v, _)| v)),
            max_steps: raw
                .max_steps
                .or_else(|| pick(&layers, |l| l.max_steps).map(|(v, _)| v))
                .unwrap_or(codegen_core::Step::DEFAULT_MAX_STEPS),
            protocol: raw.protocol.or_else(|| pick(&layers, |l| l.protocol).map(|(v, _)| v)).unwrap_or_default(),
            check: raw.check.clone().or_else(|| pick(&layers, |l| l.check.clone()).map(|(v, _)| v)).unwrap_or_else(|| {
                if raw.outputs.iter().any(|o| o.ends_with(".rs")) { CheckSpec::Rustc } else { CheckSpec::None }
            }),
            check_rounds: raw
                .check_rounds
                .or_else(|| pick(&layers, |l| l.check_rounds).map(|(v, _)| v))
                .unwrap_or(codegen_core::Step::DEFAULT_CHECK_ROUNDS),
            id: raw.id,
            prompt: raw.prompt,
            prompt_display: raw.prompt_display,
            model,
            model_origin,
            outputs: raw.outputs,
            inputs: raw.inputs,
            script: raw.script,
        });
    }
    if !without_model.is_empty() {
        return Err(ConfigError::MissingModel {
            file: file.into(),
            key: format!("{PACKAGE_PREFIX}.model"),
            steps: without_model,
        });
    }
    steps.sort_by(|a, b| a.id.cmp(&b.id));
    let edition = package_edition(&doc, workspace.as_ref().map(|(_, f, d)| (f.as_path(), d.as_ref().unwrap_or(&doc))), file)?;

    Ok(Chain {
        package_name,
        package_dir,
        manifest_path: manifest_path.clone(),
        workspace_root,
        backend,
        backend_origin,
        base_url,
        base_url_origin,
        api_key,
        num_ctx,
        max_output_tokens,
        request_timeout,
        edition,
        steps,
    })
}

/// The chain-level values of one manifest table.
struct Layer {
    origin: Origin,
    backend: Option<BackendKind>,
    model: Option<String>,
    base_url: Option<String>,
    seed: Option<u64>,
    temperature: Option<f64>,
    max_steps: Option<u32>,
    protocol: Option<ToolProtocol>,
    system_prompt: Option<PathBuf>,
    num_ctx: Option<u32>,
    max_output_tokens: Option<u32>,
    request_timeout_secs: Option<u64>,
    check: Option<CheckSpec>,
    check_rounds: Option<u32>,
}

impl Layer {
    fn parse(
        table: &Table,
        file: &Path,
        prefix: &str,
        known: &'static [&'static str],
        base: &Path,
        level: Level,
    ) -> Result<Layer, ConfigError> {
        check_keys(table, file, prefix, known, level)?;
        let r = Reader { table, file, prefix };
        let system_prompt = r.file_path("system_prompt", base, "system prompt")?;
        Ok(Layer {
            origin: if level == Level::Workspace { Origin::Workspace } else { Origin::Package },
            backend: r.backend()?,
            model: r.non_empty_string("model")?,
            base_url: r.non_empty_string("base_url")?,
            seed: r.seed()?,
            temperature: r.temperature()?,
            max_steps: r.max_steps()?,
            protocol: r.protocol()?,
            system_prompt,
            num_ctx: r.positive_u32("num_ctx", "a positive integer number of tokens (e.g. 16384)")?,
            max_output_tokens: r
                .positive_u32("max_output_tokens", "a positive integer number of tokens per model reply (e.g. 4096)")?,
            request_timeout_secs: r.positive_u64("request_timeout_secs", "a positive number of seconds (e.g. 600)")?,
            check: r.check()?,
            check_rounds: r.check_rounds()?,
        })
    }
}

/// A step as declared, its own values only.
struct RawStep {
    /// `package.metadata.promptgen.steps[i]`.
    key: String,
    id: String,
    prompt: PathBuf,
    prompt_display: String,
    outputs: Vec<String>,
    inputs: Vec<Input>,
    script: Option<PathBuf>,
    model: Option<String>,
    seed: Option<u64>,
    temperature: Option<f64>,
    max_steps: Option<u32>,
    protocol: Option<ToolProtocol>,
    system_prompt: Option<PathBuf>,
    check: Option<CheckSpec>,
    check_rounds: Option<u32>,
}

fn parse_steps(meta: &Table, file: &Path, package_dir: &Path) -> Result<Vec<RawStep>, ConfigError> {
    let key = format!("{PACKAGE_PREFIX}.steps");
    let empty_hint = "a chain needs at least one step: add a `[[package.metadata.promptgen.steps]]` table with \
                      `id = \"01\"` and `prompt = \"prompts/01.md\"`"
        .to_string();
    let array = match meta.get("steps") {
        None => return Err(ConfigError::Missing { file: file.into(), key, hint: empty_hint }),
        Some(Value::Array(array)) => array,
        Some(other) => {
            return Err(wrong_type(file, &key, "an array of tables (`[[package.metadata.promptgen.steps]]`)", other));
        }
    };
    if array.is_empty() {
        return Err(ConfigError::Missing { file: file.into(), key, hint: empty_hint });
    }
    let mut steps = Vec::with_capacity(array.len());
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for (index, value) in array.iter().enumerate() {
        let step_key = format!("{key}[{index}]");
        let Value::Table(table) = value else {
            return Err(wrong_type(file, &step_key, "a table (`[[package.metadata.promptgen.steps]]`)", value));
        };
        check_keys(table, file, &step_key, STEP_KEYS, Level::Step)?;
        let r = Reader { table, file, prefix: &step_key };

        let id = match r.string("id")? {
            None => {
                return Err(ConfigError::Missing {
                    file: file.into(),
                    key: r.key("id"),
                    hint: "every step needs a unique `id` of letters, digits, `_` and `-`, e.g. `id = \"01\"`".into(),
                });
            }
            Some(id) => id,
        };
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            return Err(ConfigError::InvalidValue {
                file: file.into(),
                key: r.key("id"),
                value: format!("{id:?}"),
                expected: "a non-empty id of ASCII letters, digits, `_` and `-` only, e.g. \"01\" or \"view\"".into(),
            });
        }
        if let Some(first_key) = seen.get(&id) {
            return Err(ConfigError::DuplicateId {
                file: file.into(),
                key: r.key("id"),
                id,
                first_key: first_key.clone(),
            });
        }
        seen.insert(id.clone(), r.key("id"));

        let what = |thing: &str| format!("{thing} of step `{id}`");
        let Some(prompt_display) = r.string("prompt")? else {
            return Err(ConfigError::Missing {
                file: file.into(),
                key: r.key("prompt"),
                hint: format!(
                    "step `{id}` needs `prompt`, a file relative to the package folder `{}`, e.g. `prompt = \"prompts/{id}.md\"`",
                    package_dir.display()
                ),
            });
        };
        let prompt = r.existing_file("prompt", &prompt_display, package_dir, &what("prompt"))?;
        let system_prompt = r.file_path("system_prompt", package_dir, &what("system prompt"))?;
        let script = r.file_path("script", package_dir, &what("script"))?;
        let outputs = r.outputs()?;
        let inputs = r.inputs(package_dir, &id)?;

        steps.push(RawStep {
            model: r.non_empty_string("model")?,
            seed: r.seed()?,
            temperature: r.temperature()?,
            max_steps: r.max_steps()?,
            protocol: r.protocol()?,
            check: r.check()?,
            check_rounds: r.check_rounds()?,
            key: step_key.clone(),
            id,
            prompt,
            prompt_display,
            outputs,
            inputs,
            script,
            system_prompt,
        });
    }
    Ok(steps)
}

/// Where a table sits, for the hints of unknown keys.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Package,
    Workspace,
    Step,
}

fn check_keys(
    table: &Table,
    file: &Path,
    prefix: &str,
    known: &'static [&'static str],
    level: Level,
) -> Result<(), ConfigError> {
    for name in table.keys() {
        if known.contains(&name.as_str()) {
            continue;
        }
        let step_only = ["id", "prompt", "outputs", "inputs", "script"];
        let chain_only = ["backend", "base_url", "num_ctx", "max_output_tokens", "request_timeout_secs", "steps"];
        let hint = if name == "api_key" {
            "; API keys do not belong in Cargo.toml: set OPENAI_API_KEY in the environment.".to_string()
        } else if level != Level::Step && step_only.contains(&name.as_str()) {
            format!("; `{name}` belongs to a step: put it under `[[package.metadata.promptgen.steps]]`.")
        } else if level == Level::Step && chain_only.contains(&name.as_str()) {
            format!("; `{name}` applies to the whole chain: set it in `[package.metadata.promptgen]`.")
        } else if level == Level::Workspace && name == "steps" {
            "; steps are declared by each package, in `[[package.metadata.promptgen.steps]]`.".to_string()
        } else {
            match closest(name, known) {
                Some(candidate) => format!("; did you mean `{candidate}`?"),
                None => ".".to_string(),
            }
        };
        return Err(ConfigError::UnknownKey {
            file: file.into(),
            key: format!("{prefix}.{name}"),
            hint,
            known: known.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", "),
        });
    }
    Ok(())
}

/// The known key nearest to `name`, if it is at most 2 edits away.
fn closest(name: &str, known: &[&'static str]) -> Option<&'static str> {
    known
        .iter()
        .map(|k| (edit_distance(&name.to_ascii_lowercase(), k), *k))
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

/// Typed access to the keys of one table, with errors naming the full key.
struct Reader<'a> {
    table: &'a Table,
    file: &'a Path,
    prefix: &'a str,
}

impl Reader<'_> {
    fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.prefix)
    }

    fn wrong(&self, name: &str, expected: &str, value: &Value) -> ConfigError {
        wrong_type(self.file, &self.key(name), expected, value)
    }

    fn invalid(&self, name: &str, value: impl fmt::Display, expected: &str) -> ConfigError {
        ConfigError::InvalidValue {
            file: self.file.into(),
            key: self.key(name),
            value: value.to_string(),
            expected: expected.into(),
        }
    }

    fn string(&self, name: &str) -> Result<Option<String>, ConfigError> {
        match self.table.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.wrong(name, "a string", other)),
        }
    }

    fn non_empty_string(&self, name: &str) -> Result<Option<String>, ConfigError> {
        match self.string(name)? {
            Some(s) if s.trim().is_empty() => Err(self.invalid(name, format!("{s:?}"), "a non-empty string")),
            other => Ok(other),
        }
    }

    fn integer(&self, name: &str, expected: &str) -> Result<Option<i64>, ConfigError> {
        match self.table.get(name) {
            None => Ok(None),
            Some(Value::Integer(i)) => Ok(Some(*i)),
            Some(other) => Err(self.wrong(name, expected, other)),
        }
    }

    fn seed(&self) -> Result<Option<u64>, ConfigError> {
        let expected = "a non-negative integer (e.g. 123)";
        match self.integer("seed", expected)? {
            None => Ok(None),
            Some(i) => u64::try_from(i).map(Some).map_err(|_| self.invalid("seed", i, expected)),
        }
    }

    fn temperature(&self) -> Result<Option<f64>, ConfigError> {
        let expected = "a number from 0 to 2 (e.g. 0.0)";
        let t = match self.table.get("temperature") {
            None => return Ok(None),
            Some(Value::Float(f)) => *f,
            Some(Value::Integer(i)) => *i as f64,
            Some(other) => return Err(self.wrong("temperature", expected, other)),
        };
        if (0.0..=2.0).contains(&t) { Ok(Some(t)) } else { Err(self.invalid("temperature", t, expected)) }
    }

    fn positive_u64(&self, name: &str, expected: &str) -> Result<Option<u64>, ConfigError> {
        match self.integer(name, expected)? {
            None => Ok(None),
            Some(i) if i >= 1 => Ok(Some(i as u64)),
            Some(i) => Err(self.invalid(name, i, expected)),
        }
    }

    fn positive_u32(&self, name: &str, expected: &str) -> Result<Option<u32>, ConfigError> {
        match self.integer(name, expected)? {
            None => Ok(None),
            Some(i) => match u32::try_from(i) {
                Ok(v) if v >= 1 => Ok(Some(v)),
                _ => Err(self.invalid(name, i, expected)),
            },
        }
    }

    fn check(&self) -> Result<Option<CheckSpec>, ConfigError> {
        let expected = "\"rustc\", \"none\", or a command as an array of strings (e.g. [\"cargo\", \"check\"])";
        match self.table.get("check") {
            None => Ok(None),
            Some(Value::String(s)) if s == "rustc" => Ok(Some(CheckSpec::Rustc)),
            Some(Value::String(s)) if s == "none" => Ok(Some(CheckSpec::None)),
            Some(Value::String(s)) => Err(self.invalid("check", format!("{s:?}"), expected)),
            Some(Value::Array(items)) => {
                let words: Option<Vec<String>> = items.iter().map(|i| i.as_str().map(str::to_string)).collect();
                match words {
                    Some(words) if !words.is_empty() && !words[0].trim().is_empty() => Ok(Some(CheckSpec::Command(words))),
                    _ => Err(self.invalid("check", Value::Array(items.clone()), expected)),
                }
            }
            Some(other) => Err(self.wrong("check", expected, other)),
        }
    }

    fn check_rounds(&self) -> Result<Option<u32>, ConfigError> {
        let expected = "a non-negative integer (repair rounds after a failed check, e.g. 3)";
        match self.integer("check_rounds", expected)? {
            None => Ok(None),
            Some(i) => u32::try_from(i).map(Some).map_err(|_| self.invalid("check_rounds", i, expected)),
        }
    }

    fn max_steps(&self) -> Result<Option<u32>, ConfigError> {
        self.positive_u32("max_steps", "an integer of at least 1 (the model calls the step may make, e.g. 8)")
    }

    fn backend(&self) -> Result<Option<BackendKind>, ConfigError> {
        match self.string("backend")? {
            None => Ok(None),
            Some(s) => s.parse().map(Some).map_err(|_| self.invalid("backend", format!("{s:?}"), BACKENDS_EXPECTED)),
        }
    }

    fn protocol(&self) -> Result<Option<ToolProtocol>, ConfigError> {
        match self.string("protocol")? {
            None => Ok(None),
            Some(s) => match s.as_str() {
                "native" => Ok(Some(ToolProtocol::Native)),
                "json" => Ok(Some(ToolProtocol::Json)),
                "blocks" => Ok(Some(ToolProtocol::Blocks)),
                _ => Err(self.invalid("protocol", format!("{s:?}"), PROTOCOLS_EXPECTED)),
            },
        }
    }

    /// An optional key naming a file that must exist, relative to `base`.
    fn file_path(&self, name: &str, base: &Path, what: &str) -> Result<Option<PathBuf>, ConfigError> {
        match self.string(name)? {
            None => Ok(None),
            Some(written) => self.existing_file(name, &written, base, what).map(Some),
        }
    }

    fn existing_file(&self, name: &str, written: &str, base: &Path, what: &str) -> Result<PathBuf, ConfigError> {
        if written.trim().is_empty() {
            return Err(self.invalid(name, "\"\"", "a path to a file"));
        }
        let path = lexical_join(base, written);
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => Ok(path),
            Ok(_) => Err(ConfigError::NotAFile {
                file: self.file.into(),
                key: self.key(name),
                value: written.into(),
                path,
                what: what.into(),
            }),
            Err(_) => Err(ConfigError::FileNotFound {
                file: self.file.into(),
                key: self.key(name),
                path,
                relative_to: base.into(),
                what: what.into(),
            }),
        }
    }

    fn string_list(&self, name: &str, expected: &str) -> Result<Vec<(String, String)>, ConfigError> {
        match self.table.get(name) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    let key = format!("{name}[{i}]");
                    match item {
                        Value::String(s) => Ok((key, s.clone())),
                        other => Err(self.wrong(&key, "a string (a relative path)", other)),
                    }
                })
                .collect(),
            Some(other) => Err(self.wrong(name, expected, other)),
        }
    }

    fn outputs(&self) -> Result<Vec<String>, ConfigError> {
        let mut outputs = Vec::new();
        let mut seen = BTreeSet::new();
        for (name, written) in self.string_list("outputs", "an array of relative paths, e.g. [\"view.rs\"]")? {
            let bad = |reason: String| ConfigError::BadPath {
                file: self.file.into(),
                key: self.key(&name),
                value: written.clone(),
                reason,
            };
            let normalized = output_path(&written).map_err(bad)?;
            if !seen.insert(normalized.clone()) {
                return Err(bad("is listed twice".into()));
            }
            outputs.push(normalized);
        }
        Ok(outputs)
    }

    fn inputs(&self, package_dir: &Path, step_id: &str) -> Result<Vec<Input>, ConfigError> {
        let mut inputs: Vec<Input> = Vec::new();
        let entries = self.string_list("inputs", "an array of files or folders, e.g. [\"src/domain.rs\"]")?;
        for (name, written) in entries {
            let bad = |reason: String| ConfigError::BadPath {
                file: self.file.into(),
                key: self.key(&name),
                value: written.clone(),
                reason,
            };
            let virtual_path = input_virtual_path(&written).map_err(bad)?;
            let real_path = lexical_join(package_dir, &written);
            let is_dir = match std::fs::metadata(&real_path) {
                Ok(meta) if meta.is_dir() => true,
                Ok(meta) if meta.is_file() => false,
                Ok(_) => {
                    return Err(bad(format!("names `{}`, which is neither a file nor a folder", real_path.display())));
                }
                Err(_) => {
                    return Err(ConfigError::FileNotFound {
                        file: self.file.into(),
                        key: self.key(&name),
                        path: real_path,
                        relative_to: package_dir.into(),
                        what: format!("input of step `{step_id}`"),
                    });
                }
            };
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

fn wrong_type(file: &Path, key: &str, expected: &str, value: &Value) -> ConfigError {
    ConfigError::WrongType { file: file.into(), key: key.into(), expected: expected.into(), found: describe(value) }
}

fn describe(value: &Value) -> String {
    match value {
        Value::String(s) => format!("the string {s:?}"),
        Value::Integer(i) => format!("the integer {i}"),
        Value::Float(f) => format!("the float {f}"),
        Value::Boolean(b) => format!("the boolean {b}"),
        Value::Datetime(d) => format!("the datetime {d}"),
        Value::Array(_) => "an array".into(),
        Value::Table(_) => "a table".into(),
    }
}

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

fn read_manifest(file: &Path) -> Result<Table, ConfigError> {
    let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Read { file: file.into(), source })?;
    text.parse::<Table>()
        .map_err(|e| ConfigError::Parse { file: file.into(), message: e.to_string().trim_end().to_string() })
}

/// The workspace root, its manifest, and its parsed text (`None`: the package's own manifest).
type Workspace = (PathBuf, PathBuf, Option<Table>);

/// Finds the workspace the way cargo does: the package's own manifest if it has a
/// `[workspace]` table, else the nearest `Cargo.toml` with one in the parent folders.
/// `package.edition`, or the workspace's `workspace.package.edition` when the package
/// inherits it.
fn package_edition(doc: &Table, workspace: Option<(&Path, &Table)>, file: &Path) -> Result<String, ConfigError> {
    match doc.get("package").and_then(|p| p.get("edition")) {
        None => Ok("2015".into()),
        Some(Value::String(edition)) => Ok(edition.clone()),
        Some(Value::Table(t)) if t.get("workspace").and_then(Value::as_bool) == Some(true) => {
            let inherited = workspace.and_then(|(ws_file, ws)| {
                let edition = ws.get("workspace")?.get("package")?.get("edition")?.as_str()?;
                Some((ws_file, edition.to_string()))
            });
            match inherited {
                Some((_, edition)) => Ok(edition),
                None => Err(ConfigError::Missing {
                    file: file.into(),
                    key: "package.edition".into(),
                    hint: "`edition.workspace = true` needs `[workspace.package] edition = ...` in the workspace's Cargo.toml".into(),
                }),
            }
        }
        Some(other) => Err(wrong_type(file, "package.edition", "a string such as \"2021\"", other)),
    }
}

fn find_workspace(doc: &Table, file: &Path, package_dir: &Path) -> Result<Option<Workspace>, ConfigError> {
    if doc.contains_key("workspace") {
        return Ok(Some((package_dir.to_path_buf(), file.to_path_buf(), None)));
    }
    for dir in package_dir.ancestors().skip(1) {
        let candidate = dir.join("Cargo.toml");
        if !candidate.is_file() {
            continue;
        }
        let ws_doc = read_manifest(&candidate)?;
        if ws_doc.contains_key("workspace") {
            return Ok(Some((dir.to_path_buf(), candidate, Some(ws_doc))));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_and_suggestions() {
        assert_eq!(edit_distance("max_step", "max_steps"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(closest("maxsteps", CHAIN_KEYS), Some("max_steps"));
        assert_eq!(closest("Model", CHAIN_KEYS), Some("model"));
        assert_eq!(closest("completely_else", CHAIN_KEYS), None);
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
