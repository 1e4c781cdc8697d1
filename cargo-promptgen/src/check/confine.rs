//! Checks run confined where the OS allows it.
//!
//! A check compiles and, under `cargo test`, runs code a model wrote, and its output goes
//! back to the model and through it to the model's server. So on Linux with Landlock the
//! check's processes (Cargo, rustc, the linker, build scripts, proc macros, test binaries,
//! a command check and everything they start) run under a Landlock ruleset that the parent
//! builds ([`Policy::ruleset`]) and the child applies between `fork` and `exec`
//! ([`confine`]), and that they cannot leave:
//!
//! - **read** (and run): the package and the local packages it builds, without their
//!   protected entries (`.env*`, `.git`, `target`, `*.pem`, `id_*`, `.cargo/credentials*`:
//!   [`codegen_core::sandbox::is_protected`], the sandbox's own rule); the manifests of the
//!   workspace's members, the `Cargo.toml` files above each local package, and the workspace's
//!   `Cargo.lock`; the Cargo configuration and `rust-toolchain` files above the package; the
//!   rustup home and the toolchain's sysroot; the cargo home's `registry`, `git` and `bin`
//!   and its `config.toml` (not `credentials.toml`); the candidate tree; `/usr`, `/bin`,
//!   `/sbin`, `/lib*`, `/etc/ld.so.cache` (the dynamic loader's), `/proc`, and what
//!   `available_parallelism` reads in `/sys` (the CPU list, cgroup quotas);
//! - **list** (names, not contents): the package folder and the folders in it that hold a
//!   protected entry (Landlock cannot take one path out of an allowed folder, so those
//!   folders' other entries are allowed one by one instead);
//! - **write**: the checks' target folder, a temporary folder of the check's own (`TMPDIR`,
//!   emptied before each run), Cargo's lock files in the cargo home (`.package-cache*`,
//!   `.global-cache`), and `/dev/null`, `/dev/zero`, `/dev/full`, `/dev/random`,
//!   `/dev/urandom`;
//! - **no network**: TCP bind and connect are refused (Landlock ABI 4, Linux 6.7), and so
//!   are signals to processes outside the check and abstract UNIX sockets (ABI 6, Linux 6.12).
//!
//! The `rustc` check gets less: the system's and the toolchain's part, the candidate tree, and
//! its scratch folder to write. A child of a process that holds capabilities (root) also drops
//! them all before it confines itself (see [`confine`]).
//!
//! What this does not confine, and what a file rule cannot see:
//! - UDP, and UNIX sockets at a path: Landlock refuses TCP only (a socket file, such as a
//!   container runtime's, can be connected to wherever it lies);
//! - what is created after the ruleset is built, a check's own run included: the package is
//!   allowed entry by entry when the check starts, so a protected file that appears later in
//!   a folder allowed whole is readable, and one in a folder allowed entry by entry is not;
//! - a hard link in the package to a file outside it (a rule follows the path used, and the
//!   model's tools cannot make one);
//! - what `/proc` shows of the check's own processes, and the names (not contents) of the
//!   package's protected files.
//!
//! Cargo cannot fetch without network, so a crate check first runs `cargo metadata`
//! unconfined (the network allowed, unless the user's own `CARGO_NET_OFFLINE` or config says
//! otherwise): it downloads every dependency, settles `Cargo.lock` (the confined build never
//! writes it) and names the local packages and the workspace's members. That runs no code of
//! the package and reads nothing the model wrote. The confined build runs with
//! `CARGO_NET_OFFLINE=true`.
//!
//! Where Landlock is missing (not Linux, a kernel without it or with it off, ABI 1, which
//! refuses the renames between folders that Cargo does), checks run unconfined after a
//! warning, once per process; `PROMPTGEN_UNCONFINED_CHECKS=1` turns confinement off on
//! purpose, with the same warning. With ABI 2 or 3 (Linux 5.19 to 6.6) files are confined
//! and the network is not, and a warning says so.
//!
//! ```text
//! <target>/promptgen/
//! ├── check-target/              the checks' target folder: written by confined checks
//! └── check-tmp/<package>/       TMPDIR of the package's confined checks
//! ```

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use crate::check::process::cargo_command;

/// The variable that turns confinement off: set to anything but empty or `0`.
pub const UNCONFINED_VAR: &str = "PROMPTGEN_UNCONFINED_CHECKS";

/// The newest Landlock ABI whose rights this module asks for (and is tested with); a newer
/// kernel is used at this ABI.
#[cfg(target_os = "linux")]
const NEWEST_ABI: i32 = 7;

/// Whether checks run confined in this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    /// Landlock at this ABI: files from 2 on, TCP from 4 on, signals and abstract UNIX
    /// sockets from 6 on.
    Landlock {
        /// The ABI the rulesets are built for: the kernel's, at most `NEWEST_ABI`.
        abi: i32,
    },
    /// Checks run unconfined, for this reason.
    Unconfined(String),
}

impl Support {
    /// What this process can do, from the environment and the kernel, decided once.
    pub fn get() -> &'static Support {
        static SUPPORT: OnceLock<Support> = OnceLock::new();
        SUPPORT.get_or_init(|| Support::detect(std::env::var_os(UNCONFINED_VAR).as_deref(), kernel_abi()))
    }

    /// What a process with `variable` (the value of [`UNCONFINED_VAR`]) can do on a kernel
    /// whose Landlock ABI is `kernel` (or whose error is `Err`).
    pub fn detect(variable: Option<&std::ffi::OsStr>, kernel: Result<i32, String>) -> Support {
        if let Some(value) = variable
            && !value.is_empty()
            && value != "0"
        {
            return Support::Unconfined(format!("{UNCONFINED_VAR} is set"));
        }
        match kernel {
            Err(why) => Support::Unconfined(why),
            Ok(1) => Support::Unconfined(
                "the kernel's Landlock is ABI 1 (Linux 5.13 to 5.18), which refuses every rename between folders, and Cargo \
                 renames; Linux 5.19 or later is needed"
                    .into(),
            ),
            Ok(abi) => Support::Landlock { abi: abi.min(newest_abi()) },
        }
    }

    /// The warning a user gets once, if any: checks unconfined, or their network not.
    pub fn warning(&self) -> Option<String> {
        match self {
            Support::Unconfined(why) => Some(format!(
                "warning: checks run unconfined: {why}; generated code run by `cargo test` can read any file your user can \
                 (and use the network)"
            )),
            Support::Landlock { abi } if *abi < 4 => Some(format!(
                "warning: checks run confined to their files, but not their network: the kernel's Landlock is ABI {abi}, and \
                 refusing TCP needs ABI 4 (Linux 6.7)"
            )),
            Support::Landlock { .. } => None,
        }
    }
}

#[cfg(target_os = "linux")]
fn newest_abi() -> i32 {
    NEWEST_ABI
}

#[cfg(not(target_os = "linux"))]
fn newest_abi() -> i32 {
    0
}

/// The kernel's Landlock ABI, or why there is none (whatever `PROMPTGEN_UNCONFINED_CHECKS` says).
#[cfg(target_os = "linux")]
pub fn kernel_abi() -> Result<i32, String> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute, a zero size and this flag the call only returns the
    // ABI version (or an error); it touches no memory.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if abi > 0 {
        return Ok(abi as i32);
    }
    let error = std::io::Error::last_os_error();
    Err(match error.raw_os_error() {
        Some(libc::EOPNOTSUPP) => {
            "Landlock is built into the kernel but not enabled (add `landlock` to the `lsm=` boot parameter)".into()
        }
        Some(libc::ENOSYS) => {
            "the kernel has no Landlock (Linux 5.13 or later, built with CONFIG_SECURITY_LANDLOCK)".into()
        }
        _ => format!("Landlock could not be asked for its version: {error}"),
    })
}

#[cfg(not(target_os = "linux"))]
pub fn kernel_abi() -> Result<i32, String> {
    Err("this OS has no Landlock (only Linux does)".into())
}

/// Prints [`Support::warning`] the first time it is called in this process.
fn warn_once(support: &Support) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    if let Some(warning) = support.warning() {
        WARNED.call_once(|| eprintln!("{warning}"));
    }
}

/// What a confined process may touch. Paths that do not exist are left out when the ruleset
/// is built; files get the rights that apply to files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// Read and run everything beneath each.
    pub read: BTreeSet<PathBuf>,
    /// List each folder's entries (their names only).
    pub list: BTreeSet<PathBuf>,
    /// Everything beneath each: read, run, write, create, remove, rename.
    pub write: BTreeSet<PathBuf>,
}

/// Read and run: what a compiler, a linker and a test binary need of the system.
const SYSTEM_READ: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc/ld.so.cache",
    "/proc",
    "/sys/devices/system/cpu",
    "/sys/fs/cgroup",
];

/// Read and write.
const SYSTEM_DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"];

impl Policy {
    /// The system's part and the toolchain's: see the module documentation.
    pub fn base(toolchain: &Toolchain) -> Policy {
        let mut policy = Policy::default();
        policy.read.extend(SYSTEM_READ.iter().map(PathBuf::from));
        policy.write.extend(SYSTEM_DEVICES.iter().map(PathBuf::from));
        policy.read.insert(toolchain.rustup_home.clone());
        policy.read.insert(toolchain.sysroot.clone());
        let cargo_home = &toolchain.cargo_home;
        for name in ["registry", "git", "bin", "config.toml", "config"] {
            policy.read.insert(cargo_home.join(name));
        }
        for name in [".package-cache", ".package-cache-mutate", ".global-cache"] {
            policy.write.insert(cargo_home.join(name));
        }
        policy
    }

    /// Allows reading `dir` (a package) without its protected entries: the folder and the
    /// folders in it that hold a protected entry may be listed, and every other entry read.
    /// Symbolic links get no rule: what they lead to is allowed where it lies, or not at all.
    pub fn allow_package(&mut self, dir: &Path) {
        let mut entries = Vec::new();
        let mut listed = Vec::new();
        gather(dir, "", &mut entries, &mut listed);
        self.read.extend(entries);
        self.list.insert(dir.to_path_buf());
        self.list.extend(listed);
    }

    /// Allows reading and running the file `program` would start (found on `PATH` when it
    /// has no slash, else relative to `dir`).
    pub fn allow_program(&mut self, program: &Path, dir: &Path, path_var: Option<&std::ffi::OsStr>) {
        if let Some(found) = find_program(program, dir, path_var) {
            self.read.insert(found.canonicalize().unwrap_or(found));
        }
    }
}

/// Adds to `entries` what to allow beneath `dir` (at `relative` in the package), and to
/// `listed` the folders to list; returns whether `dir` holds nothing protected (then the
/// caller may allow it whole instead).
fn gather(dir: &Path, relative: &str, entries: &mut Vec<PathBuf>, listed: &mut Vec<PathBuf>) -> bool {
    let Ok(read) = std::fs::read_dir(dir) else { return false };
    let mut children: Vec<_> = read.flatten().collect();
    children.sort_by_key(|entry| entry.file_name());
    let (mut mine, mut below, mut clean) = (Vec::new(), Vec::new(), true);
    for child in children {
        let name = child.file_name().to_string_lossy().into_owned();
        let child_relative = if relative.is_empty() { name } else { format!("{relative}/{name}") };
        let path = child.path();
        if codegen_core::sandbox::is_protected(&child_relative) {
            clean = false;
            continue;
        }
        match child.file_type() {
            Ok(kind) if kind.is_symlink() => {}
            Ok(kind) if kind.is_dir() => {
                let (mut sub_entries, mut sub_listed) = (Vec::new(), Vec::new());
                if gather(&path, &child_relative, &mut sub_entries, &mut sub_listed) {
                    mine.push(path);
                } else {
                    clean = false;
                    below.push(path);
                    mine.append(&mut sub_entries);
                    listed.append(&mut sub_listed);
                }
            }
            Ok(_) => mine.push(path),
            Err(_) => clean = false,
        }
    }
    entries.append(&mut mine);
    listed.append(&mut below);
    clean
}

/// The file `program` names: with a slash, relative to `dir`; without, the first executable
/// file of that name on `path_var`.
fn find_program(program: &Path, dir: &Path, path_var: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    if program.components().count() > 1 || program.is_absolute() {
        let path = dir.join(program);
        return path.is_file().then_some(path);
    }
    std::env::split_paths(path_var?).map(|folder| folder.join(program)).find(|candidate| candidate.is_file())
}

/// Where the Rust toolchain and Cargo's own files live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Toolchain {
    /// `CARGO_HOME`, else `~/.cargo`.
    pub cargo_home: PathBuf,
    /// `RUSTUP_HOME`, else `~/.rustup`.
    pub rustup_home: PathBuf,
    /// `rustc --print sysroot`, as the check's Cargo runs rustc (in the package folder).
    pub sysroot: PathBuf,
}

impl Toolchain {
    /// The toolchain a check in `dir` uses; asked of `rustc` once per folder and process.
    pub fn find(dir: &Path) -> Result<Toolchain, String> {
        static FOUND: OnceLock<Mutex<HashMap<PathBuf, Toolchain>>> = OnceLock::new();
        let found = FOUND.get_or_init(Default::default);
        if let Some(toolchain) = found.lock().unwrap_or_else(|e| e.into_inner()).get(dir) {
            return Ok(toolchain.clone());
        }
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let under_home = |var: &str, name: &str| {
            std::env::var_os(var)
                .map(PathBuf::from)
                .or_else(|| home.as_ref().map(|home| home.join(name)))
                .ok_or_else(|| format!("neither {var} nor HOME is set, so the toolchain cannot be found"))
        };
        let rustc = std::env::var_os("RUSTC").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("rustc"));
        let mut command = cargo_command(&rustc);
        let output = command
            .args(["--print", "sysroot"])
            .current_dir(dir)
            .output()
            .map_err(|e| format!("could not start `{} --print sysroot`: {e}", rustc.display()))?;
        if !output.status.success() {
            return Err(format!(
                "`{} --print sysroot` failed: {}",
                rustc.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        let toolchain = Toolchain {
            cargo_home: under_home("CARGO_HOME", ".cargo")?,
            rustup_home: under_home("RUSTUP_HOME", ".rustup")?,
            sysroot: PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()),
        };
        found.lock().unwrap_or_else(|e| e.into_inner()).insert(dir.to_path_buf(), toolchain.clone());
        Ok(toolchain)
    }
}

/// What `cargo metadata` says of a package: what of the workspace its build reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Workspace {
    /// The workspace's root folder.
    pub root: PathBuf,
    /// The manifests of the workspace's members.
    pub member_manifests: Vec<PathBuf>,
    /// The folders of the local packages (path dependencies and members) the package builds,
    /// its own included.
    pub local_packages: Vec<PathBuf>,
}

impl Workspace {
    /// Runs `cargo metadata` for `manifest` unconfined, once per manifest and process: it
    /// fetches every dependency (so the confined build needs no network) and settles
    /// `Cargo.lock` (so the confined build never writes it).
    pub fn prepare(cargo: &Path, manifest: &Path, dir: &Path) -> Result<Arc<Workspace>, String> {
        static PREPARED: OnceLock<Mutex<HashMap<PathBuf, Arc<Workspace>>>> = OnceLock::new();
        let prepared = PREPARED.get_or_init(Default::default);
        if let Some(workspace) = prepared.lock().unwrap_or_else(|e| e.into_inner()).get(manifest) {
            return Ok(workspace.clone());
        }
        let output = cargo_command(cargo)
            .args(["metadata", "--format-version", "1", "--color=never", "--manifest-path"])
            .arg(manifest)
            .current_dir(dir)
            .output()
            .map_err(|e| format!("could not start `{} metadata`: {e}", cargo.display()))?;
        if !output.status.success() {
            return Err(format!(
                "`cargo metadata`, which fetches the dependencies before the check runs without network, failed \
                 (set {UNCONFINED_VAR}=1 to run checks unconfined):\n{}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)
            .map_err(|e| format!("`cargo metadata` printed what is not JSON: {e}"))?;
        let workspace = Arc::new(Workspace::from_metadata(&metadata, manifest)?);
        prepared.lock().unwrap_or_else(|e| e.into_inner()).insert(manifest.to_path_buf(), workspace.clone());
        Ok(workspace)
    }

    /// Reads `cargo metadata`'s JSON (format 1) for the package whose manifest is `manifest`.
    pub fn from_metadata(metadata: &serde_json::Value, manifest: &Path) -> Result<Workspace, String> {
        let text = |value: &serde_json::Value| value.as_str().map(str::to_string);
        let same_file =
            |a: &Path, b: &Path| a == b || (a.canonicalize().ok().is_some_and(|a| b.canonicalize().ok() == Some(a)));
        let packages = metadata["packages"].as_array().cloned().unwrap_or_default();
        let manifest_of = |id: &str| {
            packages
                .iter()
                .find(|p| p["id"].as_str() == Some(id))
                .and_then(|p| text(&p["manifest_path"]))
                .map(PathBuf::from)
        };
        let is_local = |id: &str| packages.iter().any(|p| p["id"].as_str() == Some(id) && p["source"].is_null());
        let root_id = packages
            .iter()
            .find(|p| p["manifest_path"].as_str().is_some_and(|m| same_file(Path::new(m), manifest)))
            .and_then(|p| text(&p["id"]))
            .ok_or_else(|| format!("`cargo metadata` does not list the package of {}", manifest.display()))?;
        let nodes = metadata["resolve"]["nodes"].as_array().cloned().unwrap_or_default();
        let mut local = BTreeSet::new();
        let mut queue = VecDeque::from([root_id]);
        while let Some(id) = queue.pop_front() {
            if !is_local(&id) || !local.insert(id.clone()) {
                continue;
            }
            if let Some(node) = nodes.iter().find(|n| n["id"].as_str() == Some(&id)) {
                queue.extend(node["dependencies"].as_array().into_iter().flatten().filter_map(text));
            }
        }
        let members = metadata["workspace_members"].as_array().cloned().unwrap_or_default();
        Ok(Workspace {
            root: text(&metadata["workspace_root"]).map(PathBuf::from).unwrap_or_default(),
            member_manifests: members.iter().filter_map(|id| id.as_str().and_then(manifest_of)).collect(),
            local_packages: local
                .iter()
                .filter_map(|id| manifest_of(id))
                .filter_map(|manifest| manifest.parent().map(Path::to_path_buf))
                .collect(),
        })
    }

    /// Adds to `policy` what a build of the package reads of the workspace and above it.
    pub fn allow(&self, policy: &mut Policy, package_dir: &Path) {
        for dir in &self.local_packages {
            policy.allow_package(dir);
            // Cargo looks for the workspace root in every folder above a package.
            for above in dir.ancestors().skip(1) {
                policy.read.insert(above.join("Cargo.toml"));
            }
        }
        policy.read.extend(self.member_manifests.iter().cloned());
        policy.read.insert(self.root.join("Cargo.toml"));
        policy.read.insert(self.root.join("Cargo.lock"));
        // Cargo's configuration and rustup's toolchain files, found from the folder it runs in.
        for above in package_dir.ancestors() {
            for name in [".cargo/config.toml", ".cargo/config", "rust-toolchain.toml", "rust-toolchain"] {
                policy.read.insert(above.join(name));
            }
        }
    }
}

/// The folder a package's confined checks get as `TMPDIR`, beside the checks' target folder.
pub fn tmp_dir(check_target_dir: &Path, package: &str) -> PathBuf {
    check_target_dir.parent().unwrap_or(check_target_dir).join("check-tmp").join(package)
}

/// Empties (or creates) `dir`, keeping the folder itself: a ruleset names folders by inode.
fn fresh_dir(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let removed = match entry.file_type() {
            Ok(kind) if kind.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
        removed.map_err(|e| format!("cannot empty {}: {e}", dir.display()))?;
    }
    Ok(())
}

/// What a crate check (`cargo check`, `cargo test`) or a command check in a package confines.
pub struct PackageCheck<'a> {
    /// The `cargo` that runs the check, and `cargo metadata`.
    pub cargo: &'a Path,
    /// The package's manifest.
    pub manifest: &'a Path,
    /// The package's folder, where the check runs.
    pub package_dir: &'a Path,
    /// The package's name.
    pub package: &'a str,
    /// The checks' target folder.
    pub target_dir: &'a Path,
    /// The candidate tree the check reads.
    pub tree: &'a Path,
}

/// Confines a crate check's or a command check's `command` (see the module documentation),
/// or warns once and leaves it unconfined where Landlock is missing.
pub fn package_check(command: &mut Command, check: &PackageCheck<'_>) -> Result<(), String> {
    let support = Support::get();
    warn_once(support);
    let Support::Landlock { abi } = support else { return Ok(()) };
    let workspace = Workspace::prepare(check.cargo, check.manifest, check.package_dir)?;
    let toolchain = Toolchain::find(check.package_dir)?;
    let tmp = tmp_dir(check.target_dir, check.package);
    fresh_dir(&tmp)?;
    std::fs::create_dir_all(check.target_dir)
        .map_err(|e| format!("cannot create {}: {e}", check.target_dir.display()))?;
    let mut policy = Policy::base(&toolchain);
    workspace.allow(&mut policy, check.package_dir);
    let path_var = command
        .get_envs()
        .find(|(name, _)| *name == "PATH")
        .map_or_else(|| std::env::var_os("PATH"), |(_, v)| v.map(Into::into));
    policy.allow_program(Path::new(command.get_program()), check.package_dir, path_var.as_deref());
    policy.read.insert(check.tree.to_path_buf());
    policy.write.insert(check.target_dir.to_path_buf());
    policy.write.insert(tmp.clone());
    confine(command, &policy, *abi, &tmp)
}

/// Confines the `rustc` check's `command`: it reads the tree and the toolchain, and writes its
/// scratch folder only.
pub fn rustc_check(command: &mut Command, tree: &Path, scratch: &Path) -> Result<(), String> {
    let support = Support::get();
    warn_once(support);
    let Support::Landlock { abi } = support else { return Ok(()) };
    let here = match command.get_current_dir() {
        Some(dir) => dir.to_path_buf(),
        None => std::env::current_dir().map_err(|e| format!("cannot tell the current folder: {e}"))?,
    };
    let toolchain = Toolchain::find(&here)?;
    let tmp = scratch.join("tmp");
    fresh_dir(&tmp)?;
    let mut policy = Policy::base(&toolchain);
    policy.allow_program(Path::new(command.get_program()), &here, std::env::var_os("PATH").as_deref());
    policy.read.insert(tree.to_path_buf());
    policy.write.insert(scratch.to_path_buf());
    confine(command, &policy, *abi, &tmp)
}

/// Makes `command` start under `policy` at Landlock ABI `abi`, with `TMPDIR` set to `tmp`
/// and Cargo offline: the ruleset is built here, and the child restricts itself with it
/// between `fork` and `exec`. A child of a process that holds capabilities (root) first drops
/// them all, for good: Landlock keeps a confined process from reading another process's
/// `/proc/<pid>/environ` (ours holds the secrets the check's environment goes without), but a
/// root one with its capabilities can still read it.
#[cfg(target_os = "linux")]
pub fn confine(command: &mut Command, policy: &Policy, abi: i32, tmp: &Path) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;

    let ruleset = policy.ruleset(abi)?;
    let drop_capabilities = capabilities::held()?;
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    command.env("TMPDIR", tmp).env("CARGO_NET_OFFLINE", "true");
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls may be made: it makes system calls (prctl, capset,
    // landlock_restrict_self) on values prepared before the fork and reads errno, and
    // allocates nothing (`io::Error::last_os_error` holds the bare code).
    unsafe {
        command.pre_exec(move || {
            if drop_capabilities {
                capabilities::drop_all(root)?;
            }
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

/// Linux capabilities, with the raw system calls (the `libc` crate has no types for them).
#[cfg(target_os = "linux")]
mod capabilities {
    const VERSION_3: u32 = 0x2008_0522;

    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }

    /// Whether this process holds any capability, or may regain one through its bounding set
    /// as root does at `exec`.
    pub(super) fn held() -> Result<bool, String> {
        let mut header = Header { version: VERSION_3, pid: 0 };
        let mut data = [Data::default(); 2];
        // SAFETY: version 3 of the call writes two `Data`, which `data` holds.
        if unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) } != 0 {
            return Err(format!("cannot read this process's capabilities: {}", std::io::Error::last_os_error()));
        }
        let any = data.iter().any(|d| d.effective != 0 || d.permitted != 0 || d.inheritable != 0);
        // SAFETY: geteuid cannot fail.
        Ok(any || unsafe { libc::geteuid() } == 0)
    }

    /// Empties the ambient, effective, permitted and inheritable sets, and for `root` the
    /// bounding set too (root regains at `exec` whatever that set holds; others cannot, and
    /// need `CAP_SETPCAP` to change it). Runs in a child between fork and exec: system calls
    /// only, nothing allocated.
    pub(super) fn drop_all(root: bool) -> std::io::Result<()> {
        // SAFETY: prctl and capset with plain values and a pointer to stack data.
        unsafe {
            if root {
                for capability in 0..64 {
                    if libc::prctl(libc::PR_CAPBSET_DROP, capability, 0, 0, 0) != 0 {
                        let error = std::io::Error::last_os_error();
                        // EINVAL: past the kernel's last capability.
                        if error.raw_os_error() == Some(libc::EINVAL) {
                            break;
                        }
                        return Err(error);
                    }
                }
            }
            if libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let mut header = Header { version: VERSION_3, pid: 0 };
            let data = [Data::default(); 2];
            if libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

#[cfg(not(target_os = "linux"))]
pub fn confine(_command: &mut Command, _policy: &Policy, _abi: i32, _tmp: &Path) -> Result<(), String> {
    Err("this OS has no Landlock".into())
}

#[cfg(target_os = "linux")]
impl Policy {
    /// The Landlock ruleset of this policy at ABI `abi` (2 or more): file access is handled at
    /// that ABI and allowed by the policy's rules; from ABI 4 TCP bind and connect are handled
    /// and allowed nowhere; from ABI 6 signals and abstract UNIX sockets stay inside.
    pub fn ruleset(&self, abi: i32) -> Result<std::os::fd::OwnedFd, String> {
        use landlock::{
            ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
            RulesetAttr, RulesetCreatedAttr, Scope,
        };
        let abi = ABI::from(abi.min(NEWEST_ABI));
        let error = |e: landlock::RulesetError| format!("the Landlock ruleset cannot be built: {e}");
        let all = AccessFs::from_all(abi);
        let mut ruleset =
            Ruleset::default().set_compatibility(CompatLevel::HardRequirement).handle_access(all).map_err(error)?;
        if abi >= ABI::V4 {
            ruleset = ruleset.handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp).map_err(error)?;
        }
        if abi >= ABI::V6 {
            ruleset = ruleset.scope(Scope::from_all(ABI::V6)).map_err(error)?;
        }
        let mut created = ruleset.create().map_err(error)?;
        let read = AccessFs::from_read(abi);
        let list: BitFlags<AccessFs> = AccessFs::ReadDir.into();
        let rules = [(&self.list, list), (&self.read, read), (&self.write, all)];
        for (paths, access) in rules {
            for path in paths {
                let fd = match PathFd::new(path) {
                    Ok(fd) => fd,
                    Err(_) if !path.exists() => continue,
                    Err(e) => return Err(format!("cannot open {} for the Landlock ruleset: {e}", path.display())),
                };
                let access = if path.is_dir() { access } else { access & AccessFs::from_file(abi) };
                if access.is_empty() {
                    continue;
                }
                created = created.add_rule(PathBeneath::new(fd, access)).map_err(error)?;
            }
        }
        Option::from(created).ok_or_else(|| "the kernel gave no Landlock ruleset".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn the_variable_turns_confinement_off_and_an_old_or_missing_landlock_leaves_it_off() {
        let unconfined = |why: &str| Support::Unconfined(why.to_string());
        assert_eq!(Support::detect(Some(OsStr::new("1")), Ok(7)), unconfined("PROMPTGEN_UNCONFINED_CHECKS is set"));
        for off in ["", "0"] {
            assert!(matches!(Support::detect(Some(OsStr::new(off)), Ok(5)), Support::Landlock { .. }), "{off:?}");
        }
        assert_eq!(Support::detect(None, Err("no Landlock".into())), unconfined("no Landlock"));
        assert!(matches!(Support::detect(None, Ok(1)), Support::Unconfined(why) if why.contains("ABI 1")));
        assert_eq!(Support::detect(None, Ok(3)), Support::Landlock { abi: 3 });
        assert!(Support::Landlock { abi: 3 }.warning().is_some_and(|w| w.contains("not their network")));
        assert_eq!(Support::Landlock { abi: 4 }.warning(), None);
        assert!(unconfined("why").warning().is_some_and(|w| w.starts_with("warning: checks run unconfined: why;")));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_newer_kernel_is_used_at_the_newest_abi_known_here() {
        assert_eq!(Support::detect(None, Ok(99)), Support::Landlock { abi: NEWEST_ABI });
    }

    #[test]
    fn a_package_is_allowed_without_its_protected_entries() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for file in ["Cargo.toml", "src/lib.rs", "src/clean/a.rs", "keys/id_rsa", "keys/readme.md", ".env", "target/x"]
        {
            std::fs::create_dir_all(root.join(file).parent().unwrap()).unwrap();
            std::fs::write(root.join(file), "x").unwrap();
        }
        let mut policy = Policy::default();
        policy.allow_package(root);
        let read: Vec<_> = policy.read.iter().map(|p| p.strip_prefix(root).unwrap().to_path_buf()).collect();
        let expected: Vec<PathBuf> = ["Cargo.toml", "keys/readme.md", "src"].iter().map(PathBuf::from).collect();
        assert_eq!(read, expected, "a clean folder is allowed whole, a file beside a protected one alone");
        assert_eq!(policy.list, BTreeSet::from([root.to_path_buf(), root.join("keys")]));
        assert!(policy.write.is_empty());
    }

    #[test]
    fn the_local_packages_are_those_without_a_source_that_the_package_reaches() {
        let metadata = serde_json::json!({
            "workspace_root": "/w",
            "workspace_members": ["app", "other"],
            "packages": [
                {"id": "app", "manifest_path": "/w/app/Cargo.toml", "source": null},
                {"id": "other", "manifest_path": "/w/other/Cargo.toml", "source": null},
                {"id": "lib", "manifest_path": "/libs/lib/Cargo.toml", "source": null},
                {"id": "serde", "manifest_path": "/reg/serde/Cargo.toml", "source": "registry+https://github.com/rust-lang/crates.io-index"},
                {"id": "deep", "manifest_path": "/libs/deep/Cargo.toml", "source": null}
            ],
            "resolve": {"nodes": [
                {"id": "app", "dependencies": ["lib", "serde"]},
                {"id": "serde", "dependencies": ["deep"]},
                {"id": "lib", "dependencies": []},
                {"id": "other", "dependencies": []}
            ]}
        });
        let workspace = Workspace::from_metadata(&metadata, Path::new("/w/app/Cargo.toml")).unwrap();
        assert_eq!(workspace.root, PathBuf::from("/w"));
        assert_eq!(workspace.local_packages, vec![PathBuf::from("/w/app"), PathBuf::from("/libs/lib")]);
        assert_eq!(
            workspace.member_manifests,
            vec![PathBuf::from("/w/app/Cargo.toml"), PathBuf::from("/w/other/Cargo.toml")]
        );
        assert!(Workspace::from_metadata(&metadata, Path::new("/nowhere/Cargo.toml")).is_err());
    }
}
