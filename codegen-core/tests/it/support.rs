//! What several of these modules share.

use std::process::Command;

use std::time::Duration;

use codegen_core::backend::{BackendConfig, BackendKind, HttpConfig, RetryPolicy};
use codegen_core::chat::{Arguments, Message};
use promptgen_tests::FakeLlm;
use serde_json::Value;

/// Where a backend of `kind` finds `server`: an OpenAI-compatible client under `/v1` (as
/// `OPENAI_BASE_URL` says it), Ollama at the server itself.
pub fn base_url(kind: BackendKind, server: &FakeLlm) -> String {
    match kind {
        BackendKind::OpenAi => format!("{}/v1", server.url()),
        _ => server.url(),
    }
}

/// A configuration of `kind` at `server` with limits short enough for tests (5 s) and retries
/// that wait 5 ms.
pub fn fake_server_config(kind: BackendKind, server: &FakeLlm) -> BackendConfig {
    let mut config = BackendConfig::new(kind);
    config.base_url = Some(base_url(kind, server));
    config.http = HttpConfig {
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(5),
        first_byte_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(5),
        retry: RetryPolicy { initial_backoff: Duration::from_millis(5), ..RetryPolicy::none() },
    };
    config
}

/// The history of one request: a system prompt and a user turn.
pub fn hello() -> Vec<Message> {
    vec![Message::system("sys"), Message::user("write a.rs")]
}

/// A JSON object as a tool call's arguments.
pub fn object(value: Value) -> Arguments {
    Arguments::Object(value.as_object().unwrap().clone())
}

/// Set in the environment of the child process [`alone_in_a_process`] starts: the test it runs.
const ALONE_VAR: &str = "PROMPTGEN_TEST_ALONE";

/// Runs `body` in a process of its own, for a test that changes process-wide state (the
/// environment): every test of this binary runs in a thread of one process, and another
/// thread must not read what `body` changes. `test` is the test's path as `module_path!()`
/// gives it, with its name (`it::env_vars::a_test`). The parent runs this binary again with
/// that test alone on one thread and fails with the child's output if the child fails or did
/// not run it; the child, seeing [`ALONE_VAR`], runs `body`.
pub fn alone_in_a_process(test: &str, body: impl FnOnce()) {
    // Test names as the harness filters them are the path without the crate's name.
    let name = test.split_once("::").map_or(test, |(_, rest)| rest);
    if std::env::var_os(ALONE_VAR).is_some_and(|running| running == name) {
        body();
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env(ALONE_VAR, name)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let said = format!("{}\n--- stdout\n{stdout}\n--- stderr\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{name} failed in a process of its own: {said}");
    assert!(stdout.contains("test result: ok. 1 passed"), "{name} did not run in a process of its own: {said}");
}
