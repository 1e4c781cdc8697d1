//! Which check a step gets, and what it needs besides the step: where it may keep things,
//! and the rest of the chain as it stands.

use std::path::{Path, PathBuf};
use std::process::Command;

use codegen_core::Cancel;
use codegen_core::check::{Check, CheckError, CheckOutcome, CommandCheck, Diagnostics};

use crate::check::confine;
use crate::check::crate_check::{CrateCheck, Later};
use crate::check::process::cargo_program;
use crate::check::redact::Redactor;
use crate::check::rustc::RustcCheck;
use crate::config::{Chain, CheckSpec, StepConfig};
use crate::files::Files;
use crate::mount::TREE_PACKAGE_VAR;
use crate::record::layout::Layout;

/// What a step's check needs besides the step: where it may keep things, and the rest of
/// the chain as it stands.
pub struct CheckSetup<'a> {
    /// The chain.
    pub chain: &'a Chain,
    /// Its package's folders.
    pub layout: &'a Layout,
    /// The flag that stops a crate check under way (Ctrl-C): the check is killed, with every
    /// process it started, and fails, which ends the step as interrupted.
    pub cancel: Cancel,
    /// The step to check.
    pub step: &'a StepConfig,
    /// The step's scratch folder (the `rustc` check keeps its crate root there).
    pub scratch: PathBuf,
    /// Where a crate check mounts the candidate tree (with `mounted` beneath it):
    /// `Layout::check_tree_dir` of the step, or one of `eval`'s per worker.
    pub tree_dir: PathBuf,
    /// The recorded files of the chain's other steps (neither this step nor one it runs after),
    /// mounted beneath the candidate tree.
    pub mounted: Files,
    /// What those other steps own.
    pub later: Later,
}

/// The crate's own files and folders a model may read (read-only) when its step is checked in
/// the crate: the check's messages point into them.
pub const CRATE_FILES_THE_MODEL_READS: [&str; 6] = ["src", "tests", "examples", "benches", "build.rs", "Cargo.toml"];

/// The check `setup.step` declares, ready to run; `None` for `check = "none"`.
pub fn check_for(setup: CheckSetup<'_>) -> Option<Box<dyn Check>> {
    let CheckSetup { chain, layout, step, scratch, tree_dir, mounted, later, cancel } = setup;
    let redactor = Redactor::for_package(&chain.package_dir, chain.workspace_root.as_deref());
    match &step.check {
        CheckSpec::None => None,
        CheckSpec::Rustc => Some(Box::new(RustcCheck::new(&chain.edition, scratch, redactor))),
        CheckSpec::CargoCheck | CheckSpec::CargoTest => Some(Box::new(CrateCheck {
            readable: CRATE_FILES_THE_MODEL_READS
                .iter()
                .map(|name| name.to_string())
                .chain(step.inputs.iter().filter_map(|input| {
                    input
                        .real_path
                        .strip_prefix(&chain.package_dir)
                        .ok()
                        .map(|p| p.to_string_lossy().replace('\\', "/"))
                }))
                .collect(),
            redactor,
            test: step.check == CheckSpec::CargoTest,
            cargo: cargo_program(),
            manifest: chain.manifest_path.clone(),
            package: chain.package_name.clone(),
            package_dir: chain.package_dir.clone(),
            relative_to: chain.workspace_root.clone().unwrap_or_else(|| chain.package_dir.clone()),
            target_dir: layout.check_target_dir(),
            tree_dir,
            mounted,
            later,
            cancel,
        })),
        CheckSpec::Command(words) => CommandCheck::new(words, &chain.package_dir).map(|check| {
            let inner = check
                .env("CARGO_TARGET_DIR", layout.check_target_dir().display().to_string())
                .env(TREE_PACKAGE_VAR, chain.package_dir.display().to_string())
                // Confinement (issue 13): see `confine.rs`.
                .prepare(command_confinement(chain, layout));
            Box::new(FilteredCommand { inner, redactor }) as Box<dyn Check>
        }),
    }
}

// Confinement (issue 13): what a command check's `prepare` does; see `confine.rs`.
fn command_confinement(
    chain: &Chain,
    layout: &Layout,
) -> impl Fn(&mut Command, &Path) -> Result<(), String> + Send + Sync + 'static {
    let (manifest, package_dir) = (chain.manifest_path.clone(), chain.package_dir.clone());
    let (package, target_dir) = (chain.package_name.clone(), layout.check_target_dir());
    move |command: &mut Command, tree: &Path| {
        let check = confine::PackageCheck {
            cargo: &cargo_program(),
            manifest: &manifest,
            package_dir: &package_dir,
            package: &package,
            target_dir: &target_dir,
            tree,
        };
        confine::package_check(command, &check)
    }
}

/// A command check whose output, free text, is filtered before the model sees it: lines that
/// quote a file the model may not read are dropped and known secrets withheld.
struct FilteredCommand {
    inner: CommandCheck,
    redactor: Redactor,
}

impl Check for FilteredCommand {
    fn name(&self) -> String {
        self.inner.name()
    }

    fn run(&mut self, output_root: &Path) -> Result<CheckOutcome, CheckError> {
        Ok(match self.inner.run(output_root)? {
            CheckOutcome::Failed(diagnostics) => CheckOutcome::Failed(Diagnostics {
                text: self.redactor.filter_command_output(&diagnostics.text, output_root),
                ..diagnostics
            }),
            other => other,
        })
    }
}
