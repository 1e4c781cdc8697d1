//! Checks in the crate, as a user with a real crate meets them: the package depends on
//! crates.io crates (serde, serde_json), has a hand-written module the generated code uses,
//! and a `main.rs` and tests that use the generated code. Real binary, real `cargo`, the fake
//! LLM server on loopback.
//!
//! Covered: correct code passes the default check (`cargo check`) first time; a mistake only
//! the crate reveals (a wrong field name) reaches the model with the compiler's message and
//! the fix is recorded; under `cargo test` a failing hand-written test reaches the model by
//! name; silence after a refused `finish` fails the step and records nothing; an online build
//! that regenerates (cargo inside cargo) finishes; a chain written from nothing puts off what
//! later steps own and checks it in full at the end; `seed_retries`; secrets in the
//! environment never reach the model through a test's output.

use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use promptgen_tests::{FakeLlm, Reply, Turn};

use crate::support;
use crate::support::{
    A, B, Package, USER_JSON_GOOD, USER_JSON_MAIN, USER_JSON_TYPO, USER_JSON_WRONG, changes, finish, last_message,
    lock_of, promptgen_offline, run, snapshot, stderr, text, unseeded_chain, with_step_keys, write,
};

/// A package with serde and serde_json, `src/domain.rs` and a `main.rs` with tests that use
/// the generated module; its one step's metadata (seed 7) changed by `edit` first. It resolves
/// its dependencies from the workspace's lock file, offline.
fn package(edit: impl Fn(&str) -> String) -> Package {
    Package::user_json(&edit(&unseeded_chain("seed = 7\n", &["user_json.rs"])))
}

#[test]
fn correct_code_that_uses_the_crate_and_its_dependencies_passes_the_default_check_first_time() {
    let server = FakeLlm::start(vec![write("user_json.rs", USER_JSON_GOOD), finish()]);
    let package = package(|m| m.to_string());
    let out = promptgen_offline(&package, &server, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.requests().len(), 2, "{}", text(&out));
    let step = lock_of(&package).steps[0].clone();
    assert_eq!((step.check_rounds, step.repairs), (0, 0), "{step:?}");
    assert_eq!(step.fingerprint.check.as_deref(), Some("cargo check"));
    // The system prompt names the check; the crate's own files are readable.
    let system = server.requests()[0].json()["messages"][0]["content"].as_str().unwrap().to_string();
    assert!(system.contains("must pass the check `cargo check`"), "{system}");
    let out = run(package.cargo(&["run", "--quiet"]).env("PROMPTGEN_OFFLINE", "1").env("CARGO_NET_OFFLINE", "true"));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), r#"{"name":"Ada","age":36}"#, "{}", text(&out));
}

#[test]
fn a_mistake_only_the_crate_shows_reaches_the_model_with_the_compilers_message_and_the_fix_is_recorded() {
    let server = FakeLlm::start(vec![
        write("user_json.rs", USER_JSON_TYPO),
        finish(),
        Reply::turn(Turn::call("read_file", serde_json::json!({"path": "src/domain.rs"}))),
        write("user_json.rs", USER_JSON_GOOD),
        finish(),
    ]);
    let package = package(|m| m.to_string());
    let out = promptgen_offline(&package, &server, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.requests().len(), 5, "{}", text(&out));
    let refusal = last_message(&server.requests()[2]);
    for phrase in
        ["`finish` refused", "`cargo check`", "error[E0609]", "no field `nmae`", "user_json.rs:8:", "user.nmae"]
    {
        assert!(refusal.contains(phrase), "expected `{phrase}` in:\n{refusal}");
    }
    for leak in ["/out/promptgen", "check-target", "/tmp/", &package.dir.path().display().to_string()] {
        assert!(!refusal.contains(leak), "a build path leaks ({leak}):\n{refusal}");
    }
    // The crate's file the message points at can be read.
    let read = last_message(&server.requests()[3]);
    assert!(read.contains("pub struct User") && read.contains("pub name: String"), "{read}");
    let step = lock_of(&package).steps[0].clone();
    assert_eq!(step.check_rounds, 1, "{step:?}");
    assert_eq!(package.read("promptgen/01/user_json.rs"), USER_JSON_GOOD);
}

#[test]
fn under_cargo_test_a_failing_hand_written_test_reaches_the_model_by_name_and_the_fix_is_recorded() {
    let server = FakeLlm::start(vec![
        write("user_json.rs", USER_JSON_WRONG),
        finish(),
        write("user_json.rs", USER_JSON_GOOD),
        finish(),
    ]);
    let package = package(|m| m.replace("seed = 7\n", "seed = 7\ncheck = \"cargo test\"\n"));
    let out = promptgen_offline(&package, &server, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.requests().len(), 4, "{}", text(&out));
    let refusal = last_message(&server.requests()[2]);
    for phrase in [
        "`cargo test`",
        "1 test failed",
        "test `tests::the_description_names_the_user_and_the_age`",
        "assertion `left == right` failed",
        "\"Ada, 36\"",
        "\"Ada (36)\"",
        "src/main.rs:",
    ] {
        assert!(refusal.contains(phrase), "expected `{phrase}` in:\n{refusal}");
    }
    assert!(!refusal.contains("json_has_every_field"), "only failing tests are named:\n{refusal}");
    assert_eq!(lock_of(&package).steps[0].fingerprint.check.as_deref(), Some("cargo test"));
    assert_eq!(package.read("promptgen/01/user_json.rs"), USER_JSON_GOOD);
}

#[test]
fn silence_after_a_refused_finish_fails_the_step_and_records_nothing() {
    let server = FakeLlm::start(vec![
        write("user_json.rs", USER_JSON_TYPO),
        finish(),
        Reply::turn(Turn::text("The file is written.")),
        Reply::turn(Turn::text("I am done.")),
    ]);
    let package = package(|m| m.replace("seed = 7\n", "seed = 7\ncheck_rounds = 2\n"));
    let before = snapshot(package.dir.path());
    let out = promptgen_offline(&package, &server, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(server.requests().len(), 4, "{}", text(&out));
    let told = last_message(&server.requests()[3]);
    assert!(told.contains("You stopped without calling `finish`") && told.contains("no field `nmae`"), "{told}");
    let err = stderr(&out);
    assert!(err.contains("step `01` failed") && err.contains("still fail `cargo check`"), "{err}");
    assert_eq!(changes(&before, &snapshot(package.dir.path())), Vec::<String>::new(), "nothing recorded");
}

/// Waits for `child`, killing it after `limit`: a hang fails the test instead of the suite.
fn wait_or_kill(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("still running after {limit:?}: a deadlock?\n{}", text(&out));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// `cargo build` whose build script regenerates a stale step runs the step's `cargo check`:
/// cargo inside cargo. The inner build has its own target folder and its build entry mounts
/// the candidate without waiting on the lock the outer one holds.
#[test]
fn an_online_build_that_regenerates_runs_its_crate_check_without_deadlock() {
    let server = FakeLlm::start(vec![
        write("user_json.rs", USER_JSON_TYPO),
        finish(),
        write("user_json.rs", USER_JSON_GOOD),
        finish(),
    ]);
    let package = package(|m| m.to_string());
    let child = package
        .cargo(&["build"])
        .env("PROMPTGEN_BASE_URL", server.url())
        .env("CARGO_NET_OFFLINE", "true")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_or_kill(child, Duration::from_secs(600));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(server.requests().len(), 4, "{}", text(&out));
    assert!(last_message(&server.requests()[2]).contains("no field `nmae`"));
    assert!(stderr(&out).contains("cargo promptgen accept"), "{}", text(&out));
    assert!(!package.path("promptgen.lock").exists(), "a build never writes the package");
}

/// `main.rs` uses both steps' modules, and its test checks step 01's `a`: nothing compiles
/// until step 02 has written `b.rs`.
const MAIN_OF_TWO: &str = "#[allow(dead_code)]\nmod generated {\n    include!(concat!(env!(\"OUT_DIR\"), \"/promptgen.rs\"));\n}\n\nfn main() {\n    println!(\"{}\", generated::b::b());\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn a_says_a() {\n        assert_eq!(super::generated::a::a(), \"a\");\n    }\n}\n";

fn two_step_package() -> Package {
    let metadata = with_step_keys(&unseeded_chain("", &["a.rs", "b.rs"]), "01", "check = \"cargo test\"\n");
    let package = Package::lettered(&metadata, 2);
    package.write("src/main.rs", MAIN_OF_TWO);
    package
}

#[test]
fn a_chain_from_nothing_puts_off_what_a_later_step_owns_and_checks_it_in_full_at_the_end() {
    let server = FakeLlm::start(vec![write("a.rs", A), finish(), write("b.rs", B), finish()]);
    let package = two_step_package();
    let out = promptgen_offline(&package, &server, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.requests().len(), 4, "step 01 is not blamed for `b`: {}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("put off") && err.contains("step 02"), "{err}");
    let transcript = package.read("promptgen/01.transcript.jsonl");
    assert!(transcript.contains("\"put_off\""), "{transcript}");

    // Once the chain is complete, step 01's tests run, and a failing one is reported.
    let wrong = "pub fn a() -> &'static str { \"A\" }\n";
    server.push(write("a.rs", wrong));
    server.push(finish());
    std::fs::remove_file(package.path("promptgen.lock")).unwrap();
    std::fs::remove_dir_all(package.path("promptgen")).unwrap();
    server.push(write("b.rs", B));
    server.push(finish());
    let out = promptgen_offline(&package, &server, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = stderr(&out);
    for phrase in [
        "step `01` was recorded, but its check `cargo test` fails now that the whole chain is written",
        "a_says_a",
        "cargo promptgen --step 01",
    ] {
        assert!(err.contains(phrase), "expected `{phrase}` in:\n{err}");
    }
    // With the chain complete, running the step again gives the model the failing test; the
    // step after it, whose input changed, is left for the next run.
    server.push(write("a.rs", wrong));
    server.push(finish());
    server.push(write("a.rs", A));
    server.push(finish());
    let out = promptgen_offline(&package, &server, &["--step", "01"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let requests = server.requests();
    let told = last_message(&requests[requests.len() - 2]);
    assert!(told.contains("test `tests::a_says_a`") && told.contains("\"A\""), "{told}");
    assert!(stderr(&out).contains("step 02 is now stale"), "{}", text(&out));
    server.push(write("b.rs", B));
    server.push(finish());
    let out = promptgen_offline(&package, &server, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn seed_retries_run_a_failed_step_again_with_the_next_seed_and_record_the_seed_that_worked() {
    let server = FakeLlm::start(vec![
        write("user_json.rs", USER_JSON_TYPO),
        finish(),
        write("user_json.rs", USER_JSON_GOOD),
        finish(),
    ]);
    let package = package(|m| m.replace("seed = 7\n", "seed = 7\ncheck_rounds = 0\nseed_retries = 2\n"));
    let out = promptgen_offline(&package, &server, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let seeds: Vec<serde_json::Value> = server.requests().iter().map(|r| r.json()["options"]["seed"].clone()).collect();
    assert_eq!(seeds, [7, 7, 8, 8], "the second run uses the next seed");
    assert!(stderr(&out).contains("step 01: run 2, with seed 8"), "{}", text(&out));
    let step = lock_of(&package).steps[0].clone();
    assert_eq!(step.seed, Some(8), "{step:?}");
    assert_eq!(step.fingerprint.seed, Some(7), "the key still names the configured seed");
    let transcript = package.read("promptgen/01.transcript.jsonl");
    assert_eq!(transcript.matches("\"event\":\"start\"").count(), 2, "both runs are in the transcript:\n{transcript}");
    let status = run(&mut package.promptgen(&["status"]));
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("recorded from a retry, with seed 8"),
        "{}",
        text(&status)
    );
}

/// A test's output goes back to the model, and through it to the model's server: a test that
/// prints the environment must not find a secret in it.
#[test]
fn secrets_in_the_environment_never_reach_the_model_through_a_tests_output() {
    let canary = "sk-canary-4f1d2e";
    let server = FakeLlm::start(vec![
        write("user_json.rs", USER_JSON_GOOD),
        finish(),
        write("user_json.rs", USER_JSON_GOOD),
        finish(),
    ]);
    let package = package(|m| m.replace("seed = 7\n", "seed = 7\ncheck = \"cargo test\"\ncheck_rounds = 1\n"));
    let leaky = USER_JSON_MAIN.replace(
        "    #[test]\n    fn json_has_every_field() {",
        "    #[test]\n    fn prints_the_environment() {\n        let env: Vec<String> = std::env::vars().map(|(k, v)| format!(\"{k}={v}\")).collect();\n        panic!(\"{}\", env.join(\"\\n\"));\n    }\n\n    #[test]\n    fn json_has_every_field() {",
    );
    package.write("src/main.rs", &leaky);
    let out = run(package
        .promptgen(&[])
        .env("PROMPTGEN_BASE_URL", server.url())
        .env("CARGO_NET_OFFLINE", "true")
        .env("OPENAI_API_KEY", canary)
        .env("MY_SERVICE_TOKEN", canary)
        .env("AWS_SECRET_ACCESS_KEY", canary));
    assert_eq!(out.status.code(), Some(1), "the test fails: {}", text(&out));
    assert_eq!(server.requests().len(), 4, "{}", text(&out));
    let told = last_message(&server.requests()[2]);
    assert!(told.contains("prints_the_environment") && told.contains("PATH="), "the test ran and printed: {told}");
    assert!(!told.contains(canary), "{told}");
    for request in server.requests() {
        assert!(!request.body.contains(canary), "a secret reached the server");
    }
    assert!(!stderr(&out).contains(canary), "{}", text(&out));
}

/// Ctrl-C while `cargo test` checks a step must not wait for the check: the check is killed
/// with every process it started (cargo, and here a test binary that would sleep ten minutes),
/// nothing is recorded, and the run exits with 130.
#[test]
fn ctrl_c_during_a_crate_check_kills_the_check_with_its_test_binary_and_records_nothing() {
    use std::io::Read;
    let server = FakeLlm::start(vec![write("user_json.rs", USER_JSON_GOOD), finish()]);
    let package = package(|m| m.replace("seed = 7\n", "seed = 7\ncheck = \"cargo test\"\n"));
    let out = promptgen_offline(&package, &server, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // A hand-written test that says who it is, then sleeps; and a prompt edited, so step 01 runs.
    // In the check's target folder: a confined check may write there, and not in the package.
    let pid_file =
        support::shared_target().join("promptgen/check-target").join(format!("{}-slow-test.pid", package.name));
    let _ = std::fs::remove_file(&pid_file);
    package.write(
        "tests/slow.rs",
        &format!(
            "#[test]\nfn sleeps() {{\n    std::fs::write({:?}, std::process::id().to_string()).unwrap();\n    std::thread::sleep(std::time::Duration::from_secs(600));\n}}\n",
            pid_file.display().to_string()
        ),
    );
    package.write("prompts/01.md", "Write user_json.rs: to_json and describe for crate::domain::User, briefly.\n");
    let before = snapshot(package.dir.path());
    server.push(write("user_json.rs", USER_JSON_GOOD));
    server.push(finish());
    let mut child = package
        .promptgen(&[])
        .env("PROMPTGEN_BASE_URL", server.url())
        .env("CARGO_NET_OFFLINE", "true")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = child.stderr.take().unwrap();
    let said = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    });
    // The check is under way once the test binary has written its pid.
    let deadline = Instant::now() + Duration::from_secs(300);
    let test_pid = loop {
        if let Ok(pid) = std::fs::read_to_string(&pid_file)
            && !pid.is_empty()
        {
            break pid;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended ({status}) before the check ran its tests:\n{}", said.join().unwrap());
        }
        assert!(Instant::now() < deadline, "the check never ran its tests");
        std::thread::sleep(Duration::from_millis(50));
    };
    let kill = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let status = wait_or_kill(child, Duration::from_secs(120)).status;
    let said = said.join().unwrap();
    assert_eq!(status.code(), Some(130), "{said}");
    for phrase in ["interrupted: step `01` was stopped after model call 2 of 8", "nothing of it was recorded"] {
        assert!(said.contains(phrase), "expected `{phrase}` in:\n{said}");
    }
    std::fs::remove_file(&pid_file).unwrap();
    assert_eq!(changes(&before, &snapshot(package.dir.path())), Vec::<String>::new(), "nothing recorded");

    // The test binary went with the check: gone, or a zombie waiting for init to reap it.
    let stat = format!("/proc/{}/stat", test_pid.trim());
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Ok(line) = std::fs::read_to_string(&stat) {
        let state =
            line.rsplit(')').next().unwrap_or_default().split_whitespace().next().unwrap_or_default().to_string();
        if state == "Z" {
            break;
        }
        assert!(Instant::now() < deadline, "the check's test binary {test_pid} still runs: {line}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A hostile model (an input file that injects instructions is enough) tries to make the
/// compiler read a secret for it: every construct that reads a file at compile time, pointed
/// at the package's `.env` and at a file outside the package, under each check. Each write is
/// refused with a message naming the construct, the run then ends cleanly with the honest
/// file, and no canary reaches the server.
#[test]
fn compile_time_reads_of_secrets_are_refused_under_every_check() {
    let env_canary = "sk-env-canary-81c2";
    let outside_canary = "outside-canary-5e77";
    let outside = tempfile::tempdir().unwrap();
    let outside_file = outside.path().join("notes.txt");
    std::fs::write(&outside_file, format!("{outside_canary}\n")).unwrap();
    for check in ["rustc", "cargo check", "cargo test"] {
        let package = package(|m| m.replace("seed = 7\n", &format!("seed = 7\ncheck = \"{check}\"\n")));
        package.write(".env", &format!("API_KEY={env_canary}\n"));
        let dot_env = package.path(".env");
        let attempts = [
            format!("include!(\"{}\");\n", dot_env.display()),
            "pub const K: &str = include_str!(\"../../../../.env\");\n".to_string(),
            format!("pub const K: &[u8] = include_bytes!(\"{}\");\n", outside_file.display()),
            format!("#[path = \"{}\"]\nmod notes;\n", outside_file.display()),
            "pub const K: &str = include_str!(concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/.env\"));\n".to_string(),
            "pub const K: &str = include_str!(\".env\");\n".to_string(),
        ];
        // `rustc` checks the file alone: its honest file needs nothing of the crate.
        let honest = if check == "rustc" {
            "pub fn describe(name: &str, age: u32) -> String {\n    format!(\"{name} ({age})\")\n}\n"
        } else {
            USER_JSON_GOOD
        };
        let mut script: Vec<Reply> =
            attempts.iter().map(|code| write("user_json.rs", &format!("{code}{honest}"))).collect();
        script.extend([write("user_json.rs", honest), finish()]);
        let server = FakeLlm::start(script);
        let out = promptgen_offline(&package, &server, &[]);
        assert_eq!(out.status.code(), Some(0), "{check}: {}", text(&out));
        let requests = server.requests();
        assert_eq!(requests.len(), attempts.len() + 2, "{check}: {}", text(&out));
        for (i, construct) in
            ["include!", "include_str!", "include_bytes!", "path", "include_str!", "include_str!"].iter().enumerate()
        {
            let told = last_message(&requests[i + 1]);
            assert!(told.contains("was not written") && told.contains(construct), "{check}, attempt {i}: {told}");
        }
        for request in &requests {
            assert!(
                !request.body.contains(env_canary) && !request.body.contains(outside_canary),
                "{check}: a canary reached the server"
            );
        }
        assert!(
            !package.read("promptgen/01/user_json.rs").contains("include"),
            "{check}: only the honest file is recorded"
        );
    }
}

/// A command check is the user's, but its output goes to the model: one that prints `.env`
/// has the file's secrets withheld. Confined, it could not read `.env` at all (see
/// `confine.rs`'s tests), so this runs unconfined: the redaction is the defence behind it.
#[test]
fn a_command_check_that_prints_the_env_file_has_its_secrets_withheld() {
    let canary = "sk-env-canary-a93f";
    let server = FakeLlm::start(vec![write("user_json.rs", USER_JSON_GOOD), finish(), finish()]);
    let package = package(|m| {
        m.replace(
            "seed = 7\n",
            "seed = 7\ncheck = [\"sh\", \"-c\", \"cat .env; echo checked; exit 1\"]\ncheck_rounds = 1\n",
        )
    });
    package.write(".env", &format!("# local settings\nAPI_KEY={canary}\n"));
    let mut command = package.promptgen(&[]);
    command
        .env("PROMPTGEN_BASE_URL", server.url())
        .env("CARGO_NET_OFFLINE", "true")
        .env("PROMPTGEN_UNCONFINED_CHECKS", "1");
    let out = run(&mut command);
    assert_eq!(out.status.code(), Some(1), "the check always fails: {}", text(&out));
    assert_eq!(server.requests().len(), 3, "{}", text(&out));
    let told = last_message(&server.requests()[2]);
    assert!(told.contains("checked") && told.contains("[secret withheld]"), "the output came back, redacted: {told}");
    for request in server.requests() {
        assert!(!request.body.contains(canary), "the secret reached the server");
    }
    assert!(!stderr(&out).contains(canary), "{}", text(&out));
}
