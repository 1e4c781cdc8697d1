//! Checks run confined (issue 13): real processes under the real Landlock of this machine.
//!
//! First the confinement itself, with a shell as the confined process: it reads the package's
//! sources, and not a canary file outside the package, nor the package's `.env`, `.git` or
//! keys; it cannot connect to a TCP listener on loopback that the test starts, read another
//! process's environment or signal it; it writes only where allowed. Then end to end through
//! `cargo promptgen` against the fake LLM server, offline, with a secret variable in its
//! environment: a crate with a registry dependency checks and passes confined; the same crate
//! with hand-written tests that read a canary outside the package, the package's `.env` and
//! the secret variable (printing them reversed, past the redaction of known secrets), connect
//! to loopback and write outside, under `check = "cargo test"`; and a command check that does
//! the same with `cat`. The model sees permission errors, and no request holds a canary. The
//! `cargo test` one runs the same crate unconfined too (`PROMPTGEN_UNCONFINED_CHECKS=1`), where
//! the files' canaries do leak: the test can fail.
//!
//! On a machine without Landlock each test prints that confinement is not tested; the
//! end-to-end ones then check that checks run unconfined after a warning.

use std::io::ErrorKind;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};

use cargo_promptgen::__private::confine::{self, Policy, Toolchain, UNCONFINED_VAR};
use promptgen_tests::FakeLlm;

use crate::support;
use crate::support::{Package, finish, last_message, run, stderr, text, unseeded_chain, write};

/// This machine's Landlock ABI, or `None` after printing why there is none (the tests that
/// need it then stop, and the end-to-end ones check the warning instead).
fn landlock() -> Option<i32> {
    let why = match confine::kernel_abi() {
        Ok(abi) if abi >= 2 => return Some(abi),
        Ok(abi) => format!("the kernel's Landlock is ABI {abi}, and checks are confined from ABI 2 on"),
        Err(why) => why,
    };
    eprintln!("\n*** LANDLOCK UNAVAILABLE: {why}.\n*** Confinement is NOT tested here. ***\n");
    None
}

/// A package folder with sources and protected files, and a canary file outside it.
struct Scene {
    package: tempfile::TempDir,
    outside: tempfile::TempDir,
    tmp: tempfile::TempDir,
}

const CANARY: &str = "canary-outside-5be0c1";
const ENV_CANARY: &str = "canary-env-93d4aa";

impl Scene {
    fn new() -> Scene {
        let scene = Scene {
            package: tempfile::Builder::new().prefix("pg-confine-pkg-").tempdir().unwrap(),
            outside: tempfile::Builder::new().prefix("pg-confine-outside-").tempdir().unwrap(),
            tmp: tempfile::Builder::new().prefix("pg-confine-tmp-").tempdir().unwrap(),
        };
        let files = [
            ("Cargo.toml", "[package]\nname = \"p\"\n"),
            ("src/lib.rs", "pub fn f() {}\n"),
            ("src/deep/mod.rs", "pub fn g() {}\n"),
            (".env", &format!("SECRET={ENV_CANARY}\n")),
            (".env.local", &format!("SECRET={ENV_CANARY}\n")),
            (".git/config", &format!("[remote] token = {ENV_CANARY}\n")),
            ("config/server.pem", &format!("{ENV_CANARY}\n")),
            ("config/settings.toml", "level = 1\n"),
            (".cargo/credentials.toml", &format!("token = \"{ENV_CANARY}\"\n")),
            (".cargo/config.toml", "[build]\n"),
            ("target/debug/leftover", &format!("{ENV_CANARY}\n")),
        ];
        for (path, content) in files {
            let path = scene.package.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
        }
        std::fs::write(scene.outside.path().join("canary.txt"), CANARY).unwrap();
        scene
    }

    fn pkg(&self, path: &str) -> String {
        self.package.path().join(path).display().to_string()
    }

    fn canary(&self) -> String {
        self.outside.path().join("canary.txt").display().to_string()
    }

    /// The policy of a check of this package: the system, the toolchain, the package, and
    /// the scratch folder to write.
    fn policy(&self) -> Policy {
        let mut policy = Policy::base(&Toolchain::find(self.package.path()).unwrap());
        policy.allow_package(self.package.path());
        policy.write.insert(self.tmp.path().to_path_buf());
        policy
    }

    /// `bash -c script`, confined at `abi` (unconfined when `None`).
    fn bash(&self, abi: Option<i32>, script: &str) -> Output {
        let mut command = Command::new("/bin/bash");
        command.args(["-c", script]).current_dir(self.package.path());
        if let Some(abi) = abi {
            confine::confine(&mut command, &self.policy(), abi, self.tmp.path()).unwrap();
        }
        command.output().unwrap()
    }
}

fn out(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

#[test]
fn a_confined_process_reads_the_package_sources_but_not_a_file_outside_nor_the_packages_secrets() {
    let Some(abi) = landlock() else { return };
    let scene = Scene::new();
    for readable in ["Cargo.toml", "src/lib.rs", "src/deep/mod.rs", "config/settings.toml", ".cargo/config.toml"] {
        let output = scene.bash(Some(abi), &format!("cat '{}'", scene.pkg(readable)));
        assert!(output.status.success(), "{readable}: {}", out(&output));
    }
    let secrets =
        [".env", ".env.local", ".git/config", "config/server.pem", ".cargo/credentials.toml", "target/debug/leftover"];
    let paths: Vec<String> = secrets.iter().map(|s| scene.pkg(s)).chain([scene.canary()]).collect();
    for path in &paths {
        // Unconfined, the file is there to be read: the confined refusal is the confinement's.
        let open = scene.bash(None, &format!("cat '{path}'"));
        assert!(open.status.success() && out(&open).contains("canary-"), "{path}: {}", out(&open));
        let confined = scene.bash(Some(abi), &format!("cat '{path}'"));
        assert!(!confined.status.success(), "{path} was read: {}", out(&confined));
        assert!(
            out(&confined).contains("Permission denied") && !out(&confined).contains("canary-"),
            "{path}: {}",
            out(&confined)
        );
    }
    // Folders that hold a protected entry can be listed (names only), and the rest read.
    let listed = scene.bash(
        Some(abi),
        &format!(
            "ls -a '{}' && ls '{}' && cat '{}'",
            scene.pkg(""),
            scene.pkg("config"),
            scene.pkg("config/settings.toml")
        ),
    );
    assert!(
        listed.status.success() && out(&listed).contains(".env") && out(&listed).contains("level = 1"),
        "{}",
        out(&listed)
    );
    // A file outside cannot be listed either, nor found by listing its folder.
    let outside = scene.bash(Some(abi), &format!("ls '{}'", scene.outside.path().display()));
    assert!(!outside.status.success() && out(&outside).contains("Permission denied"), "{}", out(&outside));
}

#[test]
fn a_confined_process_cannot_connect_to_a_tcp_listener_on_loopback() {
    let Some(abi) = landlock() else { return };
    let scene = Scene::new();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let connect = format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected");
    let confined = scene.bash(Some(abi), &connect);
    if abi >= 4 {
        assert!(!confined.status.success() && out(&confined).contains("Permission denied"), "{}", out(&confined));
        assert_eq!(
            listener.accept().map(|_| ()).map_err(|e| e.kind()),
            Err(ErrorKind::WouldBlock),
            "no connection arrived"
        );
    } else {
        eprintln!("*** Landlock ABI {abi} cannot refuse TCP (ABI 4 can): only checked that connections still work ***");
    }
    // Unconfined the same command connects: the refusal above is the confinement's.
    let open = scene.bash(None, &connect);
    assert!(open.status.success() && out(&open).contains("connected"), "{}", out(&open));
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(listener.accept().is_ok(), "the unconfined connection arrived");
    // At ABI 2 and 3 the files are confined and the network is not (what older kernels give).
    let old = scene.bash(Some(2), &format!("{connect}; cat '{}'", scene.canary()));
    assert!(out(&old).contains("connected") && out(&old).contains("Permission denied"), "{}", out(&old));
}

#[test]
fn a_confined_process_writes_only_where_it_may() {
    let Some(abi) = landlock() else { return };
    let scene = Scene::new();
    let allowed = scene.tmp.path().join("made/here.txt");
    let output = scene.bash(
        Some(abi),
        &format!(
            "mkdir -p '{0}' && echo ok > '{1}' && mv '{1}' '{1}.moved' && cat '{1}.moved' > /dev/null",
            allowed.parent().unwrap().display(),
            allowed.display()
        ),
    );
    assert!(output.status.success(), "{}", out(&output));
    assert_eq!(std::fs::read_to_string(allowed.with_extension("txt.moved")).unwrap(), "ok\n");
    let refused = [
        scene.pkg("new.rs"),
        scene.pkg("src/lib.rs"),
        scene.pkg(".env"),
        scene.outside.path().join("new.txt").display().to_string(),
        scene.canary(),
    ];
    for path in refused {
        let before = std::fs::read(&path).ok();
        let output = scene.bash(Some(abi), &format!("echo pwned > '{path}'"));
        assert!(!output.status.success() && out(&output).contains("Permission denied"), "{path}: {}", out(&output));
        assert_eq!(std::fs::read(&path).ok(), before, "{path} unchanged");
    }
    let removed =
        scene.bash(Some(abi), &format!("rm -f '{}' || rm -rf '{}'", scene.pkg("src/lib.rs"), scene.pkg("src")));
    assert!(!removed.status.success() && Path::new(&scene.pkg("src/lib.rs")).exists(), "{}", out(&removed));
}

#[test]
fn a_confined_process_cannot_read_the_environment_of_a_process_outside_nor_signal_it() {
    let Some(abi) = landlock() else { return };
    let scene = Scene::new();
    let mut outside = Command::new("/bin/sleep").arg("30").env("MY_OWN_SECRET", CANARY).spawn().unwrap();
    let pid = outside.id();
    let read = format!("tr '\\0' '\\n' < /proc/{pid}/environ");
    let open = scene.bash(None, &read);
    assert!(out(&open).contains(CANARY), "unconfined, the environment is readable: {}", out(&open));
    let confined = scene.bash(Some(abi), &read);
    assert!(!confined.status.success() && !out(&confined).contains(CANARY), "{}", out(&confined));
    if abi >= 6 {
        let signal = scene.bash(Some(abi), &format!("kill -TERM {pid}"));
        assert!(!signal.status.success(), "{}", out(&signal));
    }
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(outside.try_wait().unwrap().is_none(), "the process outside still runs");
    outside.kill().unwrap();
    outside.wait().unwrap();
}

/// One step checked by `cargo test`, with one repair round.
fn metadata() -> String {
    unseeded_chain("check = \"cargo test\"\ncheck_rounds = 1\n", &["greeting.rs"])
}

const GREETING: &str = "pub fn greeting() -> String {\n    serde_json::to_string(\"hello\").unwrap()\n}\n";

/// A secret in the environment of `cargo promptgen` (its name says so: the checks go without it).
const SECRET_VAR: &str = "DEPLOY_TOKEN";
const VAR_CANARY: &str = "canary-var-61f2e7";
/// A variable whose name says nothing of a secret: the checks keep it.
const PLAIN_VAR: &str = "PROMPTGEN_TEST_PLAIN";

/// A crate that uses serde_json (from the registry cache: the tests run offline) and mounts
/// the generated `greeting.rs`, with a test of it; `extra_tests` go beside that test.
fn crate_with_tests(extra_tests: &str) -> Package {
    let package = Package::with_dependencies(&metadata(), "", "serde_json = \"1\"\n");
    let main = format!(
        r##"#[allow(dead_code)]
mod generated {{
    include!(concat!(env!("OUT_DIR"), "/promptgen.rs"));
}}

fn main() {{
    println!("{{}}", generated::greeting::greeting());
}}

#[cfg(test)]
mod tests {{
    #[test]
    fn greets() {{
        assert_eq!(super::generated::greeting::greeting(), "\"hello\"");
    }}
{extra_tests}}}
"##
    );
    package.write("src/main.rs", &main);
    package.write(".env", &format!("API_KEY={ENV_CANARY}\n"));
    package.write("prompts/01.md", "Write greeting.rs: greeting() returns \"hello\" as JSON.\n");
    package.write("Cargo.lock", &support::workspace_lock());
    package
}

/// Tests that read `canary` (outside the package), the package's `.env` and the environment,
/// connect to `addr`, and write `pwned` outside the package and into its sources, each
/// failing with what it got. What they read they print reversed, as a hostile test would,
/// so that the redaction of known secrets cannot hide a leak: only the confinement and the
/// scrubbed environment stand between the canaries and the model.
fn leaky_tests(canary: &Path, addr: &str, pwned: &Path) -> String {
    format!(
        r##"
    fn reversed(text: &str) -> String {{
        text.chars().rev().collect()
    }}

    #[test]
    fn reads_a_file_outside_the_package() {{
        let text = std::fs::read_to_string({canary:?}).map(|t| reversed(&t)).unwrap_or_else(|e| format!("cannot: {{e}}"));
        panic!("outside: {{text}}");
    }}

    #[test]
    fn reads_the_packages_dotenv() {{
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/.e", "nv");
        let text = std::fs::read_to_string(path).map(|t| reversed(&t)).unwrap_or_else(|e| format!("cannot: {{e}}"));
        panic!("dotenv: {{text}}");
    }}

    #[test]
    fn reads_the_environment() {{
        let get = |name: &str| std::env::var(name).map(|v| reversed(&v)).map_err(|e| e.to_string());
        panic!("secret var: {{:?}}; plain var: {{:?}}", get({SECRET_VAR:?}), get({PLAIN_VAR:?}));
    }}

    #[test]
    fn connects_to_loopback() {{
        let result = std::net::TcpStream::connect({addr:?}).map(|_| "connected").map_err(|e| e.to_string());
        panic!("connect: {{result:?}}");
    }}

    #[test]
    fn writes_outside() {{
        let outside = std::fs::write({pwned:?}, "pwned").map_err(|e| e.to_string());
        let source = std::fs::write(concat!(env!("CARGO_MANIFEST_DIR"), "/src/pwned.rs"), "pwned").map_err(|e| e.to_string());
        panic!("write outside: {{outside:?}}; write source: {{source:?}}");
    }}
"##
    )
}

fn reversed(text: &str) -> String {
    text.chars().rev().collect()
}

/// Whether any request to `server` holds one of the canaries, as written or reversed.
fn leaked(server: &FakeLlm) -> Vec<String> {
    let canaries = [CANARY, ENV_CANARY, VAR_CANARY];
    let mut found = Vec::new();
    for request in server.requests() {
        for canary in canaries.iter().flat_map(|c| [c.to_string(), reversed(c)]) {
            if request.body.contains(&canary) {
                found.push(canary);
            }
        }
    }
    found
}

/// `cargo promptgen` on `package` against a fake server whose model writes the greeting, is
/// told what the check says, and writes it again; offline, with a secret in the environment.
fn run_chain(package: &Package, unconfined: bool) -> (FakeLlm, Output) {
    let server =
        FakeLlm::start(vec![write("greeting.rs", GREETING), finish(), write("greeting.rs", GREETING), finish()]);
    let mut command = package.promptgen(&[]);
    command
        .env("PROMPTGEN_BASE_URL", server.url())
        .env("CARGO_NET_OFFLINE", "true")
        .env(SECRET_VAR, VAR_CANARY)
        .env(PLAIN_VAR, "plain-value")
        .env_remove(UNCONFINED_VAR);
    if unconfined {
        command.env(UNCONFINED_VAR, "1");
    }
    let output = run(&mut command);
    (server, output)
}

fn outside_canary() -> (tempfile::TempDir, std::path::PathBuf) {
    let outside = tempfile::Builder::new().prefix("pg-confine-outside-").tempdir().unwrap();
    let canary = outside.path().join("canary.txt");
    std::fs::write(&canary, CANARY).unwrap();
    (outside, canary)
}

#[test]
fn a_crate_whose_tests_use_a_registry_dependency_checks_and_passes_confined() {
    let abi = landlock();
    let package = crate_with_tests("");
    let (server, output) = run_chain(&package, false);
    assert!(output.status.success(), "{}", text(&output));
    assert_eq!(server.requests().len(), 2, "{}", text(&output));
    assert!(package.path("promptgen.lock").exists(), "{}", text(&output));
    if abi.is_some() {
        assert!(!stderr(&output).contains("unconfined"), "{}", text(&output));
    }
    // The confined build wrote only to its target folder: the package holds no new file.
    assert!(!package.path("src/pwned.rs").exists());
}

#[test]
fn a_cargo_test_check_never_gets_a_canary_to_the_model() {
    let abi = landlock();
    let (outside, canary) = outside_canary();
    let pwned = outside.path().join("pwned.txt");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let package = crate_with_tests(&leaky_tests(&canary, &listener.local_addr().unwrap().to_string(), &pwned));

    let (server, output) = run_chain(&package, false);
    assert_eq!(output.status.code(), Some(1), "the tests fail, and so does the step: {}", text(&output));
    assert_eq!(server.requests().len(), 4, "{}", text(&output));
    let told = last_message(&server.requests()[2]);
    for test in
        ["reads_a_file_outside_the_package", "reads_the_packages_dotenv", "reads_the_environment", "writes_outside"]
    {
        assert!(told.contains(test), "the model is told of `{test}`:\n{told}");
    }
    assert!(!told.contains("greets"), "{told}");
    // The environment is scrubbed, confined or not (item 4).
    assert!(told.contains("secret var: Err(\"environment variable not found\")"), "{told}");
    assert!(told.contains(&format!("plain var: Ok({:?})", reversed("plain-value"))), "{told}");
    assert_eq!(leaked(&server), Vec::<String>::new(), "a canary reached the server");
    assert!(!text(&output).contains(CANARY) && !text(&output).contains(ENV_CANARY), "{}", text(&output));
    if let Some(abi) = abi {
        assert!(told.contains("outside: cannot: Permission denied"), "{told}");
        assert!(told.contains("dotenv: cannot: Permission denied"), "{told}");
        assert!(
            told.contains(
                "write outside: Err(\"Permission denied (os error 13)\"); write source: Err(\"Permission denied"
            ),
            "{told}"
        );
        assert!(!pwned.exists() && !package.path("src/pwned.rs").exists());
        if abi >= 4 {
            assert!(told.contains("connect: Err(\"Permission denied"), "{told}");
            assert_eq!(
                listener.accept().map(|_| ()).map_err(|e| e.kind()),
                Err(ErrorKind::WouldBlock),
                "no connection arrived"
            );
        }
        assert!(!stderr(&output).contains("unconfined"), "{}", text(&output));
    } else {
        assert!(stderr(&output).contains("warning: checks run unconfined: "), "{}", text(&output));
    }
    assert!(stderr(&output).contains("step `01` failed"), "{}", text(&output));
    assert!(!package.path("promptgen.lock").exists(), "a failed step records nothing");

    // The same crate unconfined: the files' canaries reach the model, so the test above can
    // fail. The environment's does not: the scrubbing does not depend on the confinement.
    std::fs::remove_file(&pwned).ok();
    let (server, output) = run_chain(&package, true);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    let told = last_message(&server.requests()[2]);
    assert!(told.contains(&format!("outside: {}", reversed(CANARY))) && told.contains(&reversed(ENV_CANARY)), "{told}");
    assert!(told.contains("connect: Ok(\"connected\")"), "{told}");
    assert!(told.contains("secret var: Err(\"environment variable not found\")"), "{told}");
    assert!(pwned.exists(), "unconfined, the test wrote outside the package");
    let warning = format!(
        "warning: checks run unconfined: {UNCONFINED_VAR} is set; generated code run by `cargo test` can read any file your user can"
    );
    assert_eq!(stderr(&output).matches(&warning).count(), 1, "warned once: {}", text(&output));
}

#[test]
fn a_command_check_is_confined_too() {
    let abi = landlock();
    let (outside, canary) = outside_canary();
    let pwned = outside.path().join("pwned.txt");
    // The command reads the tree and the package's sources, which it may, then the canary,
    // `.env` and the secret variable, printed reversed past the redaction; then it writes
    // outside the package, and into its sources.
    let script = format!(
        "cat \"$PROMPTGEN_TREE/greeting.rs\" src/main.rs; for f in {canary} .env; do cat \"$f\" 2>&1 | rev; done; \
         echo \"var=${SECRET_VAR}\" | rev; echo pwned > {pwned} || echo outside-refused; echo pwned > src/pwned.rs || echo source-refused; exit 1",
        canary = canary.display(),
        pwned = pwned.display(),
    );
    let metadata = metadata().replace("check = \"cargo test\"", &format!("check = [\"sh\", \"-c\", {script:?}]"));
    let package = Package::new(&metadata, "println!(\"{}\", generated::greeting::greeting());");
    package.write(".env", &format!("API_KEY={ENV_CANARY}\n"));
    package.write("prompts/01.md", "Write greeting.rs.\n");
    let (server, output) = run_chain(&package, false);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    let told = last_message(&server.requests()[2]);
    let unreversed: String = told.lines().map(|line| reversed(line) + "\n").collect();
    // The tree and the package's sources are read; the canaries are not.
    assert!(told.contains("serde_json::to_string") && told.contains("fn main()"), "{told}");
    assert!(unreversed.contains("var=\n"), "the secret variable is unset: {told}");
    assert_eq!(leaked(&server), Vec::<String>::new(), "a canary reached the server");
    if abi.is_some() {
        assert!(unreversed.contains(&format!("cat: {}: Permission denied", canary.display())), "{told}");
        assert!(unreversed.contains("cat: .env: Permission denied"), "{told}");
        assert!(told.contains("outside-refused") && told.contains("source-refused"), "{told}");
        assert!(!pwned.exists() && !package.path("src/pwned.rs").exists());
    } else {
        assert!(unreversed.contains(CANARY), "unconfined: {told}");
    }
}
