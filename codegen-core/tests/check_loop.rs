//! The check-and-repair loop: a step is not done until its files pass the check, and the
//! check's messages go back to the model.

use std::time::Duration;

use codegen_core::backend::{Backend, BackendConfig, BackendKind, RetryPolicy};
use codegen_core::check::{Check, CheckOutcome, CommandCheck};
use codegen_core::sandbox::Sandbox;
use codegen_core::transcript::Event;
use codegen_core::{Error, Step};
use promptgen_tests::{FakeLlm, Reply, Turn};
use serde_json::json;

/// Fails unless `a.rs` contains "fixed", with a rustc-like message.
fn grep_check(dir: &std::path::Path) -> CommandCheck {
    let script = r#"grep -q fixed "$PROMPTGEN_TREE/a.rs" || { echo "error[E0308]: mismatched types --> a.rs:1:20" >&2; exit 1; }"#;
    CommandCheck::new(&["sh".into(), "-c".into(), script.into()], dir).unwrap()
}

fn backend(server: &FakeLlm) -> Box<dyn Backend> {
    let mut config = BackendConfig::new(BackendKind::Ollama);
    config.base_url = Some(server.url());
    config.http.retry = RetryPolicy { initial_backoff: Duration::from_millis(1), ..RetryPolicy::none() };
    config.open().unwrap()
}

fn write(content: &str) -> Reply {
    Reply::turn(Turn::call("write_file", json!({"path": "a.rs", "content": content})))
}

fn finish() -> Reply {
    Reply::turn(Turn::call("finish", json!({"summary": "done"})))
}

#[test]
fn a_failing_check_sends_its_messages_back_and_the_fix_finishes_the_step() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeLlm::start(vec![write("fn a() -> u8 { \"x\" }"), finish(), write("fn a() -> u8 { 1 } // fixed"), finish()]);
    let mut sandbox = Sandbox::builder(dir.path().join("out")).build().unwrap();
    let mut check = grep_check(dir.path());
    let output = Step::new("m", "Write a.rs.")
        .run_checked(backend(&server).as_mut(), &mut sandbox, &mut check, &mut |_| {})
        .unwrap();
    assert_eq!(output.summary.as_deref(), Some("done"));
    assert_eq!(output.transcript.totals().check_rounds, 1);
    let checks: Vec<bool> = output
        .transcript
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Check { diagnostics, .. } => Some(diagnostics.is_none()),
            _ => None,
        })
        .collect();
    assert_eq!(checks, [false, true], "failed once, then passed");

    // The model saw the diagnostics in the answer to its first `finish`.
    let third = server.requests()[2].json();
    let answer = third["messages"].as_array().unwrap().last().unwrap().clone();
    let text = answer["content"].as_str().unwrap();
    assert!(text.contains("repair round 1 of 3") && text.contains("error[E0308]: mismatched types"), "{text}");
    // ...and was offered the `check` tool and told about the check in the system prompt.
    let first = server.requests()[0].json();
    assert!(first["tools"].as_array().unwrap().iter().any(|t| t["function"]["name"] == "check"));
    assert!(first["messages"][0]["content"].as_str().unwrap().contains("must pass the check"));
}

#[test]
fn code_that_never_passes_fails_the_step_with_the_last_diagnostics() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeLlm::start(vec![write("broken"), finish(), finish(), finish()]);
    let mut sandbox = Sandbox::builder(dir.path().join("out")).build().unwrap();
    let mut check = grep_check(dir.path());
    let failure = Step::new("m", "Write a.rs.")
        .check_rounds(2)
        .run_checked(backend(&server).as_mut(), &mut sandbox, &mut check, &mut |_| {})
        .unwrap_err();
    match &failure.error {
        Error::CheckFailed { rounds: 2, diagnostics, .. } => assert!(diagnostics.contains("E0308"), "{diagnostics}"),
        other => panic!("{other:?}"),
    }
    assert!(failure.to_string().contains("after 2 repair rounds"), "{failure}");
    assert_eq!(failure.transcript.totals().check_rounds, 3, "two repair rounds, then the failure that ended it");
}

#[test]
fn the_model_can_run_the_check_itself_before_finishing() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeLlm::start(vec![
        write("broken"),
        Reply::turn(Turn::call("check", json!({}))),
        write("fixed"),
        finish(),
    ]);
    let mut sandbox = Sandbox::builder(dir.path().join("out")).build().unwrap();
    let mut check = grep_check(dir.path());
    let output = Step::new("m", "Write a.rs.")
        .run_checked(backend(&server).as_mut(), &mut sandbox, &mut check, &mut |_| {})
        .unwrap();
    assert_eq!(output.transcript.totals().check_rounds, 0, "asking is not a repair round");
    let answer = server.requests()[2].json()["messages"].as_array().unwrap().last().unwrap().clone();
    assert!(answer["content"].as_str().unwrap().starts_with("The check failed:"), "{answer}");
}

struct Broken;

impl Check for Broken {
    fn name(&self) -> String {
        "broken".into()
    }

    fn run(&mut self, _: &std::path::Path) -> Result<CheckOutcome, codegen_core::check::CheckError> {
        Err(codegen_core::check::CheckError { check: self.name(), detail: "rustc not found".into() })
    }
}

#[test]
fn a_check_that_cannot_run_fails_the_step_instead_of_blaming_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeLlm::start(vec![write("fixed"), finish()]);
    let mut sandbox = Sandbox::builder(dir.path().join("out")).build().unwrap();
    let failure = Step::new("m", "Write a.rs.")
        .run_checked(backend(&server).as_mut(), &mut sandbox, &mut Broken, &mut |_| {})
        .unwrap_err();
    assert!(matches!(failure.error, Error::CheckCouldNotRun(_)), "{:?}", failure.error);
    assert!(failure.to_string().contains("rustc not found"));
}

#[test]
fn without_a_check_no_check_tool_is_offered() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeLlm::start(vec![write("anything"), finish()]);
    let mut sandbox = Sandbox::builder(dir.path().join("out")).build().unwrap();
    Step::new("m", "Write a.rs.").run(backend(&server).as_mut(), &mut sandbox).unwrap();
    let first = server.requests()[0].json();
    assert!(first["tools"].as_array().unwrap().iter().all(|t| t["function"]["name"] != "check"));
}
