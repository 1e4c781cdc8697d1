//! The checks a step's files must pass before it may finish, run where the files will live.
//!
//! - `cargo check` / `cargo test` ([`CrateCheck`], the default for Rust outputs): the package
//!   itself is checked (or tested) with the step's candidate tree mounted where the build
//!   entry mounts the recorded one, so generated code is checked against the crate's
//!   dependencies and its own items, and hand-written code and tests against the generated
//!   code. How: Cargo runs in a target folder of its own, `<target>/promptgen/check-target`
//!   (kept between runs and shared by the packages, so dependencies compile once per machine
//!   and re-checks are incremental), with `PROMPTGEN_TREE` naming the
//!   candidate tree and `PROMPTGEN_TREE_PACKAGE` the package; the package's build entry sees
//!   them and mounts that tree instead of the recorded one, without reading the lock, taking
//!   the process lock or calling a model (see `build_script.rs`). So a check never recurses
//!   and never waits on the lock its caller holds, also when the caller is itself a build
//!   script regenerating online. Every target is type-checked first (`cargo check
//!   --all-targets --keep-going`), and `cargo test` runs only once that passes: Cargo stops
//!   starting targets at the first that fails unless it keeps going, which `cargo test`
//!   cannot, so the errors a check reports (and what it puts off, which transcripts record)
//!   would otherwise depend on which target Cargo happened to start first.
//! - `rustc` ([`RustcCheck`]): the generated tree alone, type-checked; fast, and blind to the
//!   crate.
//! - a command: runs in the package folder with the same variables.
//!
//! # What a check sees of the rest of the chain
//!
//! A step's candidate tree holds the files of its *dependencies* (the steps it runs after,
//! transitively; see [`crate::graph`]) as they stand in this run, and the step's own. The
//! crate compiles every step's files, so a crate check also mounts, beneath the candidate,
//! the recorded files of the chain's *other* steps: every step that is neither the step nor
//! one of its dependencies, that is its dependents and the steps independent of it
//! (`generate::the_rest_of_the_chain`). They are taken as recorded *before* the run began,
//! not as steps finish during it, so what a check sees does not depend on which independent
//! steps happened to finish first. Errors that only concern what those other steps own (their
//! files, or a module that one of them declares and none has written yet) are put off rather
//! than blamed on this step ([`Later`]); in a chain without `after`, the other steps are the
//! steps after it in id order, as before.
//!
//! A check that could only run in part is run again on the whole tree once every step is done
//! (`generate::check_in_full`). So is every check of the run when no single step that ran has
//! all the other steps that ran among its dependencies (two independent steps, say): no check
//! then saw the whole tree as it ends. In a line, the last step that ran always has.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use codegen_core::Cancel;
use codegen_core::check::{Check, CheckError, CheckOutcome, CommandCheck, remove_secrets, trim_diagnostics};

use crate::check::diagnostics::{self, Diagnostic, PathMap, Place};
use crate::check::redact::Redactor;
use crate::config::{Chain, CheckSpec, StepConfig};
use crate::files::sync_dir;
use crate::mount::module_tree;
use crate::record::layout::Layout;
use crate::record::store::{Files, walk_files};

use crate::mount::{TREE_PACKAGE_VAR, TREE_VAR};

/// How long a crate check may run (compiling the dependencies the first time included)
/// before it is stopped: a test that loops forever must not hang the run.
const CHECK_TIMEOUT: Duration = Duration::from_secs(900);

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
        crate::check::confine::rustc_check(&mut command, output_root, &self.scratch).map_err(error)?;
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
        let mut text: Vec<String> = Vec::new();
        for line in String::from_utf8_lossy(&output.stderr).lines() {
            let Ok(diagnostic) = serde_json::from_str::<Diagnostic>(line) else { continue };
            if diagnostic.level.starts_with("error") && !diagnostic.spans.is_empty() {
                let rendered = diagnostics::render(&diagnostic, &map);
                if !text.contains(&rendered) {
                    text.push(rendered);
                }
            }
        }
        if text.is_empty() {
            return Err(error(format!(
                "rustc failed without a diagnostic the model could use:\n{}",
                self.redactor.filter_command_output(&tail(&String::from_utf8_lossy(&output.stderr), 20), output_root)
            )));
        }
        Ok(CheckOutcome::Failed(trim_diagnostics(&self.redactor.withhold(&text.join("\n")))))
    }
}

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
        let check = crate::check::confine::PackageCheck {
            cargo: &cargo_program(),
            manifest: &manifest,
            package_dir: &package_dir,
            package: &package,
            target_dir: &target_dir,
            tree,
        };
        crate::check::confine::package_check(command, &check)
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
            CheckOutcome::Failed(text) => CheckOutcome::Failed(self.redactor.filter_command_output(&text, output_root)),
            other => other,
        })
    }
}

/// The `cargo` that runs us (`CARGO`, which Cargo sets for subcommands and build scripts),
/// else `cargo` on `PATH`.
pub(crate) fn cargo_program() -> PathBuf {
    std::env::var_os("CARGO").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("cargo"))
}

/// `cargo check --all-targets` or `cargo test` of the package, with a step's candidate tree
/// mounted (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct CrateCheck {
    test: bool,
    cargo: PathBuf,
    manifest: PathBuf,
    package: String,
    package_dir: PathBuf,
    relative_to: PathBuf,
    target_dir: PathBuf,
    tree_dir: PathBuf,
    mounted: Files,
    later: Later,
    /// The package paths the model may read.
    readable: Vec<String>,
    redactor: Redactor,
    cancel: Cancel,
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
            let bytes =
                codegen_core::__private::fs::read(&output_root.join(&path)).map_err(|e| error(e.to_string()))?;
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
            let confined = crate::check::confine::PackageCheck {
                cargo: &self.cargo,
                manifest: &self.manifest,
                package_dir: &self.package_dir,
                package: &self.package,
                target_dir: &self.target_dir,
                tree: &self.tree_dir,
            };
            crate::check::confine::package_check(&mut command, &confined).map_err(error)?;
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
            generated_root: output.out_dir.as_ref().map(|dir| dir.join(crate::mount::OUT_SUBDIR)),
            package_dir: self.package_dir.clone(),
            relative_to: self.relative_to.clone(),
            readable: self.readable.clone(),
        };
        if ran.interrupted {
            return Err(error("it was stopped: the run was interrupted".into()));
        }
        if ran.timed_out {
            return Ok(CheckOutcome::Failed(format!(
                "`{}` did not finish within {} s and was stopped: a test that waits or loops forever must end.",
                self.name(),
                CHECK_TIMEOUT.as_secs()
            )));
        }
        if ran.success {
            return Ok(CheckOutcome::Passed);
        }
        let (put_off, blamed): (Vec<&Diagnostic>, Vec<&Diagnostic>) =
            output.errors.iter().partition(|d| self.later.owner(d, &map).is_some());
        if !blamed.is_empty() {
            // With several targets (the library, its tests, a binary) one error comes once per
            // target that compiles the file: show it once.
            let mut text: Vec<String> = blamed.iter().map(|d| diagnostics::render(d, &map)).collect();
            let mut seen = std::collections::HashSet::new();
            text.retain(|t| seen.insert(t.clone()));
            return Ok(CheckOutcome::Failed(trim_diagnostics(&self.redactor.withhold(&text.join("\n")))));
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
            return Ok(CheckOutcome::Failed(trim_diagnostics(&text)));
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

/// `cargo`, with an environment fit for a nested build: no secrets (a check's output goes
/// back to the model), and none of the variables Cargo sets for the build script that may
/// be running us (they describe that build, and would confuse this one).
pub(crate) fn cargo_command(cargo: &Path) -> Command {
    let mut command = Command::new(cargo);
    remove_secrets(&mut command);
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        let build_script_var =
            ["OUT_DIR", "TARGET", "HOST", "NUM_JOBS", "OPT_LEVEL", "DEBUG", "PROFILE", "MAKEFLAGS", "MFLAGS"]
                .contains(&name)
                || [
                    "CARGO_MANIFEST_",
                    "CARGO_PKG_",
                    "CARGO_CFG_",
                    "CARGO_FEATURE_",
                    "CARGO_CRATE_",
                    "CARGO_BIN_",
                    "CARGO_PRIMARY_PACKAGE",
                ]
                .iter()
                .any(|prefix| name.starts_with(prefix))
                || [
                    "CARGO_ENCODED_RUSTFLAGS",
                    "CARGO_MAKEFLAGS",
                    "CARGO_TARGET_DIR",
                    "CARGO_TARGET_TMPDIR",
                    "CARGO_RUSTC_CURRENT_DIR",
                    TREE_VAR,
                    TREE_PACKAGE_VAR,
                ]
                .contains(&name);
        if build_script_var {
            command.env_remove(name);
        }
    }
    command
}

/// What a command did.
struct Ran {
    success: bool,
    timed_out: bool,
    interrupted: bool,
    stdout: String,
    stderr: String,
}

/// Runs `command` to its end, or kills it after `timeout` or once `cancel` is set. On Unix it
/// runs in a process group of its own, and the whole group is killed: killing `cargo` alone
/// would leave the `rustc` or test binary it started running.
fn run_with_timeout(command: &mut Command, timeout: Duration, cancel: &Cancel) -> std::io::Result<Ran> {
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(command, 0);
    let mut child = command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let collect = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let stdout = collect(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = collect(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let deadline = Instant::now() + timeout;
    let (status, timed_out, interrupted) = loop {
        if let Some(status) = child.try_wait()? {
            break (Some(status), false, false);
        }
        let (timed_out, interrupted) = (Instant::now() >= deadline, cancel.is_cancelled());
        if timed_out || interrupted {
            kill_group(&mut child);
            let _ = child.wait();
            break (None, timed_out, interrupted);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(Ran {
        success: status.is_some_and(|s| s.success()),
        timed_out,
        interrupted,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// Kills `child` and, on Unix, every process of its group (see [`run_with_timeout`]).
fn kill_group(child: &mut std::process::Child) {
    #[cfg(unix)]
    if let Ok(group) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) with a negative pid signals that process group; it touches no memory.
        unsafe {
            libc::kill(-group, libc::SIGKILL);
        }
    }
    let _ = child.kill();
}

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
