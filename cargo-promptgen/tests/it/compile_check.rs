//! The check a step's output must pass before it may finish, as a user meets it: rustc's
//! diagnostics sent back to the model and a repaired file recorded, a model that never fixes
//! its code leaving everything as it was, a later step that breaks an earlier step's file,
//! the model's own `check` tool, a custom check command (and one that does not exist),
//! `check = "none"`, a changed check making a step stale, and the package's edition.
//! Real binary, the fake LLM server on loopback; no `cargo build`.

use cargo_promptgen::__private::LockedStep;
use promptgen_tests::{FakeLlm, RecordedRequest, Reply, Turn};
use serde_json::{Value, json};

use crate::support::{
    A, A_BROKEN, A2, B, Package, assert_fresh, assert_stale, chain, changes, edit, finish, last_message, lock_of,
    pending_dir, run, snapshot, stderr, text, with_step_keys, write,
};

fn check() -> Reply {
    Reply::turn(Turn::call("check", json!({})))
}

/// The names of the tools a request offered.
fn tool_names(request: &RecordedRequest) -> Vec<String> {
    let body = request.json();
    body["tools"]
        .as_array()
        .map(|tools| tools.iter().filter_map(|t| t["function"]["name"].as_str().map(String::from)).collect())
        .unwrap_or_default()
}

fn system_prompt(request: &RecordedRequest) -> String {
    request.json()["messages"][0]["content"].as_str().unwrap_or_default().to_string()
}

fn entry(package: &Package, id: &str) -> LockedStep {
    lock_of(package)
        .step(id)
        .unwrap_or_else(|| panic!("no step {id} in the lock:\n{}", package.read("promptgen.lock")))
        .clone()
}

fn recorded_paths(entry: &LockedStep) -> Vec<&str> {
    entry.files.iter().map(|f| f.path.as_str()).collect()
}

/// The `"event":"check"` lines of a stored transcript, parsed.
fn check_events(package: &Package, id: &str) -> Vec<Value> {
    let transcript = package.read(&format!("promptgen/{id}.transcript.jsonl"));
    transcript
        .lines()
        .filter(|line| line.contains("\"event\":\"check\""))
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// E0308: a `&str` where a `String` is expected.
const B_MISMATCH: &str = "pub fn b() -> String { \"b\" }\n";
/// E0425: a function that does not exist.
const B_UNRESOLVED: &str = "pub fn b() -> String { no_such_function() }\n";

/// Two steps checked by `rustc`: a.rs, then b.rs using it.
fn two_steps() -> String {
    chain("check = \"rustc\"\n", &["a.rs", "b.rs"])
}

/// The `i`th request the server received.
fn request(server: &FakeLlm, i: usize) -> RecordedRequest {
    let requests = server.requests();
    requests.get(i).cloned().unwrap_or_else(|| panic!("only {} requests arrived, wanted #{i}", requests.len()))
}

#[test]
fn rustc_diagnostics_go_back_to_the_model_and_the_repaired_file_is_recorded() {
    let server = FakeLlm::start(vec![
        write("a.rs", A),
        finish(),
        write("b.rs", B_MISMATCH),
        finish(),
        write("b.rs", B),
        finish(),
    ]);
    let package = Package::lettered(&two_steps(), 2);
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", server.url()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.requests().len(), 6, "{}", text(&out));

    // Step 02's requests are #2..#5; #4 answers its first `finish`.
    let step2 = request(&server, 2);
    assert!(tool_names(&step2).contains(&"check".to_string()), "{:?}", tool_names(&step2));
    assert!(system_prompt(&step2).contains("must pass the check `rustc`"), "{}", system_prompt(&step2));
    let after_write = last_message(&request(&server, 3));
    assert!(!after_write.contains("error["), "the check runs at finish, not at write: {after_write}");
    let refusal = last_message(&request(&server, 4));
    for phrase in ["`finish` refused", "`rustc`", "repair round 1 of 3", "error[E0308]", "b.rs:", "mismatched types"] {
        assert!(refusal.contains(phrase), "expected `{phrase}` in:\n{refusal}");
    }
    assert!(!refusal.contains("promptgen_check.rs") && !refusal.contains("/tree/"), "scratch paths leak:\n{refusal}");

    // The lock counts the round; the store holds the fixed file and the diagnostics.
    let lock = entry(&package, "02");
    assert_eq!(lock.check_rounds, 1, "{lock:?}");
    assert_eq!(lock.model_calls, 4, "{lock:?}");
    assert!(lock.repairs >= 1, "{lock:?}");
    assert_eq!(lock.fingerprint.check.as_deref(), Some("rustc --edition=2021"), "{lock:?}");
    assert_eq!(recorded_paths(&lock), ["b.rs"]);
    assert_eq!(entry(&package, "01").check_rounds, 0);
    assert!(package.read("promptgen.lock").contains("check_rounds = 1"), "{}", package.read("promptgen.lock"));
    assert_eq!(package.read("promptgen/02/b.rs"), B);
    let events = check_events(&package, "02");
    assert_eq!(events.len(), 2, "{events:?}");
    let diagnostics = events[0]["diagnostics"].as_str().unwrap_or_else(|| panic!("{events:?}"));
    assert!(diagnostics.contains("error[E0308]") && diagnostics.contains("b.rs:"), "{diagnostics}");
    assert_eq!(events[0]["asked_by_model"], json!(false));
    assert!(events[1].get("diagnostics").is_none(), "the second check passed: {events:?}");

    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn a_model_that_never_fixes_its_code_fails_the_step_and_changes_nothing() {
    let server = FakeLlm::start(vec![write("a.rs", A), finish(), write("b.rs", B), finish()]);
    let package = Package::lettered(&with_step_keys(&two_steps(), "02", "check_rounds = 1\n"), 2);
    let url = server.url();
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", &url));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let before = snapshot(package.dir.path());
    let lock_before = package.read("promptgen.lock");

    // One repair round is allowed: the second failing `finish` ends the step.
    server.push(write("b.rs", B_MISMATCH));
    server.push(finish());
    server.push(write("b.rs", B_UNRESOLVED));
    server.push(finish());
    let out = run(package.promptgen(&["--step", "02"]).env("PROMPTGEN_BASE_URL", &url));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(server.requests().len(), 8, "{}", text(&out));
    let refusal = last_message(&request(&server, 6));
    assert!(refusal.contains("repair round 1 of 1") && refusal.contains("error[E0308]"), "{refusal}");

    let err = stderr(&out);
    for phrase in
        ["step `02` failed", "the files still fail `rustc` after 1 repair round;", "error[E0425]", "b.rs:", "unchanged"]
    {
        assert!(err.contains(phrase), "expected `{phrase}` in:\n{err}");
    }
    assert!(!err.contains("error[E0308]"), "the last diagnostics are shown, not the first:\n{err}");
    assert_eq!(changes(&before, &snapshot(package.dir.path())), Vec::<String>::new(), "{}", text(&out));
    assert_eq!(package.read("promptgen.lock"), lock_before);
    assert_eq!(package.read("promptgen/02/b.rs"), B);
    assert!(!pending_dir(&package).exists(), "a run records nothing in the pending area");

    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(0), "the recorded good step still stands: {}", text(&out));
}

/// A step may change a file of a step it runs after when it declares it among its outputs
/// (a step writes only its declared outputs).
#[test]
fn a_later_step_that_breaks_an_earlier_file_is_refused_until_it_restores_it() {
    let server = FakeLlm::start(vec![
        write("a.rs", A),
        finish(),
        write("a.rs", A_BROKEN),
        write("b.rs", B),
        finish(),
        write("a.rs", A2),
        finish(),
    ]);
    let metadata = two_steps().replace("outputs = [\"b.rs\"]", "outputs = [\"b.rs\", \"a.rs\"]");
    let package = Package::lettered(&metadata, 2);
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", server.url()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.requests().len(), 7, "{}", text(&out));

    // The check saw the whole tree: step 01's file, as step 02 left it.
    let refusal = last_message(&request(&server, 5));
    for phrase in ["repair round 1 of 3", "error[E0308]", "a.rs:"] {
        assert!(refusal.contains(phrase), "expected `{phrase}` in:\n{refusal}");
    }
    assert!(!refusal.contains("b.rs:"), "b.rs was fine:\n{refusal}");

    let lock = entry(&package, "02");
    assert_eq!(lock.check_rounds, 1, "{lock:?}");
    assert_eq!(recorded_paths(&lock), ["a.rs", "b.rs"], "{lock:?}");
    assert_eq!(package.read("promptgen/02/a.rs"), A2);
    assert_eq!(package.read("promptgen/02/b.rs"), B);
    assert_eq!(package.read("promptgen/01/a.rs"), A, "step 01's record is its own");
    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn the_models_own_check_calls_are_answered_and_are_not_repair_rounds() {
    let server = FakeLlm::start(vec![
        write("a.rs", A),
        finish(),
        write("b.rs", B_MISMATCH),
        check(),
        write("b.rs", B),
        check(),
        finish(),
    ]);
    let package = Package::lettered(&two_steps(), 2);
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", server.url()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.requests().len(), 7, "{}", text(&out));

    let failed = last_message(&request(&server, 4));
    assert!(failed.starts_with("The check failed:"), "{failed}");
    assert!(failed.contains("error[E0308]") && failed.contains("b.rs:"), "{failed}");
    assert!(!failed.contains("repair round"), "{failed}");
    let passed = last_message(&request(&server, 6));
    assert_eq!(passed, "The check passed.");

    let lock = entry(&package, "02");
    assert_eq!(lock.check_rounds, 0, "{lock:?}");
    assert_eq!(lock.repairs, 0, "{lock:?}");
    assert_eq!(lock.model_calls, 5, "{lock:?}");
    assert_eq!(package.read("promptgen/02/b.rs"), B);
    let asked: Vec<(bool, bool)> = check_events(&package, "02")
        .iter()
        .map(|e| (e["asked_by_model"].as_bool().unwrap(), e.get("diagnostics").is_some()))
        .collect();
    // (asked by the model, failed): its two calls, then the one `finish` runs.
    assert_eq!(asked, [(true, true), (true, false), (false, false)]);
}

#[test]
fn a_check_command_fails_with_its_output_and_a_missing_one_is_the_users_problem() {
    let server =
        FakeLlm::start(vec![write("notes.txt", "nothing yet\n"), finish(), write("notes.txt", "ok\n"), finish()]);
    let check = r#"check = ["sh", "-c", 'grep -q ok "$PROMPTGEN_TREE/notes.txt" || { echo "notes.txt must say ok" >&2; exit 1; }']"#;
    let package = Package::new(&with_step_keys(&chain("", &["notes.txt"]), "01", &format!("{check}\n")), "");
    package.write("prompts/01.md", "Write notes.txt.\n");
    let url = server.url();
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", &url));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.requests().len(), 4, "{}", text(&out));
    assert!(tool_names(&request(&server, 0)).contains(&"check".to_string()));
    let refusal = last_message(&request(&server, 2));
    for phrase in
        ["`finish` refused", "`sh -c grep -q ok", "repair round 1 of 3", "exit status: 1", "notes.txt must say ok"]
    {
        assert!(refusal.contains(phrase), "expected `{phrase}` in:\n{refusal}");
    }
    assert_eq!(package.read("promptgen/01/notes.txt"), "ok\n");
    let lock = entry(&package, "01");
    assert_eq!(lock.check_rounds, 1, "{lock:?}");
    assert!(lock.fingerprint.check.as_deref().is_some_and(|c| c.starts_with("sh -c grep -q ok")), "{lock:?}");

    // A check that cannot start is not sent to the model: the step fails at once.
    let manifest = package.read("Cargo.toml");
    let line = manifest.lines().find(|l| l.starts_with("check = ")).unwrap().to_string();
    edit(&package, "Cargo.toml", &line, "check = [\"promptgen-no-such-checker\", \"--tree\"]");
    let before = snapshot(package.dir.path());
    server.push(write("notes.txt", "ok\n"));
    server.push(finish());
    server.push(write("notes.txt", "ok\n"));
    server.push(finish());
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", &url));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = stderr(&out);
    for phrase in [
        "step `01` failed",
        "the check `promptgen-no-such-checker --tree` could not run",
        "is `promptgen-no-such-checker` installed and on PATH?",
        "unchanged",
    ] {
        assert!(err.contains(phrase), "expected `{phrase}` in:\n{err}");
    }
    assert!(!err.contains("repair round") && !err.contains("still fail"), "{err}");
    assert_eq!(server.requests().len(), 6, "the model is not asked to fix the user's setup: {}", text(&out));
    assert!(server.requests().iter().all(|r| !r.body.contains("could not run")));
    assert_eq!(changes(&before, &snapshot(package.dir.path())), Vec::<String>::new(), "{}", text(&out));
}

#[test]
fn with_the_check_off_code_that_does_not_compile_is_recorded_and_no_check_tool_is_offered() {
    let server = FakeLlm::start(vec![write("a.rs", A_BROKEN), finish()]);
    let package = Package::new(&with_step_keys(&chain("", &["a.rs"]), "01", "check = \"none\"\n"), "");
    package.write("prompts/01.md", "Write a.rs with fn a.\n");
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", server.url()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.requests().len(), 2, "{}", text(&out));
    for request in server.requests() {
        let tools = tool_names(&request);
        assert!(tools.contains(&"write_file".to_string()) && !tools.contains(&"check".to_string()), "{tools:?}");
        assert!(!system_prompt(&request).contains("must pass the check"), "{}", system_prompt(&request));
    }
    assert_eq!(package.read("promptgen/01/a.rs"), A_BROKEN);
    let lock = entry(&package, "01");
    assert_eq!((lock.check_rounds, lock.repairs, lock.model_calls), (0, 0, 2), "{lock:?}");
    assert_eq!(lock.fingerprint.check, None, "{lock:?}");
    assert!(check_events(&package, "01").is_empty());
}

/// A one-step package writing a.rs, recorded once with the default check (`cargo check`).
fn recorded_rust_step(server: &FakeLlm) -> Package {
    let package = Package::new(&chain("", &["a.rs"]), "");
    package.write("prompts/01.md", "Write a.rs with fn a.\n");
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", server.url()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(entry(&package, "01").fingerprint.check.as_deref(), Some("cargo check"));
    package
}

#[test]
fn changing_the_check_makes_the_step_stale_and_naming_the_default_does_not() {
    let server = FakeLlm::start(vec![write("a.rs", A), finish()]);
    let package = recorded_rust_step(&server);
    assert_fresh(&package, &[]);
    let outputs = "outputs = [\"a.rs\"]";

    edit(&package, "Cargo.toml", outputs, "outputs = [\"a.rs\"]\ncheck = \"cargo check\"");
    assert_fresh(&package, &[]);
    edit(&package, "Cargo.toml", "check = \"cargo check\"", "check = \"none\"");
    assert_stale(&package, &[], &["check changed: cargo check -> none"]);
    edit(&package, "Cargo.toml", "check = \"none\"", "check = \"rustc\"");
    assert_stale(&package, &[], &["check changed: cargo check -> rustc --edition=2021"]);
    edit(&package, "Cargo.toml", "check = \"rustc\"", "check = [\"sh\", \"-c\", \"true\"]");
    assert_stale(&package, &[], &["check changed: cargo check -> sh -c true"]);
    edit(&package, "Cargo.toml", "check = [\"sh\", \"-c\", \"true\"]", "check = \"cargo check\"");
    assert_fresh(&package, &[]);

    // The number of repair rounds is a budget, not part of what the model is asked.
    edit(&package, "Cargo.toml", "check = \"cargo check\"", "check = \"cargo check\"\ncheck_rounds = 1");
    assert_fresh(&package, &[]);
    assert_eq!(server.requests().len(), 2, "check never calls a model");
}

#[test]
fn changing_the_check_does_not_claim_that_codegen_core_was_updated() {
    let server = FakeLlm::start(vec![write("a.rs", A), finish()]);
    let package = recorded_rust_step(&server);
    edit(&package, "Cargo.toml", "outputs = [\"a.rs\"]", "outputs = [\"a.rs\"]\ncheck = \"none\"");
    let line = assert_stale(&package, &[], &["check changed: cargo check -> none"]);
    assert!(!line.contains("codegen-core was updated"), "{line}");
}

/// Compiles only where `TryFrom` is in the prelude: edition 2021 and later.
const T_PRELUDE_2021: &str = "pub fn t() -> u8 { u8::try_from(3i32).unwrap() }\n";
const T_ANY_EDITION: &str = "use std::convert::TryFrom;\npub fn t() -> u8 { u8::try_from(3i32).unwrap() }\n";

#[test]
fn the_rustc_check_uses_the_packages_edition() {
    let server = FakeLlm::start(vec![write("t.rs", T_PRELUDE_2021), finish()]);
    let package = Package::new(&chain("check = \"rustc\"\n", &["t.rs"]), "");
    package.write("prompts/01.md", "Write t.rs with fn t.\n");
    assert!(package.read("Cargo.toml").contains("edition = \"2021\""));
    let url = server.url();
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", &url));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.requests().len(), 2, "2021 has TryFrom in its prelude: {}", text(&out));
    assert_eq!(entry(&package, "01").check_rounds, 0);

    edit(&package, "Cargo.toml", "edition = \"2021\"", "edition = \"2018\"");
    server.push(write("t.rs", T_PRELUDE_2021));
    server.push(finish());
    server.push(write("t.rs", T_ANY_EDITION));
    server.push(finish());
    let out = run(package.promptgen(&["--step", "01"]).env("PROMPTGEN_BASE_URL", &url));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.requests().len(), 6, "{}", text(&out));
    let refusal = last_message(&request(&server, 4));
    for phrase in ["repair round 1 of 3", "error[E0599]", "try_from", "t.rs:"] {
        assert!(refusal.contains(phrase), "expected `{phrase}` in:\n{refusal}");
    }
    assert_eq!(entry(&package, "01").check_rounds, 1);
    assert_eq!(package.read("promptgen/01/t.rs"), T_ANY_EDITION);
}

#[test]
fn a_failed_check_shows_its_diagnostics_once() {
    let server = FakeLlm::start(vec![write("a.rs", A_BROKEN), finish()]);
    let package = Package::new(&with_step_keys(&chain("", &["a.rs"]), "01", "check_rounds = 0\n"), "");
    package.write("prompts/01.md", "Write a.rs with fn a.\n");
    let out = run(package.promptgen(&[]).env("PROMPTGEN_BASE_URL", server.url()));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(server.requests().len(), 2, "no repair round is allowed: {}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("the files still fail `cargo check` after 0 repair rounds"), "{err}");
    // Once, although the crate's binary and its test build both compile the file.
    assert_eq!(err.matches("error[E0308]").count(), 1, "{err}");
    assert_eq!(err.matches("still fail").count(), 1, "{err}");
    assert!(!package.path("promptgen.lock").exists());
}
