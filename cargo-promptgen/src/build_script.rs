//! The build-script entry: materialise the chain's generated tree into `$OUT_DIR/promptgen/`.

use std::path::{Path, PathBuf};

use crate::config::{self, Chain, Overrides, StoreMode};
use crate::error::{Error, MissingFile, StaleStep};
use crate::files::{Files, overlay, read_tree, sync_dir};
use crate::mount::{MODULES_FILE, OUT_SUBDIR, TREE_PACKAGE_VAR, TREE_VAR, module_tree};
use crate::plan::assess::{StepState, plan, stale_steps};
#[cfg(feature = "online")]
use crate::record::commit::Destination;
use crate::record::layout::{Layout, STORE_DIR, target_dir_from_out_dir};
use crate::record::lock::LOCK_FILE;
use crate::record::process_lock::ProcessLock;
use crate::record::records::Records;
#[cfg(feature = "online")]
use crate::run::{progress::Progress, schedule::Schedule};

/// Variables that switch a build to offline mode: any non-empty value but `0` or `false`
/// for `PROMPTGEN_OFFLINE`, any value at all for `CI`.
pub const OFFLINE_VARS: &[&str] = &["PROMPTGEN_OFFLINE", "CI"];

/// Configures and runs the build-script entry. [`build`] is the one-call form.
#[derive(Debug, Clone)]
pub struct Builder {
    manifest_dir: Option<PathBuf>,
    out_dir: Option<PathBuf>,
    target_dir: Option<PathBuf>,
    offline: Option<bool>,
    emit_cargo_directives: bool,
}

impl Default for Builder {
    fn default() -> Builder {
        Builder::new()
    }
}

/// What a build did.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq)]
pub struct BuildReport {
    /// Where the generated tree is.
    pub generated_dir: PathBuf,
    /// Files written this time (unchanged ones are left alone).
    pub files_written: usize,
    /// Steps that ran in this build (their results wait in the pending area).
    pub regenerated: Vec<String>,
    /// Steps whose results come from the pending area.
    pub pending: Vec<String>,
}

impl Builder {
    /// A builder that reads everything from the environment Cargo gives a build script, and
    /// prints the `cargo:` directives (the same as [`Builder::default`]).
    pub fn new() -> Builder {
        Builder { manifest_dir: None, out_dir: None, target_dir: None, offline: None, emit_cargo_directives: true }
    }

    /// The package root (default: `CARGO_MANIFEST_DIR`).
    pub fn manifest_dir(&mut self, dir: impl Into<PathBuf>) -> &mut Builder {
        self.manifest_dir = Some(dir.into());
        self
    }

    /// Where the generated tree goes, under `promptgen/` (default: `OUT_DIR`).
    pub fn out_dir(&mut self, dir: impl Into<PathBuf>) -> &mut Builder {
        self.out_dir = Some(dir.into());
        self
    }

    /// Cargo's target folder, for the pending area and the file lock (default: found from
    /// `OUT_DIR`).
    pub fn target_dir(&mut self, dir: impl Into<PathBuf>) -> &mut Builder {
        self.target_dir = Some(dir.into());
        self
    }

    /// Forbids (or allows) model calls, whatever `PROMPTGEN_OFFLINE` and `CI` say.
    pub fn offline(&mut self, offline: bool) -> &mut Builder {
        self.offline = Some(offline);
        self
    }

    /// Whether to print `cargo:` directives (on by default; off for use outside build scripts).
    pub fn emit_cargo_directives(&mut self, emit: bool) -> &mut Builder {
        self.emit_cargo_directives = emit;
        self
    }

    /// Materialises the generated tree, regenerating stale steps when allowed.
    pub fn run(&self) -> Result<BuildReport, Error> {
        let manifest_dir = match &self.manifest_dir {
            Some(dir) => dir.clone(),
            None => env_path("CARGO_MANIFEST_DIR")?,
        };
        let out_dir = match &self.out_dir {
            Some(dir) => dir.clone(),
            None => env_path("OUT_DIR")?,
        };
        let generated_dir = out_dir.join(OUT_SUBDIR);
        // Under a check of this package (see `check.rs`), mount the step's candidate tree and
        // nothing else: no lock, no process lock (the checking process holds it), no model.
        if let Some(tree) = checked_tree(&manifest_dir) {
            return self.mount_candidate(&tree, &out_dir);
        }
        let chain = config::load_from_env(&manifest_dir.join("Cargo.toml"), &Overrides::default())?;
        if self.emit_cargo_directives {
            emit_rerun_directives(&chain);
        }
        let target_dir = match &self.target_dir {
            Some(dir) => dir.clone(),
            None => target_dir_from_out_dir(&out_dir).unwrap_or_else(|| out_dir.join("promptgen-target")),
        };
        let layout = Layout::new(&chain, &target_dir);
        let _guard = ProcessLock::acquire(&layout)?;

        let mut records = Records::read(&layout)?;
        // A build never writes the package: what a stopped run left there is read through
        // (the lock names it) and left for `cargo promptgen` to finish.
        if self.emit_cargo_directives {
            for path in crate::review::status::leftovers(&layout) {
                println!(
                    "cargo:warning=promptgen: {path} in {} was left by a stopped run; `cargo promptgen -p {}` finishes or removes it",
                    chain.package_name, chain.package_name
                );
            }
        }
        let dependency = dependency_origin(&manifest_dir);
        let ci = self.offline.is_none() && std::env::var_os("CI").is_some();
        if ci || dependency.is_some() {
            // CI builds only from the committed lock: results a build left pending on this
            // machine are not recorded yet, so their steps count as stale.
            records.pending = None;
        }
        let assessed = plan(&chain, &records)?;
        // With `store = "cache"`, files the lock records and this machine lacks are fetched,
        // never made again: regenerating them would change the lock. Online or not.
        let missing: Vec<MissingFile> = assessed.iter().flat_map(|a| a.missing.iter().cloned()).collect();
        if !missing.is_empty() {
            return Err(Error::NotInCache {
                package: chain.package_name.clone(),
                cache_dir: layout.cache()?.dir,
                remote: chain.store.cache_url.as_ref().map(ToString::to_string),
                missing,
            });
        }
        let stale = stale_steps(&assessed);
        let (tree, regenerated, pending) = if stale.is_empty() {
            let pending: Vec<String> =
                assessed.iter().filter(|a| a.state == StepState::Pending).map(|a| a.id.clone()).collect();
            let tree = overlay(&chain.graph, 0..assessed.len(), |i| Some(&assessed[i].files));
            (tree, Vec::new(), pending)
        } else {
            if let Some(origin) = dependency {
                return Err(Error::StaleDependency {
                    package: chain.package_name.clone(),
                    origin: origin.to_string(),
                    manifest_dir,
                    steps: stale,
                });
            }
            if let Some(reason) = self.offline_reason() {
                return Err(Error::Stale { package: chain.package_name.clone(), steps: stale, reason });
            }
            self.regenerate(&chain, &layout, stale)?
        };
        let files_written = mount(&out_dir, &tree)?;
        if self.emit_cargo_directives && !pending.is_empty() {
            let list: Vec<&str> = pending.iter().map(String::as_str).collect();
            let verb = if regenerated.is_empty() { "come from" } else { "were regenerated by this build into" };
            println!(
                "cargo:warning=promptgen: steps {} of {} {verb} the pending area, not the lock; review them with `cargo promptgen diff -p {}` and record them with `cargo promptgen accept -p {}`",
                list.join(", "),
                chain.package_name,
                chain.package_name,
                chain.package_name,
            );
        }
        Ok(BuildReport { generated_dir, files_written, regenerated, pending })
    }

    /// Runs the stale steps into the pending area: the tree, the steps that ran, the steps
    /// whose results come from the pending area.
    #[cfg(feature = "online")]
    fn regenerate(
        &self,
        chain: &Chain,
        layout: &Layout,
        _stale: Vec<StaleStep>,
    ) -> Result<(Files, Vec<String>, Vec<String>), Error> {
        let mut show = |p: Progress| {
            if let Progress::StepStarted { id, .. } = p {
                eprintln!("promptgen: regenerating step {id} of {}", layout.package_name);
            }
        };
        // One step at a time: a build runs inside cargo's own jobs, and its output is read
        // after the fact. A build script is stopped by cargo, not by a flag: nothing ever
        // sets this one.
        let never = codegen_core::Cancel::new();
        let schedule = Schedule {
            chain,
            layout,
            forced: &[],
            only: None,
            destination: Destination::Pending,
            jobs: 1,
            cancel: &never,
        };
        let result = schedule.bring_up_to_date(&mut show)?.into_failure()?;
        let pending = result
            .steps
            .iter()
            .filter(|(_, state)| *state == StepState::Pending)
            .map(|(entry, _)| entry.id.clone())
            .collect();
        Ok((result.tree, result.regenerated, pending))
    }

    /// Without the `online` feature the build entry cannot call a model: a stale step is an
    /// error that names `cargo promptgen`.
    #[cfg(not(feature = "online"))]
    fn regenerate(
        &self,
        chain: &Chain,
        _: &Layout,
        stale: Vec<StaleStep>,
    ) -> Result<(Files, Vec<String>, Vec<String>), Error> {
        Err(Error::Stale {
            package: chain.package_name.clone(),
            steps: stale,
            reason: "this build entry cannot call a model (cargo-promptgen's `online` feature is off: add \
                     `features = [\"online\"]` to regenerate in `cargo build`)"
                .into(),
        })
    }

    /// The build entry of the package a check is checking: the candidate tree in `tree`
    /// becomes the generated tree.
    fn mount_candidate(&self, tree: &Path, out_dir: &Path) -> Result<BuildReport, Error> {
        if self.emit_cargo_directives {
            for var in [TREE_VAR, TREE_PACKAGE_VAR] {
                println!("cargo:rerun-if-env-changed={var}");
            }
            println!("cargo:rerun-if-changed={}", tree.display());
        }
        let files_written = mount(out_dir, &read_tree(tree)?)?;
        let generated_dir = out_dir.join(OUT_SUBDIR);
        Ok(BuildReport { generated_dir, files_written, regenerated: Vec::new(), pending: Vec::new() })
    }

    fn offline_reason(&self) -> Option<String> {
        match self.offline {
            Some(true) => return Some("this build is offline".into()),
            Some(false) => return None,
            None => {}
        }
        if std::env::var_os(TREE_PACKAGE_VAR).is_some() {
            return Some(
                "it is built for the check of another package's step, and such a build never calls a model".into(),
            );
        }
        let var = |name: &str| std::env::var(name).ok();
        if let Some(value) = var("PROMPTGEN_OFFLINE") {
            let value = value.trim();
            if !value.is_empty() && value != "0" && !value.eq_ignore_ascii_case("false") {
                return Some("PROMPTGEN_OFFLINE is set, so the build may not call a model".into());
            }
        }
        if var("CI").is_some() {
            return Some(
                "CI is set, so the build may not call a model and uses only the committed lock (not results a build \
                 left pending)"
                    .into(),
            );
        }
        None
    }
}

/// Where the package in `manifest_dir` comes from, when it is someone else's: a registry, a
/// git repository or a vendored directory. Such a build never calls a model: it would spend
/// the user's model server and keys on code nobody here reviewed.
///
/// Cargo marks each registry package it unpacks, and each git checkout, with a `.cargo-ok`
/// file at the folder's root (a git package may sit in a subfolder of its checkout), and
/// `cargo vendor` writes a `.cargo-checksum.json` into each vendored package. The user's own
/// packages (workspace members, path dependencies) have neither.
fn dependency_origin(manifest_dir: &Path) -> Option<&'static str> {
    if manifest_dir.join(".cargo-checksum.json").is_file() {
        return Some("a vendored directory");
    }
    let unpacked = manifest_dir.ancestors().find(|dir| dir.join(".cargo-ok").is_file())?;
    let is_git = unpacked
        .components()
        .collect::<Vec<_>>()
        .windows(2)
        .any(|pair| pair[0].as_os_str() == "git" && pair[1].as_os_str() == "checkouts");
    Some(if is_git { "a git repository" } else { "a registry" })
}

/// The candidate tree to mount, when this build is a check of the package in `manifest_dir`
/// (`PROMPTGEN_TREE` names the tree and `PROMPTGEN_TREE_PACKAGE` this package).
fn checked_tree(manifest_dir: &Path) -> Option<PathBuf> {
    let tree = std::env::var_os(TREE_VAR)?;
    let package = PathBuf::from(std::env::var_os(TREE_PACKAGE_VAR)?);
    let same = |a: &Path, b: &Path| match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    };
    same(&package, manifest_dir).then(|| PathBuf::from(tree))
}

/// Makes `out_dir` mount `tree`: the files in `promptgen/`, and the module file that makes
/// each `.rs` file a module (see [`crate::mount`]). Returns how many files it wrote.
fn mount(out_dir: &Path, tree: &Files) -> Result<usize, Error> {
    let files_written = sync_dir(&out_dir.join(OUT_SUBDIR), tree)?;
    let modules = module_tree(tree.keys(), &|file| format!("concat!(env!(\"OUT_DIR\"), \"/{OUT_SUBDIR}/{file}\")"));
    codegen_core::fs::write_if_changed_unsynced(&out_dir.join(MODULES_FILE), modules.as_bytes())?;
    Ok(files_written)
}

/// The one-call build-script entry: `fn main() -> Result<(), cargo_promptgen::Error> { cargo_promptgen::build() }`.
pub fn build() -> Result<(), Error> {
    Builder::new().run().map(|_| ())
}

fn env_path(name: &'static str) -> Result<PathBuf, Error> {
    std::env::var_os(name).map(PathBuf::from).ok_or(Error::Env {
        name,
        hint: "call cargo_promptgen::build() from a build script, or set the path on the Builder",
    })
}

/// Tells Cargo to run the build script again when anything that can change the tree changes.
fn emit_rerun_directives(chain: &Chain) {
    let mut paths: Vec<&Path> = vec![&chain.manifest_path];
    let lock = chain.package_dir.join(LOCK_FILE);
    let store = chain.package_dir.join(STORE_DIR);
    paths.push(&lock);
    // In cache mode the files come from the cache, named by the lock's hashes: the lock is
    // what changes. (A path that does not exist would make Cargo run this script every time.)
    if chain.store.mode == StoreMode::Repo {
        paths.push(&store);
    }
    for step in &chain.steps {
        paths.push(&step.prompt);
        paths.extend(step.system_prompt.as_deref());
        paths.extend(step.backend.script.as_deref());
        paths.extend(step.inputs.iter().map(|i| i.real_path.as_path()));
    }
    let mut seen = std::collections::BTreeSet::new();
    for path in paths {
        if seen.insert(path) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    for var in config::ENV_VARS.iter().chain(OFFLINE_VARS).chain(&[TREE_VAR, TREE_PACKAGE_VAR]) {
        println!("cargo:rerun-if-env-changed={var}");
    }
}

#[cfg(test)]
mod tests {
    use super::dependency_origin;

    #[test]
    fn packages_cargo_unpacked_or_vendored_are_dependencies_and_the_users_own_are_not() {
        let home = tempfile::tempdir().unwrap();
        let dir = |rel: &str| {
            let path = home.path().join(rel);
            std::fs::create_dir_all(&path).unwrap();
            path
        };
        let registry = dir("registry/src/index.crates.io-1949cf8c6b5b557f/greeting-0.1.0");
        std::fs::write(registry.join(".cargo-ok"), "{\"v\":1}").unwrap();
        assert_eq!(dependency_origin(&registry), Some("a registry"));

        let checkout = dir("git/checkouts/greeting-061ff908fdfc7c78/a1b2c3d");
        std::fs::write(checkout.join(".cargo-ok"), "").unwrap();
        assert_eq!(dependency_origin(&checkout), Some("a git repository"));
        assert_eq!(
            dependency_origin(&dir("git/checkouts/greeting-061ff908fdfc7c78/a1b2c3d/crates/inner")),
            Some("a git repository")
        );

        let vendored = dir("vendor/greeting");
        std::fs::write(vendored.join(".cargo-checksum.json"), "{}").unwrap();
        assert_eq!(dependency_origin(&vendored), Some("a vendored directory"));

        assert_eq!(dependency_origin(&dir("projects/my-app")), None);
    }
}
