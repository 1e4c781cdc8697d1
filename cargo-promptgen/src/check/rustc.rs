//! The `rustc` check: the generated tree alone, type-checked.

use std::path::{Path, PathBuf};
use std::process::Command;

use codegen_core::check::{Check, CheckError, CheckOutcome, remove_secrets};

use crate::check::confine;
use crate::check::diagnostics::{self, Diagnostic, PathMap};
use crate::check::process::tail;
use crate::check::redact::Redactor;
use crate::files::{Files, walk_files};
use crate::mount::module_tree;

/// Type-checks a generated tree with `rustc --emit=metadata`: a scratch crate root mounts
/// every `.rs` file through `mount::module_tree` inside `mod generated`, as a crate does, so
/// `super::` paths resolve the same. Nothing is linked or run, and the crate's own files are
/// not part of it: code that uses the crate's other items needs a command check instead.
#[derive(Debug, Clone)]
pub struct RustcCheck {
    rustc: PathBuf,
    edition: String,
    scratch: PathBuf,
    redactor: Redactor,
}

impl RustcCheck {
    /// A check with the `rustc` Cargo uses (`RUSTC`, as Cargo sets it in build scripts), else
    /// `rustc` on `PATH`, for `edition`, keeping its scratch crate in `scratch`.
    pub fn new(edition: &str, scratch: impl Into<PathBuf>, redactor: Redactor) -> RustcCheck {
        let rustc = std::env::var_os("RUSTC").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("rustc"));
        RustcCheck { rustc, edition: edition.to_string(), scratch: scratch.into(), redactor }
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
        std::fs::create_dir_all(&self.scratch)
            .map_err(|e| error(format!("cannot create {}: {e}", self.scratch.display())))?;
        let root_file = self.scratch.join("promptgen_check.rs");
        std::fs::write(&root_file, root).map_err(|e| error(format!("cannot write {}: {e}", root_file.display())))?;
        let mut command = Command::new(&self.rustc);
        remove_secrets(&mut command);
        command
            .args(["--crate-type", "lib", "--crate-name", "promptgen_check", "--emit=metadata"])
            .arg(format!("--edition={}", self.edition))
            .args(["--error-format=json", "--color=never", "-A", "warnings", "--out-dir"])
            .arg(&self.scratch)
            .arg(&root_file)
            .current_dir(&self.scratch);
        // Confinement (issue 13): see `confine.rs`.
        confine::rustc_check(&mut command, output_root, &self.scratch).map_err(error)?;
        let output = command.output().map_err(|e| {
            error(format!("could not start `{}`: {e}; set RUSTC or put rustc on PATH", self.rustc.display()))
        })?;
        if output.status.success() {
            return Ok(CheckOutcome::Passed);
        }
        // rustc writes one JSON diagnostic per line on stderr; the generated tree is the only
        // thing the model may read here.
        let map = PathMap {
            generated_root: Some(output_root.to_path_buf()),
            package_dir: self.scratch.clone(),
            relative_to: self.scratch.clone(),
            readable: Vec::new(),
        };
        let errors: Vec<Diagnostic> = String::from_utf8_lossy(&output.stderr)
            .lines()
            .filter_map(|line| serde_json::from_str::<Diagnostic>(line).ok())
            .filter(|diagnostic| diagnostic.level.starts_with("error") && !diagnostic.spans.is_empty())
            .collect();
        if errors.is_empty() {
            return Err(error(format!(
                "rustc failed without a diagnostic the model could use:\n{}",
                self.redactor.filter_command_output(&tail(&String::from_utf8_lossy(&output.stderr), 20), output_root)
            )));
        }
        Ok(CheckOutcome::Failed(diagnostics::compiler_errors(&errors, &map, &self.redactor)))
    }
}
