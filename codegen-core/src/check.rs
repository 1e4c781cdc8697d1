//! Checks a step's output must pass before the step may finish: a compiler, a linter, a
//! test command. When a check fails, the loop sends its diagnostics back to the model and
//! lets it fix the files, the way a programmer fixes their own build.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A check of the files under a step's output root.
pub trait Check {
    /// A short name for messages, e.g. `rustc`.
    fn name(&self) -> String;
    /// Checks the tree at `output_root`.
    fn run(&mut self, output_root: &Path) -> Result<CheckOutcome, CheckError>;
}

/// What a check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckOutcome {
    /// The tree passes.
    Passed,
    /// The tree fails; the diagnostics, trimmed to what a model needs, say why.
    Failed(String),
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
/// The command runs in `dir`, with `PROMPTGEN_TREE` set to the output root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandCheck {
    program: String,
    args: Vec<String>,
    dir: PathBuf,
}

impl CommandCheck {
    /// `command[0]` with the other items as arguments, run in `dir`.
    pub fn new(command: &[String], dir: impl Into<PathBuf>) -> Option<CommandCheck> {
        let (program, args) = command.split_first()?;
        Some(CommandCheck { program: program.clone(), args: args.to_vec(), dir: dir.into() })
    }
}

impl Check for CommandCheck {
    fn name(&self) -> String {
        std::iter::once(&self.program).chain(&self.args).cloned().collect::<Vec<_>>().join(" ")
    }

    fn run(&mut self, output_root: &Path) -> Result<CheckOutcome, CheckError> {
        let output = Command::new(&self.program)
            .args(&self.args)
            .current_dir(&self.dir)
            .env("PROMPTGEN_TREE", output_root)
            .output()
            .map_err(|e| CheckError { check: self.name(), detail: format!("{e} (is `{}` installed and on PATH?)", self.program) })?;
        if output.status.success() {
            return Ok(CheckOutcome::Passed);
        }
        let mut text = String::from_utf8_lossy(&output.stderr).into_owned();
        text.push_str(&String::from_utf8_lossy(&output.stdout));
        let text = text.replace(&output_root.display().to_string(), "");
        Ok(CheckOutcome::Failed(trim_diagnostics(&format!("{} exited with {}\n{text}", self.name(), output.status))))
    }
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
            CheckOutcome::Failed(text) => {
                assert!(text.contains("exit status: 3") && text.contains("bad in /x.rs"), "{text}");
            }
            other => panic!("{other:?}"),
        }
        let mut missing = CommandCheck::new(&["no-such-program-promptgen".into()], dir.path()).unwrap();
        let err = missing.run(dir.path()).unwrap_err();
        assert!(err.to_string().contains("is `no-such-program-promptgen` installed"), "{err}");
    }
}
