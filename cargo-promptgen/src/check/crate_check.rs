//! The crate check: `cargo check --all-targets` or `cargo test` of the package, with a step's
//! candidate tree mounted where the build entry mounts the recorded one (see the module
//! documentation of [`crate::check`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use codegen_core::Cancel;
use codegen_core::check::{Check, CheckError, CheckOutcome, Diagnostics, Findings, trim_diagnostics};

use crate::check::confine;
use crate::check::diagnostics::{self, Diagnostic, PathMap, Place};
use crate::check::process::{cargo_command, run_with_timeout, tail};
use crate::check::redact::Redactor;
use crate::files::{Files, sync_dir, walk_files};
use crate::mount::{OUT_SUBDIR, TREE_PACKAGE_VAR, TREE_VAR};

/// How long a crate check may run (compiling the dependencies the first time included)
/// before it is stopped: a test that loops forever must not hang the run.
const CHECK_TIMEOUT: Duration = Duration::from_secs(900);

/// What the chain's other steps own (the steps that are neither the one being checked nor
/// among the steps it runs after): errors that concern only these are put off, not blamed on
/// the step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Later {
    /// Generated files by path, with the step that writes them.
    pub files: BTreeMap<String, String>,
    /// Modules no step has written yet (the last part of their path, as code names them),
    /// with the step that declares them.
    pub missing_modules: BTreeMap<String, String>,
}

impl Later {
    /// The step to which `diagnostic` belongs instead of the step being checked, if any: its
    /// primary span is in another step's file, or it is a name-resolution error about a
    /// module another step will write.
    fn owner(&self, diagnostic: &Diagnostic, map: &PathMap) -> Option<&str> {
        for span in diagnostic.spans.iter().filter(|s| s.is_primary) {
            if let Place::Generated(path) = map.place(&span.file_name)
                && let Some(step) = self.files.get(&path)
            {
                return Some(step);
            }
        }
        const RESOLUTION: &[&str] = &["E0412", "E0422", "E0423", "E0425", "E0432", "E0433", "E0531", "E0405"];
        let code = diagnostic.code.as_ref().map(|c| c.code.as_str()).unwrap_or_default();
        if !RESOLUTION.contains(&code) {
            return None;
        }
        backticked(&diagnostic.message)
            .flat_map(|quoted| quoted.split("::"))
            .find_map(|name| self.missing_modules.get(name).map(String::as_str))
    }
}

/// The `quoted` parts of a compiler message.
fn backticked(message: &str) -> impl Iterator<Item = &str> {
    message.split('`').skip(1).step_by(2)
}

/// `cargo check --all-targets` or `cargo test` of the package, with a step's candidate tree
/// mounted (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct CrateCheck {
    pub(super) test: bool,
    pub(super) cargo: PathBuf,
    pub(super) manifest: PathBuf,
    pub(super) package: String,
    pub(super) package_dir: PathBuf,
    pub(super) relative_to: PathBuf,
    pub(super) target_dir: PathBuf,
    pub(super) tree_dir: PathBuf,
    pub(super) mounted: Files,
    pub(super) later: Later,
    /// The package paths the model may read.
    pub(super) readable: Vec<String>,
    pub(super) redactor: Redactor,
    pub(super) cancel: Cancel,
}

impl Check for CrateCheck {
    fn name(&self) -> String {
        if self.test { "cargo test".into() } else { "cargo check".into() }
    }

    fn run(&mut self, output_root: &Path) -> Result<CheckOutcome, CheckError> {
        let error = |detail: String| CheckError { check: self.name(), detail };
        // The tree the crate sees: the other steps as recorded, this step's candidate over them.
        let mut tree = self.mounted.clone();
        for path in walk_files(output_root) {
            let bytes = codegen_core::fs::read(&output_root.join(&path)).map_err(|e| error(e.to_string()))?;
            tree.insert(path, bytes);
        }
        sync_dir(&self.tree_dir, &tree).map_err(|e| error(crate::error::report(&e)))?;

        // Every target is type-checked first, `--keep-going`: without it Cargo stops starting
        // targets at the first that fails, so which errors come back (the binary's, its unit
        // tests', both) would depend on scheduling, and so would what is put off and recorded.
        // `cargo test` cannot keep going, so it runs only once the crate compiles.
        let cargo = |verb: &[&str]| {
            let mut command = cargo_command(&self.cargo);
            command
                .args(verb)
                .args(["--message-format=json", "--color=never", "-p", &self.package, "--manifest-path"])
                .arg(&self.manifest)
                .current_dir(&self.package_dir)
                .env("CARGO_TARGET_DIR", &self.target_dir)
                .env(TREE_VAR, &self.tree_dir)
                .env(TREE_PACKAGE_VAR, &self.package_dir)
                .env("RUST_BACKTRACE", "0");
            // Confinement (issue 13): see `confine.rs`.
            let confined = confine::PackageCheck {
                cargo: &self.cargo,
                manifest: &self.manifest,
                package_dir: &self.package_dir,
                package: &self.package,
                target_dir: &self.target_dir,
                tree: &self.tree_dir,
            };
            confine::package_check(&mut command, &confined).map_err(error)?;
            run_with_timeout(&mut command, CHECK_TIMEOUT, &self.cancel).map_err(|e| {
                error(format!("could not start `{}`: {e}; set CARGO or put cargo on PATH", self.cargo.display()))
            })
        };
        let mut ran = cargo(&["check", "--all-targets", "--keep-going"])?;
        if self.test && ran.success && !ran.timed_out && !ran.interrupted {
            ran = cargo(&["test", "--no-fail-fast"])?;
        }
        let output = diagnostics::read_cargo_output(&ran.stdout, &self.package_dir);
        let map = PathMap {
            generated_root: output.out_dir.as_ref().map(|dir| dir.join(OUT_SUBDIR)),
            package_dir: self.package_dir.clone(),
            relative_to: self.relative_to.clone(),
            readable: self.readable.clone(),
        };
        if ran.interrupted {
            return Err(error("it was stopped: the run was interrupted".into()));
        }
        if ran.timed_out {
            return Ok(CheckOutcome::Failed(Diagnostics::text(format!(
                "`{}` did not finish within {} s and was stopped: a test that waits or loops forever must end.",
                self.name(),
                CHECK_TIMEOUT.as_secs()
            ))));
        }
        if ran.success {
            return Ok(CheckOutcome::Passed);
        }
        let (put_off, blamed): (Vec<&Diagnostic>, Vec<&Diagnostic>) =
            output.errors.iter().partition(|d| self.later.owner(d, &map).is_some());
        if !blamed.is_empty() {
            return Ok(CheckOutcome::Failed(diagnostics::compiler_errors(blamed, &map, &self.redactor)));
        }
        if !put_off.is_empty() {
            let mut owners: Vec<&str> = put_off.iter().filter_map(|d| self.later.owner(d, &map)).collect();
            owners.sort_unstable();
            owners.dedup();
            let what = if self.test { "the crate does not compile yet, so its tests were not run" } else { "" };
            return Ok(CheckOutcome::PutOff(format!(
                "{} error{} concern{} what step{} {} will write{}{what}",
                put_off.len(),
                if put_off.len() == 1 { "" } else { "s" },
                if put_off.len() == 1 { "s" } else { "" },
                if owners.len() == 1 { "" } else { "s" },
                owners.join(", "),
                if what.is_empty() { "" } else { "; " },
            )));
        }
        let failed = diagnostics::failed_tests(&output.other_lines);
        if !failed.is_empty() {
            let mut text = format!("{} test{} failed:\n", failed.len(), if failed.len() == 1 { "" } else { "s" });
            for test in &failed {
                let output = self.redactor.filter_command_output(&map.relativize(&test.output), &self.tree_dir);
                text.push_str(&format!("\ntest `{}`:\n{output}\n", test.name));
            }
            let failed_tests = failed.into_iter().map(|test| test.name).collect();
            let findings = Findings { errors: Vec::new(), failed_tests };
            return Ok(CheckOutcome::Failed(Diagnostics { text: trim_diagnostics(&text), findings }));
        }
        // Failed without an error or a test to show: Cargo's own words (a manifest error, a
        // build script that failed, a dependency that cannot be fetched) are the user's
        // problem, not the model's.
        Err(error(format!(
            "it failed without a compiler error or a failing test; Cargo said:\n{}",
            self.redactor.filter_command_output(&map.relativize(&tail(&ran.stderr, 30)), &self.tree_dir)
        )))
    }
}
