//! The compile check: a step is not done until the generated tree type-checks, mounted
//! exactly as the crate mounts it.

use std::path::{Path, PathBuf};
use std::process::Command;

use codegen_core::check::{trim_diagnostics, Check, CheckError, CheckOutcome, CommandCheck};

use crate::mount::module_tree;
use crate::config::{Chain, CheckSpec, StepConfig};
use crate::store::{walk_files, Files};

/// Type-checks a generated tree with `rustc --emit=metadata`: a scratch crate root mounts
/// every `.rs` file through `mount::module_tree` inside `mod generated`, as a crate does, so
/// `super::` paths resolve the same. Nothing is linked or run, and the crate's own files are
/// not part of it: code that uses the crate's other items needs a command check instead.
#[derive(Debug, Clone)]
pub struct RustcCheck {
    rustc: PathBuf,
    edition: String,
    scratch: PathBuf,
}

impl RustcCheck {
    /// A check with the `rustc` Cargo uses (`RUSTC`, as Cargo sets it in build scripts), else
    /// `rustc` on `PATH`, for `edition`, keeping its scratch crate in `scratch`.
    pub fn new(edition: &str, scratch: impl Into<PathBuf>) -> RustcCheck {
        let rustc = std::env::var_os("RUSTC").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("rustc"));
        RustcCheck { rustc, edition: edition.to_string(), scratch: scratch.into() }
    }
}

impl Check for RustcCheck {
    fn name(&self) -> String {
        "rustc".into()
    }

    fn run(&mut self, output_root: &Path) -> Result<CheckOutcome, CheckError> {
        let error = |detail: String| CheckError { check: self.name(), detail };
        let tree: Files = walk_files(output_root).into_iter().map(|path| (path, Vec::new())).collect();
        let modules = module_tree(tree.keys(), &|file| format!("{:?}", output_root.join(file).display().to_string()));
        let root = format!("#![allow(dead_code, unused)]\nmod generated {{\n{modules}}}\n");
        std::fs::create_dir_all(&self.scratch).map_err(|e| error(format!("cannot create {}: {e}", self.scratch.display())))?;
        let root_file = self.scratch.join("promptgen_check.rs");
        std::fs::write(&root_file, root).map_err(|e| error(format!("cannot write {}: {e}", root_file.display())))?;
        let output = Command::new(&self.rustc)
            .args(["--crate-type", "lib", "--crate-name", "promptgen_check", "--emit=metadata"])
            .arg(format!("--edition={}", self.edition))
            .args(["--color=never", "-A", "warnings", "--out-dir"])
            .arg(&self.scratch)
            .arg(&root_file)
            .output()
            .map_err(|e| error(format!("could not start `{}`: {e}; set RUSTC or put rustc on PATH", self.rustc.display())))?;
        if output.status.success() {
            return Ok(CheckOutcome::Passed);
        }
        // Show the model its own paths: `view.rs`, not the scratch folder.
        let prefix = format!("{}/", output_root.display());
        let text = String::from_utf8_lossy(&output.stderr).replace(&prefix, "");
        let text = text.replace(&format!("{}", root_file.display()), "(crate root)");
        Ok(CheckOutcome::Failed(trim_diagnostics(&without_trailer(&text))))
    }
}

/// rustc's diagnostics without the lines that end every failed run and tell a model nothing
/// it can act on (`error: aborting due to ...`, `For more information about this error, try
/// rustc --explain ...`, `Some errors have detailed explanations: ...`): every later call of
/// the step would carry them again.
fn without_trailer(text: &str) -> String {
    let noise = |line: &str| {
        line.starts_with("error: aborting due to ")
            || line.starts_with("For more information about ")
            || line.starts_with("Some errors have detailed explanations")
    };
    let kept: Vec<&str> = text.lines().filter(|line| !noise(line)).collect();
    kept.join("\n").trim_end().to_string()
}

/// The check `step` declares, ready to run; `None` for `check = "none"`.
pub fn check_for(chain: &Chain, step: &StepConfig, scratch: &Path) -> Option<Box<dyn Check>> {
    match &step.check {
        CheckSpec::None => None,
        CheckSpec::Rustc => Some(Box::new(RustcCheck::new(&chain.edition, scratch))),
        CheckSpec::Command(words) => CommandCheck::new(words, &chain.package_dir).map(|c| Box::new(c) as Box<dyn Check>),
    }
}

#[cfg(test)]
mod tests {
    use super::without_trailer;

    #[test]
    fn the_trailer_of_rustc_goes_and_the_diagnostics_stay() {
        let text = "error[E0308]: mismatched types\n  --> presenter.rs:28:9\n   |\nhelp: try using a conversion method\n\n\
                    error: aborting due to 1 previous error\n\nFor more information about this error, try `rustc --explain E0308`.\n";
        assert_eq!(
            without_trailer(text),
            "error[E0308]: mismatched types\n  --> presenter.rs:28:9\n   |\nhelp: try using a conversion method"
        );
        let many = "error[E0425]: x\n\nerror: aborting due to 2 previous errors\n\nSome errors have detailed explanations: E0308, E0425.\nFor more information about an error, try `rustc --explain E0308`.\n";
        assert_eq!(without_trailer(many), "error[E0425]: x");
    }
}
