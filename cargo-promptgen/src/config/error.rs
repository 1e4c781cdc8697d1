//! [`ConfigError`]: what a mistake in the declaration says, and where.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use super::store::CACHE_DIR_VAR;

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
#[derive(Debug)]
pub struct ConfigError {
    file: PathBuf,
    at: Option<Location>,
    key: Option<String>,
    /// Boxed, so that every `Result` of a load stays small.
    kind: Box<ConfigErrorKind>,
}

/// What kind of mistake a [`ConfigError`] is, with what its message says beyond the file, the
/// place and the key.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    /// The manifest cannot be read.
    Read {
        /// Why.
        source: io::Error,
    },
    /// The manifest is not valid TOML.
    Parse {
        /// The TOML parser's message, with line and column.
        message: String,
    },
    /// The manifest has no `[package]` with a `name` (the key is `package.name`; the place
    /// the `[package]` table, or the start of the file).
    NoPackage,
    /// The package declares no chain (the key is `package.metadata.promptgen`).
    NoChain,
    /// A key that means nothing here (often a typo).
    UnknownKey {
        /// ``; did you mean `x`?``, another hint ending in its punctuation, or `.`.
        hint: String,
        /// The keys accepted at that level, comma-separated.
        known: String,
    },
    /// A value of the wrong TOML type.
    WrongType {
        /// What is expected.
        expected: String,
        /// What was found.
        found: String,
    },
    /// A value of the right type that is not allowed.
    InvalidValue {
        /// The value as found.
        value: String,
        /// What is expected.
        expected: String,
    },
    /// A key is set under its name and under its old name in one table (the place is the
    /// second of the two).
    SetTwice {
        /// The full key under its old name.
        old: String,
    },
    /// A required key is missing (or `steps` is empty); the place is the table that lacks it.
    Missing {
        /// What to add.
        hint: String,
    },
    /// Two steps have the same id (the key and place are the second use's).
    DuplicateId {
        /// The id.
        id: String,
        /// The key of the first use.
        first_key: String,
    },
    /// `after` names a step the chain does not have.
    UnknownAfter {
        /// The step that declares it.
        step: String,
        /// The id it names.
        after: String,
        /// The ids there are.
        known: Vec<String>,
    },
    /// A step names itself in its own `after`.
    AfterItself {
        /// The step.
        step: String,
    },
    /// Steps wait for each other in a cycle, so none of them can start (the key and place are
    /// an id in `after` that closes the cycle).
    Cycle {
        /// The cycle: each link's step runs after the next link's step, the last after the first.
        cycle: Vec<CycleLink>,
    },
    /// Two steps of which neither runs after the other declare the same output (the key and
    /// place are the second step's output).
    SharedOutput {
        /// The output, as normalised.
        path: String,
        /// The step that declares it first (in id order).
        first: String,
        /// The other.
        second: String,
    },
    /// A file the declaration names does not exist.
    FileNotFound {
        /// The path it resolved to.
        path: PathBuf,
        /// The folder it is relative to.
        relative_to: PathBuf,
        /// What the file is for (``prompt of step `01` ``).
        what: String,
    },
    /// A file or folder the declaration names cannot be looked at, for another reason than
    /// not existing (permission denied, a path through a file, ...).
    Unreadable {
        /// The path it resolved to.
        path: PathBuf,
        /// What the file or folder is for.
        what: String,
        /// The operating system's reason.
        source: io::Error,
    },
    /// A symbolic link in an input folder leads outside the package, to nothing, or to a
    /// folder that holds it (the place is the input that holds the link).
    InputLink {
        /// The link.
        link: PathBuf,
        /// Where it leads.
        target: PathBuf,
        /// Why it is not followed, and what to do instead.
        reason: String,
    },
    /// A path that must be a file is something else (a folder).
    NotAFile {
        /// The path as written.
        value: String,
        /// The path it resolved to.
        path: PathBuf,
        /// What the file is for.
        what: String,
    },
    /// An output or input path breaks the rules for paths the model sees.
    BadPath {
        /// The path as written.
        value: String,
        /// What is wrong and what to write instead.
        reason: String,
    },
    /// No layer names a model for some steps (the key is `package.metadata.promptgen.model`).
    MissingModel {
        /// The ids of the steps without a model.
        steps: Vec<String>,
    },
    /// The `scripted` backend is chosen and a step has no script.
    MissingScript {
        /// The step's id.
        step: String,
        /// ``backend `scripted` (from ...)``.
        backend: String,
    },
    /// An environment variable (the key) has a value that cannot be used; the file is the
    /// package manifest being loaded.
    Env {
        /// Its value.
        value: String,
        /// What is expected.
        expected: String,
    },
    /// `store = "cache"`, and the environment names no cache folder.
    NoCacheDir,
    /// A command-line flag (the key, `--backend`) has a value that cannot be used; the file is
    /// the package manifest being loaded.
    Flag {
        /// Its value.
        value: String,
        /// What is expected.
        expected: String,
    },
}

/// One link of a [`ConfigErrorKind::Cycle`]: `step` runs after the next link's step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CycleLink {
    /// The step.
    pub step: String,
    /// Whether it runs after the next step because it declares no `after` (the next is the
    /// step before it in id order) rather than by its own `after`.
    pub implicit: bool,
}

impl ConfigError {
    /// The mistake `kind` in `file`, at `at`, about `key`.
    pub(super) fn new(
        file: impl Into<PathBuf>,
        at: Option<Location>,
        key: Option<String>,
        kind: ConfigErrorKind,
    ) -> ConfigError {
        ConfigError { file: file.into(), at, key, kind: Box::new(kind) }
    }

    /// The file at fault (for [`ConfigErrorKind::Env`] and [`ConfigErrorKind::Flag`], the
    /// manifest being loaded).
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Where in [`ConfigError::file`] the mistake is; `None` for what is not in the file (an
    /// unreadable manifest, a variable, a flag).
    pub fn location(&self) -> Option<Location> {
        self.at
    }

    /// The key at fault: a dotted path, an environment variable or a flag; `None` when the
    /// whole file is (unreadable, not TOML).
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// What kind of mistake it is.
    pub fn kind(&self) -> &ConfigErrorKind {
        &self.kind
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ConfigErrorKind as K;
        let file = self.file.display();
        let key = self.key.as_deref().unwrap_or_default();
        if let Some(at) = self.at {
            // Two messages go on from the place itself: "`Cargo.toml:3:1` is not valid TOML".
            let joint = if matches!(*self.kind, K::Parse { .. } | K::NoChain) { " " } else { ": " };
            write!(f, "`{file}:{at}`{joint}")?;
        }
        match &*self.kind {
            K::Read { .. } => write!(f, "cannot read `{file}`"),
            K::Parse { message } => write!(f, "is not valid TOML: {message}"),
            K::NoPackage => write!(
                f,
                "`{key}` is missing: this is not a package manifest. Point at the `Cargo.toml` of the package that \
                 declares `[package.metadata.promptgen]`."
            ),
            K::NoChain => write!(
                f,
                "has no `[{key}]` table, so it declares no prompt chain. Declare one:\n\n[package.metadata.promptgen]\n\
                 model = \"qwen2.5-coder:7b\"\n\n[[package.metadata.promptgen.steps]]\nid = \"01\"\n\
                 prompt = \"prompts/01.md\"\noutputs = [\"generated.rs\"]"
            ),
            K::UnknownKey { hint, known } => write!(f, "unknown key `{key}`{hint} Known keys here: {known}."),
            K::WrongType { expected, found } => write!(f, "`{key}` must be {expected}, found {found}."),
            K::InvalidValue { value, expected } => write!(f, "`{key}` = {value} is not allowed: expected {expected}."),
            K::SetTwice { old } => write!(
                f,
                "`{key}` and `{old}` are both set, but they are one setting (`{old}` is its old name); keep one."
            ),
            K::Missing { hint } => write!(f, "`{key}` is missing: {hint}"),
            K::DuplicateId { id, first_key } => {
                write!(f, "`{key}`: step id `{id}` is already used by `{first_key}`; step ids must be unique.")
            }
            K::UnknownAfter { step, after, known } => write!(
                f,
                "`{key}`: step `{step}` runs after `{after}`, but there is no step `{after}`; the steps are: {}.",
                known.join(", ")
            ),
            K::AfterItself { step } => write!(
                f,
                "`{key}`: step `{step}` names itself in `after`, but a step cannot run after itself; remove \"{step}\" \
                 from it."
            ),
            K::Cycle { cycle } => write!(
                f,
                "`{key}`: steps wait for each other in a cycle, so none of them can start: {}. Remove one of these \
                 from an `after` (a step without `after` runs after the step before it in id order).",
                describe_cycle(cycle)
            ),
            K::SharedOutput { path, first, second } => write!(
                f,
                "`{key}` = {path:?}: steps `{first}` and `{second}` both declare `{path}`, and neither runs after the \
                 other, so which of their files the crate gets would depend on which ran last. Make one run after the \
                 other (e.g. `after = [\"{first}\"]` in step `{second}`), or give each its own file."
            ),
            K::FileNotFound { path, relative_to, what } => write!(
                f,
                "`{key}`: the {what}, `{}`, does not exist (paths are relative to `{}`).",
                path.display(),
                relative_to.display()
            ),
            K::Unreadable { path, what, .. } => write!(f, "`{key}`: cannot use the {what}, `{}`", path.display()),
            K::InputLink { link, target, reason } => {
                write!(f, "`{key}`: the symbolic link `{}` leads to `{}`, {reason}.", link.display(), target.display())
            }
            K::NotAFile { value, path, what } => {
                write!(f, "`{key}` = {value:?}: `{}` is a folder, but the {what} must be a file.", path.display())
            }
            K::BadPath { value, reason } => write!(f, "`{key}` = {value:?} {reason}."),
            K::MissingModel { steps } => write!(
                f,
                "`{key}` is missing and {} no `model` of {}: set `model` in `[package.metadata.promptgen]` (e.g. \
                 model = \"qwen2.5-coder:7b\"), in each step, in `[workspace.metadata.promptgen]`, or with \
                 PROMPTGEN_MODEL or --model.",
                steps_without_model(steps),
                if steps.len() == 1 { "its own" } else { "their own" }
            ),
            K::MissingScript { step, backend } => write!(
                f,
                "`{key}` is missing: step `{step}` needs a script because the {backend} replays canned turns from a \
                 file. Set `script = \"scripts/{step}.toml\"` in the step, or choose another backend."
            ),
            K::Env { value, expected } => write!(
                f,
                "environment variable {key}={value:?} is not allowed: expected {expected} (while loading `{file}`). \
                 Fix or unset {key}."
            ),
            K::NoCacheDir => write!(
                f,
                "`{key}` = \"cache\" needs a cache folder, and the environment names none (neither {CACHE_DIR_VAR} \
                 nor the user's cache folder: XDG_CACHE_HOME or HOME, LOCALAPPDATA on Windows). Set {CACHE_DIR_VAR} \
                 to an absolute path."
            ),
            K::Flag { value, expected } => {
                write!(f, "{key} {value:?} is not allowed: expected {expected} (while loading `{file}`).")
            }
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &*self.kind {
            ConfigErrorKind::Read { source } | ConfigErrorKind::Unreadable { source, .. } => Some(source),
            _ => None,
        }
    }
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
