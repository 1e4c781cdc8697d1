//! Checks a step's output must pass before the step may finish: a compiler, a linter, a
//! test command. When a check fails, the loop sends its diagnostics back to the model and
//! lets it fix the files, the way a programmer fixes their own build.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A check of the files under a step's output root.
pub trait Check {
    /// A short name for messages, e.g. `rustc`.
    fn name(&self) -> String;
    /// Checks the tree at `output_root`.
    fn run(&mut self, output_root: &Path) -> Result<CheckOutcome, CheckError>;
}

/// What a check found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckOutcome {
    /// The tree passes.
    Passed,
    /// Everything that could be checked passes, and the rest must wait: for example, the
    /// crate's tests cannot run until a later step writes a module they need. Says what was
    /// put off and why; the step may finish.
    PutOff(String),
    /// The tree fails; the diagnostics say why.
    Failed(Diagnostics),
}

/// What a failed check found: the text the model is told (trimmed to what it needs), and the
/// same findings as data, which the transcript keeps so that nothing downstream (eval's
/// failure classes) has to read them back out of the text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diagnostics {
    /// What the model is told.
    pub text: String,
    /// The errors and failing tests the text shows.
    pub findings: Findings,
}

impl Diagnostics {
    /// Diagnostics that are free text only, such as a command's output: nothing in them is
    /// known as data.
    pub fn text(text: impl Into<String>) -> Diagnostics {
        Diagnostics { text: text.into(), findings: Findings::default() }
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The findings of a failed check, as data: each compiler error with its code and place, and
/// each failing test by name. Empty for a check whose output is free text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Findings {
    /// The compiler's errors, in the order shown, each once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<Finding>,
    /// The tests that failed, by name, in the order shown.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_tests: Vec<String>,
}

impl Findings {
    /// Whether nothing was found as data.
    pub fn is_empty(&self) -> bool {
        self.errors.is_empty() && self.failed_tests.is_empty()
    }
}

/// One compiler error.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// Its code (`E0308`), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Its message, as the model saw it; empty when it was withheld.
    pub message: String,
    /// The file its primary span is in, by the path the model knows; `None` when it has no
    /// span, or points where the model may not look.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The line there (1-based).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// The column there (1-based).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<u32>,
    /// Whether the model was told only that it exists (it points into a file the model may
    /// not read, and even its message could quote that file).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub withheld: bool,
}

/// The check itself could not run (its program is missing, say): the user's problem, not
/// the model's, so the step fails.
#[derive(Debug, thiserror::Error)]
#[error("the check `{check}` could not run: {detail}")]
pub struct CheckError {
    /// The check's name.
    pub check: String,
    /// What went wrong, and what to do.
    pub detail: String,
}

/// Diagnostics longer than this are cut: a model fixes the first errors first, and a
/// cascade of follow-on errors only crowds its context.
pub const MAX_DIAGNOSTICS_BYTES: usize = 6_000;

/// A check that runs a command: a non-zero exit fails it, and its output is the diagnostics.
/// The command runs in `dir`, with `PROMPTGEN_TREE` set to the output root and every
/// variable that may hold a secret removed (see [`remove_secrets`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandCheck {
    program: String,
    args: Vec<String>,
    dir: PathBuf,
    env: Vec<(String, String)>,
    prepare: Option<PrepareCommand>,
}

/// What [`CommandCheck::prepare`] runs on the command just before it starts, with the output
/// root: cargo-promptgen confines the command's processes with it. An error stops the check
/// (the user's problem, not the model's). Two are equal when they are the same closure.
#[derive(Clone)]
pub struct PrepareCommand(Arc<PrepareFn>);

/// The function a [`PrepareCommand`] holds.
type PrepareFn = dyn Fn(&mut Command, &Path) -> Result<(), String> + Send + Sync;

impl std::fmt::Debug for PrepareCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PrepareCommand(..)")
    }
}

impl PartialEq for PrepareCommand {
    fn eq(&self, other: &PrepareCommand) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for PrepareCommand {}

impl CommandCheck {
    /// `command[0]` with the other items as arguments, run in `dir`.
    pub fn new(command: &[String], dir: impl Into<PathBuf>) -> Option<CommandCheck> {
        let (program, args) = command.split_first()?;
        Some(CommandCheck {
            program: program.clone(),
            args: args.to_vec(),
            dir: dir.into(),
            env: Vec::new(),
            prepare: None,
        })
    }

    /// Runs `prepare` on the command, with the output root, after its environment is set and
    /// before it starts (to confine it, say); an error it returns stops the check.
    pub fn prepare(
        mut self,
        prepare: impl Fn(&mut Command, &Path) -> Result<(), String> + Send + Sync + 'static,
    ) -> CommandCheck {
        self.prepare = Some(PrepareCommand(Arc::new(prepare)));
        self
    }

    /// Sets a variable for the command (after the secrets are removed).
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> CommandCheck {
        self.env.push((name.into(), value.into()));
        self
    }
}

impl Check for CommandCheck {
    fn name(&self) -> String {
        std::iter::once(&self.program).chain(&self.args).cloned().collect::<Vec<_>>().join(" ")
    }

    fn run(&mut self, output_root: &Path) -> Result<CheckOutcome, CheckError> {
        let mut command = Command::new(&self.program);
        command.args(&self.args).current_dir(&self.dir);
        remove_secrets(&mut command);
        command.envs(self.env.iter().map(|(k, v)| (k, v))).env("PROMPTGEN_TREE", output_root);
        if let Some(PrepareCommand(prepare)) = &self.prepare {
            prepare(&mut command, output_root).map_err(|detail| CheckError { check: self.name(), detail })?;
        }
        let output = command.output().map_err(|e| CheckError {
            check: self.name(),
            detail: format!("{e} (is `{}` installed and on PATH?)", self.program),
        })?;
        if output.status.success() {
            return Ok(CheckOutcome::Passed);
        }
        let mut text = String::from_utf8_lossy(&output.stderr).into_owned();
        text.push_str(&String::from_utf8_lossy(&output.stdout));
        // The model knows the tree's files by their paths in it: `x.rs`, never `/tmp/.../x.rs`.
        let root = output_root.display().to_string();
        let text = text.replace(&format!("{root}/"), "").replace(&root, ".");
        let text = trim_diagnostics(&format!("{} exited with {}\n{text}", self.name(), output.status));
        Ok(CheckOutcome::Failed(Diagnostics::text(text)))
    }
}

/// Removes from `command`'s environment every variable whose name says it may hold a secret
/// (`*_API_KEY`, `*_TOKEN`, `*_SECRET*`, `*_PASSWORD`, `*CREDENTIAL*`, `*_ACCESS_KEY*`,
/// `*_PRIVATE_KEY`, and everything `AWS_*`), as it is set in this process. A check's output
/// goes back to the model, and through it to the model's server: model-written code that a
/// check compiles or runs must not be able to print a secret into it.
pub fn remove_secrets(command: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        if let Some(name) = name.to_str()
            && may_hold_a_secret(name)
        {
            command.env_remove(name);
        }
    }
    command
}

/// Whether an environment variable's name says it may hold a secret.
pub fn may_hold_a_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    upper.starts_with("AWS_")
        || ["API_KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "ACCESS_KEY", "PRIVATE_KEY"]
            .iter()
            .any(|word| upper.contains(word))
}

/// Cuts diagnostics to [`MAX_DIAGNOSTICS_BYTES`] on a line boundary, saying how much was left out.
pub fn trim_diagnostics(text: &str) -> String {
    let text = text.trim();
    if text.len() <= MAX_DIAGNOSTICS_BYTES {
        return text.to_string();
    }
    let mut kept = 0;
    for line in text.split_inclusive('\n') {
        if kept + line.len() > MAX_DIAGNOSTICS_BYTES {
            break;
        }
        kept += line.len();
    }
    let omitted = text[kept..].lines().count();
    format!("{}\n... ({omitted} more lines left out: fix the errors above first)", text[..kept].trim_end())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_may_hold_secrets_are_recognised() {
        for name in [
            "OPENAI_API_KEY",
            "GITHUB_TOKEN",
            "CARGO_REGISTRY_TOKEN",
            "AWS_REGION",
            "DB_PASSWORD",
            "MY_SECRET_X",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "aws_access_key_id",
            "SSH_PRIVATE_KEY",
        ] {
            assert!(may_hold_a_secret(name), "{name}");
        }
        for name in ["PATH", "HOME", "CARGO_HOME", "RUSTUP_TOOLCHAIN", "OLLAMA_HOST", "LANG"] {
            assert!(!may_hold_a_secret(name), "{name}");
        }
    }

    #[test]
    fn long_diagnostics_are_cut_on_a_line_and_say_so() {
        let text: String = (0..2000).map(|i| format!("error[E0308]: line {i}\n")).collect();
        let trimmed = trim_diagnostics(&text);
        assert!(trimmed.len() <= MAX_DIAGNOSTICS_BYTES + 80, "{}", trimmed.len());
        assert!(trimmed.starts_with("error[E0308]: line 0\n"));
        assert!(trimmed.ends_with("more lines left out: fix the errors above first)"), "{trimmed}");
        assert_eq!(trim_diagnostics("  short \n"), "short");
    }

    #[test]
    fn a_command_check_passes_on_success_and_reports_output_on_failure() {
        let dir = tempfile::tempdir().unwrap();
        let mut pass = CommandCheck::new(&["true".into()], dir.path()).unwrap();
        assert_eq!(pass.run(dir.path()).unwrap(), CheckOutcome::Passed);
        let script = vec!["sh".into(), "-c".into(), "echo \"bad in $PROMPTGEN_TREE/x.rs\" >&2; exit 3".into()];
        let mut fail = CommandCheck::new(&script, dir.path()).unwrap();
        match fail.run(dir.path()).unwrap() {
            CheckOutcome::Failed(Diagnostics { text, findings }) => {
                assert!(findings.is_empty(), "a command's output is free text: {findings:?}");
                // The path the model knows (the sandbox refuses `/x.rs` as absolute).
                assert!(text.contains("exit status: 3") && text.contains("bad in x.rs"), "{text}");
                assert!(!text.contains("bad in /x.rs") && !text.contains(&dir.path().display().to_string()), "{text}");
            }
            other => panic!("{other:?}"),
        }
        let mut missing = CommandCheck::new(&["no-such-program-promptgen".into()], dir.path()).unwrap();
        let err = missing.run(dir.path()).unwrap_err();
        assert!(err.to_string().contains("is `no-such-program-promptgen` installed"), "{err}");
    }
}
