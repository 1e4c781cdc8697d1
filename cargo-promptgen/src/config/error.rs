//! [`ConfigError`]: what a mistake in the declaration says, and where.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use crate::cache::CACHE_DIR_VAR;

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
