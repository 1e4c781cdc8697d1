//! What the modules of this binary share: throwaway packages and a way to run the real
//! `cargo-promptgen` binary and `cargo` on them, the chains they declare and the code the fake
//! models write ([`chains`]), and the looks the tests take at what came of a run.

mod chains;
pub mod cutting_proxy;

pub use chains::{A, A_BROKEN, A1, A2, B, B1, B2, C, chain, unseeded_chain, with_step_keys};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cargo_promptgen::__private::Lock;
use promptgen_tests::{FakeLlm, RecordedRequest, Reply, Turn};
use serde_json::json;

/// A package in a temporary folder, outside the workspace, with a prompt chain.
pub struct Package {
    pub dir: tempfile::TempDir,
    pub name: String,
}

impl Package {
    /// A package named `pg-e2e-<unique>` whose build script calls cargo-promptgen and whose
    /// `main` mounts the generated modules under `generated` (the crate convention) and runs
    /// `main_body`.
    pub fn new(metadata: &str, main_body: &str) -> Package {
        Package::with_dependencies(metadata, main_body, "")
    }

    /// [`Package::new`] with `dependencies` (TOML lines) under `[dependencies]`.
    pub fn with_dependencies(metadata: &str, main_body: &str, dependencies: &str) -> Package {
        let dir = tempfile::Builder::new().prefix("pg-e2e-").tempdir().unwrap();
        let name = format!("pg-e2e-{}", unique_id());
        let promptgen = Path::new(env!("CARGO_MANIFEST_DIR"));
        let manifest = format!(
            r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2021"
publish = false

[dependencies]
{dependencies}

[build-dependencies]
cargo-promptgen = {{ path = "{}", default-features = false, features = ["online"] }}

[workspace]

{metadata}
"#,
            promptgen.display()
        );
        std::fs::write(dir.path().join("Cargo.toml"), manifest).unwrap();
        std::fs::write(
            dir.path().join("build.rs"),
            "fn main() -> Result<(), cargo_promptgen::Error> {\n    cargo_promptgen::build()\n}\n",
        )
        .unwrap();
        std::fs::create_dir_all(dir.path().join("src")).unwrap();
        let main = format!(
            "#[allow(dead_code)]\nmod generated {{\n    include!(concat!(env!(\"OUT_DIR\"), \"/promptgen.rs\"));\n}}\n\nfn main() {{\n    {main_body}\n}}\n"
        );
        std::fs::write(dir.path().join("src/main.rs"), main).unwrap();
        Package { dir, name }
    }

    /// A crate as users have them: `metadata`, serde and serde_json from crates.io, the
    /// hand-written [`DOMAIN`] as `src/domain.rs`, and `main` as `src/main.rs`; its
    /// dependencies resolve offline (see [`Package::resolve_from_the_workspace_lock`]).
    pub fn realistic(metadata: &str, main: &str) -> Package {
        let package = Package::with_dependencies(metadata, "", SERDE_DEPENDENCIES);
        package.write("src/domain.rs", DOMAIN);
        package.write("src/main.rs", main);
        package.resolve_from_the_workspace_lock();
        package
    }

    /// A [`Package::realistic`] crate whose step `01` writes `user_json.rs` ([`USER_JSON_MAIN`]
    /// uses it), with that step's prompt.
    pub fn user_json(metadata: &str) -> Package {
        let package = Package::realistic(metadata, USER_JSON_MAIN);
        package.write("prompts/01.md", "Write user_json.rs: to_json and describe for crate::domain::User.\n");
        package
    }

    /// Starts from the workspace's `Cargo.lock`, pruned to this package (as a real crate's
    /// is) by an offline `cargo metadata`, so that its registry dependencies resolve offline
    /// to versions the registry cache holds.
    pub fn resolve_from_the_workspace_lock(&self) {
        self.write("Cargo.lock", &workspace_lock());
        let out = run(&mut self.cargo(&["metadata", "--format-version", "1", "--offline"]));
        assert!(out.status.success(), "{}", text(&out));
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn write(&self, rel: &str, text: &str) {
        let path = self.path(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    /// `cargo promptgen <args>` as cargo runs it, from the package folder.
    pub fn promptgen(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_cargo-promptgen"));
        command.arg("promptgen").args(args).current_dir(self.dir.path());
        clean_env(&mut command);
        command
    }

    /// `cargo <args>` in the package folder, with a target folder shared by these tests.
    pub fn cargo(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO"));
        command.args(args).current_dir(self.dir.path());
        clean_env(&mut command);
        command
    }
}

/// The sentence of the example's `prompts/step_04_app.md` as the step was first recorded, and
/// as it reads now: the change the example's step 04 was re-run by edit for (see
/// `prompts/scripts/step_04_app.toml`).
pub const PROMPT_04_FIRST: &str = "Give it a `///` doc comment. Write nothing else in the file.";
pub const PROMPT_04_CHANGED: &str =
    "Give it a `///` doc comment that also says what it returns on an error. Write nothing\nelse in the file.";

/// serde (with its derive) and serde_json: the crates.io dependencies of [`Package::realistic`].
pub const SERDE_DEPENDENCIES: &str = "serde = { version = \"1\", features = [\"derive\"] }\nserde_json = \"1\"\n";

/// The hand-written module of [`Package::realistic`], which generated code uses.
pub const DOMAIN: &str =
    "#[derive(serde::Serialize)]\npub struct User {\n    pub name: String,\n    pub age: u32,\n}\n";

/// `src/main.rs` of [`Package::realistic`] crates whose step writes `user_json.rs`: it mounts
/// the generated modules, and its tests, which use them, are the step's acceptance test.
pub const USER_JSON_MAIN: &str = r##"mod domain;

#[allow(dead_code)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/promptgen.rs"));
}

fn main() {
    let user = domain::User { name: "Ada".into(), age: 36 };
    println!("{}", generated::user_json::to_json(&user));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ada() -> domain::User {
        domain::User { name: "Ada".into(), age: 36 }
    }

    #[test]
    fn json_has_every_field() {
        assert_eq!(generated::user_json::to_json(&ada()), r#"{"name":"Ada","age":36}"#);
    }

    #[test]
    fn the_description_names_the_user_and_the_age() {
        assert_eq!(generated::user_json::describe(&ada()), "Ada (36)");
    }
}
"##;

/// `user_json.rs` done right: serde_json and the crate's own `domain::User`.
pub const USER_JSON_GOOD: &str = "use crate::domain::User;\n\npub fn to_json(user: &User) -> String {\n    serde_json::to_string(user).expect(\"a User always serialises\")\n}\n\npub fn describe(user: &User) -> String {\n    format!(\"{} ({})\", user.name, user.age)\n}\n";
/// `user_json.rs` that compiles alone; only the crate shows that `User` has no field `nmae`
/// (E0609).
pub const USER_JSON_TYPO: &str = "use crate::domain::User;\n\npub fn to_json(user: &User) -> String {\n    serde_json::to_string(user).expect(\"a User always serialises\")\n}\n\npub fn describe(user: &User) -> String {\n    format!(\"{} ({})\", user.nmae, user.age)\n}\n";
/// `user_json.rs` that compiles and fails the crate's test of the description.
pub const USER_JSON_WRONG: &str = "use crate::domain::User;\n\npub fn to_json(user: &User) -> String {\n    serde_json::to_string(user).expect(\"a User always serialises\")\n}\n\npub fn describe(user: &User) -> String {\n    format!(\"{}, {}\", user.name, user.age)\n}\n";

/// The workspace's `Cargo.lock`.
pub fn workspace_lock() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.lock")).unwrap()
}

/// The environment a user's shell would have: none of the variables that switch promptgen
/// to offline mode or point it elsewhere, and one target folder for every throwaway package
/// so their dependencies compile once.
fn clean_env(command: &mut Command) {
    for var in [
        "CI",
        "PROMPTGEN_OFFLINE",
        "PROMPTGEN_BACKEND",
        "PROMPTGEN_MODEL",
        "PROMPTGEN_BASE_URL",
        "OLLAMA_HOST",
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
        "PROMPTGEN_CACHE_DIR",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
    ] {
        command.env_remove(var);
    }
    // Never the developer's own AWS profiles.
    command.env("AWS_CONFIG_FILE", shared_target().join("no-aws-config"));
    command.env("AWS_SHARED_CREDENTIALS_FILE", shared_target().join("no-aws-credentials"));
    command.env("CARGO_TARGET_DIR", shared_target());
}

pub fn shared_target() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e-packages")
}

/// Where a build of `package` leaves results for `accept`.
pub fn pending_dir(package: &Package) -> PathBuf {
    shared_target().join("promptgen/pending").join(&package.name)
}

/// `cargo promptgen <args>` in `package` against `server`, offline: a crate with registry
/// dependencies resolves them from the registry cache.
pub fn promptgen_offline(package: &Package, server: &FakeLlm, args: &[&str]) -> Output {
    run(package.promptgen(args).env("PROMPTGEN_BASE_URL", server.url()).env("CARGO_NET_OFFLINE", "true"))
}

pub fn run(command: &mut Command) -> Output {
    command.output().unwrap()
}

pub fn text(output: &Output) -> String {
    format!(
        "status: {}\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A name no other of these tests' packages (or S3 prefixes) has had, in this run or an
/// earlier one: the shared target folder keeps pending areas and check folders by package
/// name. The process and the time tell runs apart; a count tells apart the names made in one
/// process, whose tests all run as its threads, even in the same nanosecond.
pub fn unique_id() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{SystemTime, UNIX_EPOCH};
    static MADE: AtomicUsize = AtomicUsize::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("{}-{nanos}-{}", std::process::id(), MADE.fetch_add(1, Ordering::Relaxed))
}

/// A scripted reply that writes `content` to `path`.
pub fn write(path: &str, content: &str) -> Reply {
    Reply::turn(Turn::call("write_file", json!({"path": path, "content": content})))
}

/// A scripted reply that calls `finish`.
pub fn finish() -> Reply {
    Reply::turn(Turn::call("finish", json!({"summary": "done"})))
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `package`'s lock.
pub fn lock_of(package: &Package) -> Lock {
    Lock::read(&package.path("promptgen.lock")).expect("the lock parses")
}

/// `check` (with `env` set) exits 1 and its report on step 01 contains every phrase of
/// `reasons`; that line of the report.
pub fn assert_stale(package: &Package, env: &[(&str, &str)], reasons: &[&str]) -> String {
    let mut command = package.promptgen(&["check"]);
    command.envs(env.iter().copied());
    let out = run(&mut command);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = stdout(&out);
    let line = report.lines().find(|l| l.trim_start().starts_with("step 01:")).unwrap_or_else(|| panic!("{report}"));
    for reason in reasons {
        assert!(line.contains(reason), "expected `{reason}` in:\n{report}");
    }
    line.to_string()
}

/// `check` (with `env` set) passes on a one-step package.
pub fn assert_fresh(package: &Package, env: &[(&str, &str)]) {
    let mut command = package.promptgen(&["check"]);
    command.envs(env.iter().copied());
    let out = run(&mut command);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stdout(&out).contains("All 1 steps of"), "{}", text(&out));
}

/// The content of the last message a request sent: what the model was told last (a tool's
/// answer, after a tool call).
pub fn last_message(request: &RecordedRequest) -> String {
    let body = request.json();
    let messages = body["messages"].as_array().unwrap_or_else(|| panic!("no messages in {body}"));
    messages.last().and_then(|m| m["content"].as_str()).unwrap_or_default().to_string()
}

/// Replaces the one occurrence of `from` in the package file `rel` with `to`.
pub fn edit(package: &Package, rel: &str, from: &str, to: &str) {
    let old = package.read(rel);
    assert_eq!(old.matches(from).count(), 1, "`{from}` should occur once in {rel}:\n{old}");
    package.write(rel, &old.replacen(from, to, 1));
}

/// Copies the tree `from` to `to`, creating `to`.
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Every file under `dir`, by relative path, with its bytes; folders as `<path>/`.
pub fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            let rel = path.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
            if entry.file_type().unwrap().is_dir() {
                out.insert(format!("{rel}/"), Vec::new());
                walk(root, &path, out);
            } else {
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// The differences between two snapshots, as readable lines.
pub fn changes(before: &BTreeMap<String, Vec<u8>>, after: &BTreeMap<String, Vec<u8>>) -> Vec<String> {
    let mut lines = Vec::new();
    for (path, bytes) in before {
        match after.get(path) {
            None => lines.push(format!("removed {path}")),
            Some(now) if now != bytes => lines.push(format!("changed {path}")),
            Some(_) => {}
        }
    }
    for path in after.keys().filter(|p| !before.contains_key(*p)) {
        lines.push(format!("added {path}"));
    }
    lines
}
