//! Re-runs by edit (`regenerate = "edit"`, the default) and from nothing (`"fresh"`,
//! `--fresh`), on a realistic crate (serde and serde_json from crates.io, its own module, its
//! own tests as the step's check) against the fake server: what the model is told, the
//! files it starts from, the lines that stay byte for byte, the lock's provenance, and what
//! `log`, `diff` and `accept` make of it.

use promptgen_tests::{FakeLlm, RecordedRequest, Reply, Turn};
use serde_json::json;

use crate::support::{
    Package, USER_JSON_GOOD, chain, finish, lock_of, promptgen_offline, run, stderr, stdout, text, with_step_keys,
    write,
};

const PROMPT: &str = "Write user_json.rs: to_json and describe for crate::domain::User.\n";
const PROMPT_WITH_DOCS: &str =
    "Write user_json.rs: to_json and describe for crate::domain::User.\nGive each function a doc comment.\n";

/// [`USER_JSON_GOOD`] with a doc comment on each function: what the edits below make of it.
fn documented() -> String {
    USER_JSON_GOOD
        .replace("pub fn to_json", "/// The user as JSON.\npub fn to_json")
        .replace("pub fn describe", "/// The user's name and age, for people.\npub fn describe")
}

/// Two edits in one call: a doc comment above each function.
fn add_docs() -> Reply {
    Reply::turn(Turn::call(
        "edit_file",
        json!({"path": "user_json.rs", "edits": [
            {"old": "pub fn to_json", "new": "/// The user as JSON.\npub fn to_json"},
            {"old": "pub fn describe", "new": "/// The user's name and age, for people.\npub fn describe"},
        ]}),
    ))
}

fn chat_requests(server: &FakeLlm) -> Vec<RecordedRequest> {
    server.requests().into_iter().filter(|r| r.path.ends_with("/chat")).collect()
}

/// The system message of `request`: where a re-run by edit is told what it starts from.
fn system_message(request: &RecordedRequest) -> String {
    let body = request.json();
    body["messages"][0]["content"].as_str().unwrap_or_default().to_string()
}

fn sha256(text: &str) -> String {
    cargo_promptgen::__private::sha256_hex(text.as_bytes())
}

#[test]
fn a_prompt_change_is_made_by_edit_from_the_recorded_file_and_fresh_starts_from_nothing() {
    let metadata = with_step_keys(&chain("", &["user_json.rs"]), "01", "check = \"cargo test\"\n");
    let package = Package::user_json(&metadata);
    package.write("prompts/01.md", PROMPT);
    let server = FakeLlm::start(vec![write("user_json.rs", USER_JSON_GOOD), finish()]);

    // 1. The first run starts from nothing and records no provenance.
    let out = promptgen_offline(&package, &server, &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!system_message(&chat_requests(&server)[0]).contains("This task was done before"));
    let entry = lock_of(&package).step("01").unwrap().clone();
    assert!(entry.made_from.is_empty(), "{entry:?}");
    assert!(!package.read("promptgen.lock").contains("made_from"));

    // 2. The prompt asks for one more thing: the re-run starts from the recorded file, is told
    //    the prompt's diff, and edits two lines in; every other line stays byte for byte.
    package.write("prompts/01.md", PROMPT_WITH_DOCS);
    server.push(add_docs());
    server.push(finish());
    let out = promptgen_offline(&package, &server, &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(stderr(&out).contains("step 01: running by edit from user_json.rs, because prompt"), "{}", text(&out));
    let told = system_message(&chat_requests(&server)[2]);
    assert!(
        told.contains(
            "This task was done before: its files are in place as that run made them: user_json.rs (9 lines)."
        ),
        "{told}"
    );
    assert!(told.contains("prompt `prompts/01.md` changed"), "{told}");
    assert!(
        told.contains(
            " Write user_json.rs: to_json and describe for crate::domain::User.\n+Give each function a doc comment.\n"
        ),
        "{told}"
    );
    assert!(told.contains(&format!("user_json.rs:\n```\n{USER_JSON_GOOD}```")), "the file is shown as it is: {told}");
    assert_eq!(package.read("promptgen/01/user_json.rs"), documented());
    let entry = lock_of(&package).step("01").unwrap().clone();
    assert_eq!(entry.made_from.len(), 1, "{entry:?}");
    assert_eq!(
        (entry.made_from[0].path.as_str(), entry.made_from[0].sha256.clone()),
        ("user_json.rs", sha256(USER_JSON_GOOD))
    );
    assert_eq!(entry.files[0].sha256, sha256(&documented()));
    let lock = package.read("promptgen.lock");
    assert!(
        lock.contains(&format!("[[step.made_from]]\npath = \"user_json.rs\"\nsha256 = \"{}\"", sha256(USER_JSON_GOOD))),
        "{lock}"
    );
    // `log` says where the result came from.
    let out = run(&mut package.promptgen(&["log", "--color", "never"]));
    assert!(out.status.success(), "{}", text(&out));
    let expected =
        format!("re-run by edit, from the recorded user_json.rs ({}, edited)", &sha256(USER_JSON_GOOD)[..12]);
    assert!(stdout(&out).contains(&expected), "{}", text(&out));

    // 3. `regenerate` is not part of the key: saying "fresh" makes nothing stale.
    package.write(
        "Cargo.toml",
        &package
            .read("Cargo.toml")
            .replace("check = \"cargo test\"\n", "check = \"cargo test\"\nregenerate = \"fresh\"\n"),
    );
    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // 4. A step that says "fresh" runs from nothing: no files in place, nothing said of them.
    package.write("prompts/01.md", PROMPT);
    server.push(write("user_json.rs", USER_JSON_GOOD));
    server.push(finish());
    let out = promptgen_offline(&package, &server, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let told = system_message(&chat_requests(&server)[4]);
    assert!(!told.contains("This task was done before"), "{told}");
    assert!(lock_of(&package).step("01").unwrap().made_from.is_empty());
    assert!(!package.read("promptgen.lock").contains("made_from"));

    // 5. Back to the default, `--fresh` on the command line does the same.
    package.write("Cargo.toml", &package.read("Cargo.toml").replace("regenerate = \"fresh\"\n", ""));
    package.write("prompts/01.md", PROMPT_WITH_DOCS);
    server.push(write("user_json.rs", &documented()));
    server.push(finish());
    let out = promptgen_offline(&package, &server, &["--fresh"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(stderr(&out).contains("step 01: running, because prompt"), "{}", text(&out));
    assert!(!system_message(&chat_requests(&server)[6]).contains("This task was done before"));
    assert!(lock_of(&package).step("01").unwrap().made_from.is_empty());
    assert_eq!(chat_requests(&server).len(), 8);
}

#[test]
fn a_build_s_re_run_by_edit_shows_its_provenance_and_only_the_changed_hunks_in_diff_and_accept_keeps_it() {
    let package = Package::user_json(&chain("", &["user_json.rs"]));
    package.write("prompts/01.md", PROMPT);
    let server = FakeLlm::start(vec![write("user_json.rs", USER_JSON_GOOD), finish()]);
    let out = promptgen_offline(&package, &server, &[]);
    assert!(out.status.success(), "{}", text(&out));

    // A build regenerates into the pending area, by edit.
    package.write("prompts/01.md", PROMPT_WITH_DOCS);
    server.push(add_docs());
    server.push(finish());
    let out = run(package
        .cargo(&["build", "--quiet"])
        .env("PROMPTGEN_BASE_URL", server.url())
        .env("CARGO_NET_OFFLINE", "true"));
    assert!(out.status.success(), "{}", text(&out));

    let out = run(&mut package.promptgen(&["diff"]));
    assert!(out.status.success(), "{}", text(&out));
    let diff = stdout(&out);
    let provenance = format!(
        "step 01: re-run by edit, from the recorded user_json.rs ({}, edited)\n",
        &sha256(USER_JSON_GOOD)[..12]
    );
    assert!(diff.starts_with(&provenance), "{diff}");
    let changed: Vec<&str> = diff
        .lines()
        .filter(|l| (l.starts_with('+') || l.starts_with('-')) && !l.starts_with("+++") && !l.starts_with("---"))
        .collect();
    assert_eq!(changed, ["+/// The user as JSON.", "+/// The user's name and age, for people."], "{diff}");

    let out = run(&mut package.promptgen(&["accept"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let entry = lock_of(&package).step("01").unwrap().clone();
    assert_eq!(entry.made_from.iter().map(|f| f.sha256.clone()).collect::<Vec<_>>(), [sha256(USER_JSON_GOOD)]);
    assert_eq!(package.read("promptgen/01/user_json.rs"), documented());
    let out = run(&mut package.promptgen(&["check"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}
