//! [`Error`]: what the build entry, and the phases it runs (config, plan, run, check,
//! record), can fail with. Every variant names the file, step or variable at fault and, where
//! there is one, the command that fixes it. What only `cargo promptgen` can fail with (review,
//! eval, the remote, a store switch) has error types of its own, in those modules.

use std::fmt;
use std::path::PathBuf;

use codegen_core::FsError;
use codegen_core::backend::BackendError;
use codegen_core::sandbox::SandboxError;

use crate::config::ConfigError;
use crate::hash::short;

/// Why a chain could not be checked, run, recorded or built.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file operation failed.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// The `[package.metadata.promptgen]` declaration is wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// `promptgen.lock` cannot be read.
    #[error("the lock `{}` is damaged: {detail}\nRestore it from version control (`git checkout -- promptgen.lock`), or record every step again with `cargo promptgen --force`.", path.display())]
    DamagedLock {
        /// The lock file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// Steps must be regenerated and this build may not call a model.
    #[error("{}", stale_message(package, steps, reason))]
    Stale {
        /// The package.
        package: String,
        /// Each stale step and what changed in it.
        steps: Vec<StaleStep>,
        /// Why no model may be called (`PROMPTGEN_OFFLINE=1`, `CI`, `--offline`).
        reason: String,
    },
    /// Steps of a dependency (from a registry, git or a vendored directory) must be
    /// regenerated: a dependency's build never calls a model.
    #[error("{}", stale_dependency_message(package, origin, manifest_dir, steps))]
    StaleDependency {
        /// The dependency.
        package: String,
        /// Where it comes from: "a registry", "a git repository", "a vendored directory".
        origin: String,
        /// Its folder.
        manifest_dir: PathBuf,
        /// Each stale step and what changed in it.
        steps: Vec<StaleStep>,
    },
    /// A step failed; nothing was recorded for it.
    #[error("step `{id}` failed{}; nothing of it was recorded: the lock, the stored outputs and the build's previous outputs are unchanged{}{}",
        if *runs > 1 { format!(" in each of its {runs} runs (seed_retries)") } else { String::new() },
        if *runs > 1 { "\nEach run is in its transcript; the cause below is the last run's." } else { "" },
        if *kept { format!("\nWhat it did: `cargo promptgen log {id} -p {package}`") } else { String::new() })]
    Step {
        /// The step.
        id: String,
        /// Its package.
        package: String,
        /// How many times it ran (more than once with `seed_retries`).
        runs: u32,
        /// Whether its transcript was kept under the target folder, for `cargo promptgen log`.
        kept: bool,
        /// What went wrong, with the step's transcript.
        #[source]
        source: Box<codegen_core::StepFailure>,
    },
    /// The run was interrupted (Ctrl-C) while a step ran; nothing of that step was recorded.
    #[error("interrupted: step `{id}` was stopped {during}; nothing of it was recorded: the lock, the stored outputs and the pending results are as they were before it began{}",
        if *kept { format!("\nWhat it did until then: `cargo promptgen log {id} -p {package}`") } else { String::new() })]
    Interrupted {
        /// The step.
        id: String,
        /// Its package.
        package: String,
        /// When, in words: "during model call 2 of 8".
        during: String,
        /// Whether its transcript was kept under the target folder, for `cargo promptgen log`.
        kept: bool,
    },
    /// A generated file would read a file at compile time outside the generated tree (or a
    /// protected one); it is never recorded.
    #[error(
        "step `{id}`: `{path}` is not recorded: {detail}. Generated code may only include files of the generated tree; rewrite the step's prompt or script so that it does not."
    )]
    CompileTimeRead {
        /// The step.
        id: String,
        /// The generated file.
        path: String,
        /// The construct and why it is refused.
        detail: String,
    },
    /// A step's check could run only in part when the step ran (its tests needed what a
    /// later step writes), and fails now that the chain is complete.
    #[error(
        "step `{id}` was recorded, but its check `{check}` fails now that the whole chain is written (it could only run in part when the step ran):\n{diagnostics}\nRun `cargo promptgen --step {id}`: with the chain complete, its check runs in full and the model gets these messages."
    )]
    CheckFailedOnceComplete {
        /// The step.
        id: String,
        /// The check.
        check: String,
        /// What it said.
        diagnostics: String,
    },
    /// A step to run declares no outputs: a step writes only its declared outputs, so
    /// nothing it wrote could be recorded.
    #[error(
        "step `{id}` declares no outputs, and a step writes only its declared outputs: declare the files it writes in its table, e.g. `outputs = [\"view.rs\"]`"
    )]
    NoOutputs {
        /// The step.
        id: String,
    },
    /// The backend could not be opened.
    #[error("step `{id}` could not open its backend")]
    Backend {
        /// The step.
        id: String,
        /// Why.
        #[source]
        source: BackendError,
    },
    /// The sandbox for a step could not be set up.
    #[error("step `{id}` could not set up its sandbox")]
    Sandbox {
        /// The step.
        id: String,
        /// Why.
        #[source]
        source: SandboxError,
    },
    /// A stored file does not match the lock.
    #[error("stored file `{}` does not match promptgen.lock ({detail})", path.display())]
    DamagedStore {
        /// The file.
        path: PathBuf,
        /// Missing, or which hash it has.
        detail: String,
    },
    /// Files the lock records are not in the local cache (`store = "cache"`), or are damaged
    /// there. A build never regenerates them: that would change the lock.
    #[error("{}", not_in_cache_message(package, cache_dir, remote.as_deref(), missing))]
    NotInCache {
        /// The package.
        package: String,
        /// The local cache folder.
        cache_dir: PathBuf,
        /// The cache's remote (`cache_url`), when one is set.
        remote: Option<String>,
        /// Each file it lacks or holds damaged.
        missing: Vec<MissingFile>,
    },
    /// Bytes that were to be kept or sent under a hash do not have it; they were not used.
    #[error("{what} hash to {actual}, not to {expected}; they were not used")]
    HashMismatch {
        /// Whose bytes (naming the file, object or URL).
        what: String,
        /// The hash they should have.
        expected: String,
        /// The hash they have.
        actual: String,
    },
    /// `store = "cache"` (or a switch to it) and the environment names no cache folder.
    #[error(
        "{package} needs a cache folder and the environment names none: set PROMPTGEN_CACHE_DIR to an absolute path (or XDG_CACHE_HOME or HOME)"
    )]
    NoCacheDir {
        /// The package.
        package: String,
    },
    /// The build script's environment lacks something Cargo always sets.
    #[error("environment variable {name} is not set: {hint}")]
    Env {
        /// The variable.
        name: &'static str,
        /// What to do.
        hint: &'static str,
    },
}

/// Shown as the error's message, so that `fn main() -> Result<(), Error>` in a build script
/// prints the readable text rather than a struct dump.
impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&report(self))
    }
}

/// The error and each of its causes, one per line (see [`codegen_core::error_with_causes`]).
pub fn report(error: &(dyn std::error::Error + 'static)) -> String {
    codegen_core::error_with_causes(error, "\ncaused by: ")
}

/// A file the lock names that the cache cannot give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingFile {
    /// The step that recorded it.
    pub step: String,
    /// Its path in the generated tree.
    pub path: String,
    /// The SHA-256 the lock records.
    pub sha256: String,
    /// Whether an object is there but damaged (rather than absent).
    pub damaged: bool,
}

impl fmt::Display for MissingFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = if self.damaged { "damaged" } else { "missing" };
        write!(f, "step {}: `{}` (sha256 {}): {state}", self.step, self.path, short(&self.sha256))
    }
}

/// A step that must run again, and why.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleStep {
    /// The step.
    pub id: String,
    /// What changed, one item per change.
    pub reasons: Vec<String>,
}

fn stale_message(package: &str, steps: &[StaleStep], reason: &str) -> String {
    let mut text = format!(
        "{} step{} of {package} must be regenerated, and {reason}:\n",
        steps.len(),
        if steps.len() == 1 { "" } else { "s" }
    );
    for step in steps {
        text.push_str(&format!("  step {}: {}\n", step.id, step.reasons.join("; ")));
    }
    text.push_str(&format!(
        "Run `cargo promptgen -p {package}` where a model is reachable, review the new outputs under promptgen/, and commit them with promptgen.lock."
    ));
    text
}

fn stale_dependency_message(
    package: &str,
    origin: &str,
    manifest_dir: &std::path::Path,
    steps: &[StaleStep],
) -> String {
    let mut text = format!(
        "{package} is a dependency from {origin} (`{}`), and {} step{} of its prompt chain must be regenerated:\n",
        manifest_dir.display(),
        steps.len(),
        if steps.len() == 1 { "" } else { "s" }
    );
    for step in steps {
        text.push_str(&format!("  step {}: {}\n", step.id, step.reasons.join("; ")));
    }
    text.push_str(&format!(
        "A dependency's build never calls a model: it would use your model server and your keys to make code nobody \
         reviewed. The fix belongs in {package}: its author runs `cargo promptgen -p {package}` and commits promptgen.lock \
         with the generated files. Until then, depend on a revision whose lock is up to date, or use a local copy through \
         `[patch]`, where you can run `cargo promptgen` yourself and review the result."
    ));
    text
}

fn not_in_cache_message(
    package: &str,
    cache_dir: &std::path::Path,
    remote: Option<&str>,
    missing: &[MissingFile],
) -> String {
    let damaged = missing.iter().filter(|m| m.damaged).count();
    let mut text = format!(
        "{} file{} that promptgen.lock records for {package} {} not in the local cache `{}`{}:\n",
        missing.len(),
        if missing.len() == 1 { "" } else { "s" },
        if missing.len() == 1 { "is" } else { "are" },
        cache_dir.display(),
        if damaged > 0 { format!(" ({damaged} there but damaged, and not used)") } else { String::new() },
    );
    const SHOWN: usize = 10;
    for file in missing.iter().take(SHOWN) {
        text.push_str(&format!("  {file}\n"));
    }
    if missing.len() > SHOWN {
        text.push_str(&format!("  ... and {} more\n", missing.len() - SHOWN));
    }
    match remote {
        Some(remote) => text.push_str(&format!("Run `cargo promptgen pull -p {package}` to fetch them from {remote}.")),
        None => text.push_str(&format!(
            "No `cache_url` is set, so no remote holds them: set one and run `cargo promptgen pull -p {package}`, or \
             regenerate them with `cargo promptgen -p {package}` (the lock will change: a model does not write the same \
             bytes twice)."
        )),
    }
    text
}
