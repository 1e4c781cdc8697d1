//! A kill at every system call that records a chain, and what the next commands find.
//!
//! A two-step chain is recorded, its first prompt changed, and `cargo promptgen` run again
//! under strace, which kills it (SIGKILL) at the N-th call of one of the system calls in
//! [`POINTS`]: the renames (every atomic write, every folder swap, the lock's commit), the
//! flushes (a kill while a temporary file is written leaves what a kill at its flush leaves:
//! a file not renamed yet), the removals and the folders made. strace counts each system call
//! in each thread on its own, so a point that a step's thread reaches first hides the
//! recording thread's point of that number; the second step's recording, which takes the
//! same path later, is then the one tried. After each kill, for each system call and N = 1,
//! 2, ... until a run ends by itself:
//!
//! - the lock parses, and every file it names reads back with its hash;
//! - `cargo promptgen check` tells the truth: it blames no file on a hand edit, names no file
//!   as missing, and reports what the crash left;
//! - the next `cargo promptgen` ends the run without asking the model again for a step whose
//!   lock entry had landed, leaves nothing behind in the package (no dot-entry in
//!   `promptgen/`, no temporary file beside the lock), and `check` then passes.
//!
//! Ignored in `cargo test`: it runs the binary a few hundred times. `.ci/run` runs it
//! (installing Debian's strace when missing); where ptrace is refused it says so and passes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cargo_promptgen::__private::{Layout, Lock, Overrides, Records};
use promptgen_tests::{FakeLlm, Reply, Turn};
use serde_json::{Value, json};

use crate::support::{A1, A2, B, Package, chain, run, shared_target, text};

/// The system calls a kill is injected at, one after the other.
const POINTS: [&str; 10] =
    ["rename", "renameat", "renameat2", "fsync", "fdatasync", "unlink", "unlinkat", "rmdir", "mkdir", "mkdirat"];

/// More calls of one system call than any run of this chain makes: a loop that does not end
/// is a bug here.
const MOST_POINTS: usize = 200;

/// strace, when it is installed and may trace here; else why not.
fn strace() -> Result<PathBuf, String> {
    let strace = PathBuf::from("strace");
    match Command::new(&strace).args(["-f", "-qq", "-o", "/dev/null", "true"]).output() {
        Ok(out) if out.status.success() => Ok(strace),
        Ok(out) => Err(format!("strace cannot trace here: {}", String::from_utf8_lossy(&out.stderr).trim())),
        Err(e) => Err(format!("strace is not installed ({e}); Debian's package `strace` has it")),
    }
}

/// A server for the chain: each step's first call writes its file (`a.rs` as the prompt's
/// version says, `b.rs`), every later call finishes.
fn server() -> FakeLlm {
    let server = FakeLlm::start(Vec::new());
    server.respond_with(|request: &Value| {
        let messages = request["messages"].as_array()?;
        let prompt = messages.iter().find(|m| m["role"] == "user")?["content"].as_str()?.to_string();
        let answered = messages.iter().any(|m| m["role"] == "assistant");
        let call = match (answered, prompt.contains("b.rs")) {
            (true, _) => Turn::call("finish", json!({"summary": "done"})),
            (false, true) => Turn::call("write_file", json!({"path": "b.rs", "content": B})),
            (false, false) => {
                let content = if prompt.contains("version 2") { A2 } else { A1 };
                Turn::call("write_file", json!({"path": "a.rs", "content": content}))
            }
        };
        Some(Reply::turn(call))
    });
    server
}

struct Case<'a> {
    store: &'a str,
    cache_dir: &'a Path,
    server: &'a FakeLlm,
}

impl Case<'_> {
    fn promptgen(&self, package: &Package, args: &[&str]) -> Command {
        let mut command = package.promptgen(args);
        command.env("PROMPTGEN_BASE_URL", self.server.url()).env("PROMPTGEN_CACHE_DIR", self.cache_dir);
        command
    }

    /// A package whose chain is recorded with the first prompt, then given its second.
    fn package(&self) -> Package {
        let settings = format!("check = \"none\"\nstore = \"{}\"\n", self.store);
        let package = Package::lettered(&chain(&settings, &["a.rs", "b.rs"]), 2);
        let out = run(&mut self.promptgen(&package, &[]));
        assert!(out.status.success(), "the first recording: {}", text(&out));
        package.write("prompts/01.md", "Write a.rs with fn a, version 2.\n");
        package
    }

    fn layout(&self, package: &Package) -> Layout {
        let env = |name: &str| match name {
            "PROMPTGEN_CACHE_DIR" => Some(self.cache_dir.display().to_string()),
            _ => None,
        };
        let chain = cargo_promptgen::__private::load(&package.path("Cargo.toml"), &Overrides::default(), &env)
            .unwrap_or_else(|e| panic!("{e}"));
        Layout::new(&chain, &shared_target())
    }
}

/// What the package folder holds that a finished run never leaves: dot-entries in
/// `promptgen/` (staged or old folders of a step) and temporary files beside the lock.
fn leftovers(package: &Package) -> Vec<String> {
    let mut found = Vec::new();
    for (dir, shown) in [(package.path(""), ""), (package.path("promptgen"), "promptgen/")] {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let ours = name.starts_with(".promptgen-tmp-") || (!shown.is_empty() && name.starts_with('.'));
            if ours {
                found.push(format!("{shown}{name}"));
            }
        }
    }
    found
}

fn killed(out: &Output) -> bool {
    use std::os::unix::process::ExitStatusExt;
    out.status.signal() == Some(9) || out.status.code() == Some(137)
}

/// Runs the sweep for one store mode; returns how many points were tried.
fn sweep(store: &str) -> usize {
    let strace = match strace() {
        Ok(strace) => strace,
        Err(why) => {
            eprintln!("crash points skipped: {why}");
            return 0;
        }
    };
    let server = server();
    let cache = tempfile::tempdir().unwrap();
    let case = Case { store, cache_dir: cache.path(), server: &server };
    let mut tried = 0;
    for syscall in POINTS {
        tried += sweep_one(&strace, &case, store, syscall);
    }
    assert!(tried > 10, "{store}: only {tried} points were tried");
    tried
}

/// The sweep of `syscall`: the points it was killed at.
fn sweep_one(strace: &Path, case: &Case<'_>, store: &str, syscall: &str) -> usize {
    let server = case.server;
    for point in 1..=MOST_POINTS {
        let package = case.package();
        let layout = case.layout(&package);
        let mut command = Command::new(strace);
        command
            .args(["-f", "-qq", "-o", "/dev/null", "-e"])
            .arg(format!("trace={syscall}"))
            .arg("-e")
            .arg(format!("inject={syscall}:signal=SIGKILL:when={point}"))
            .arg(env!("CARGO_BIN_EXE_cargo-promptgen"));
        // The same command line and environment `package.promptgen` gives, under strace.
        let reference = case.promptgen(&package, &[]);
        command.args(reference.get_args()).current_dir(package.dir.path());
        command.env_clear();
        for (name, value) in reference.get_envs() {
            if let Some(value) = value {
                command.env(name, value);
            }
        }
        for name in ["PATH", "HOME", "CARGO_HOME", "RUSTUP_HOME", "RUSTUP_TOOLCHAIN"] {
            if let Some(value) = std::env::var_os(name).filter(|_| reference.get_envs().all(|(n, _)| n != name)) {
                command.env(name, value);
            }
        }
        let crashed = run(&mut command);
        if crashed.status.success() {
            // No injection landed: every call of `syscall` in the run has been tried.
            return point - 1;
        }
        let at = format!("{store}, kill at call {point} of {syscall}");
        assert!(killed(&crashed) || crashed.status.code() == Some(1), "{at}: {}", text(&crashed));

        // The lock parses, and every file it names reads back with its hash.
        let lock = Lock::read(&layout.lock_path()).unwrap_or_else(|e| panic!("{at}: the lock does not read: {e}"));
        let records = Records::read(&layout).unwrap_or_else(|e| panic!("{at}: {e}"));
        for entry in &lock.steps {
            if let Err(e) = records.store.load(entry) {
                panic!(
                    "{at}: step {} as the lock records it cannot be read: {e}\nleft: {:?}",
                    entry.id,
                    leftovers(&package)
                );
            }
        }
        // `check` tells the truth: nothing blamed on a hand edit, nothing missing.
        let checked = run(&mut case.promptgen(&package, &["check"]));
        let said = text(&checked);
        for wrong in ["edited by hand", "is missing", "damaged"] {
            assert!(!said.contains(wrong), "{at}: check says `{wrong}`:\n{said}");
        }
        let left = leftovers(&package);
        if !left.is_empty() {
            assert!(checked.status.code() == Some(1), "{at}: check passes with {left:?} left:\n{said}");
            for name in &left {
                assert!(said.contains(name.as_str()), "{at}: check does not report `{name}`:\n{said}");
            }
        }

        // The next run finishes the work: the steps whose entry landed are not asked for again.
        let landed: Vec<String> = lock.steps.iter().map(|e| format!("{}={}", e.id, e.key)).collect();
        let before_recovery = server.requests().len();
        let recovered = run(&mut case.promptgen(&package, &[]));
        assert!(recovered.status.success(), "{at}: the next run: {}", text(&recovered));
        let after = Lock::read(&layout.lock_path()).unwrap();
        let rerun = after.steps.iter().filter(|e| !landed.contains(&format!("{}={}", e.id, e.key))).count();
        assert_eq!(
            server.requests().len() - before_recovery,
            2 * rerun,
            "{at}: the next run asked the model for more than the steps whose entry had not landed ({rerun}): {}",
            text(&recovered)
        );
        let records = Records::read(&layout).unwrap();
        let first = records.store.load(after.step("01").expect("step 01 is recorded")).unwrap();
        assert_eq!(first.get("a.rs").map(|b| String::from_utf8_lossy(b).into_owned()).as_deref(), Some(A2), "{at}");
        assert!(leftovers(&package).is_empty(), "{at}: left after the next run: {:?}", leftovers(&package));
        let checked = run(&mut case.promptgen(&package, &["check"]));
        assert!(checked.status.success(), "{at}: check after the next run: {}", text(&checked));
    }
    panic!("{store}: more than {MOST_POINTS} calls of {syscall}: the run never ended by itself");
}

#[test]
#[ignore = "a sweep of a few hundred runs under strace: .ci/run runs it"]
fn every_crash_point_of_the_repo_store_leaves_a_record_that_reads_and_a_next_run_that_finishes_it() {
    let points = sweep("repo");
    eprintln!("repo store: {points} crash points, each survived");
}

#[test]
#[ignore = "a sweep of a few hundred runs under strace: .ci/run runs it"]
fn every_crash_point_of_the_cache_store_leaves_a_record_that_reads_and_a_next_run_that_finishes_it() {
    let points = sweep("cache");
    eprintln!("cache store: {points} crash points, each survived");
}
