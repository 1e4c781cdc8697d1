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
    let server =
        FakeLlm::start(vec![write("fn a() -> u8 { \"x\" }"), finish(), write("fn a() -> u8 { 1 } // fixed"), finish()]);
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
        Error::CheckFailed { rounds: 2, diagnostics, .. } => {
            assert!(diagnostics.text.contains("E0308"), "{diagnostics}")
        }
        other => panic!("{other:?}"),
    }
    assert!(failure.to_string().contains("after 2 repair rounds"), "{failure}");
    assert_eq!(failure.transcript.totals().check_rounds, 3, "two repair rounds, then the failure that ended it");
}

#[test]
fn the_model_can_run_the_check_itself_before_finishing() {
    let dir = tempfile::tempdir().unwrap();
    let server =
        FakeLlm::start(vec![write("broken"), Reply::turn(Turn::call("check", json!({}))), write("fixed"), finish()]);
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

/// The gate leaked: after a refused `finish`, a reply without a tool call ended the step as
/// done, and the files that never passed were recorded. Silence is answered with the check's
/// messages, within the budget, and the step fails if the files never pass.
#[test]
fn a_refused_finish_followed_by_silence_is_answered_and_never_ends_the_step_as_done() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeLlm::start(vec![
        write("fn a() -> u8 { \"x\" }"),
        finish(),
        Reply::turn(Turn::text("I am done.")),
        Reply::turn(Turn::text("Really done.")),
    ]);
    let mut sandbox = Sandbox::builder(dir.path().join("out")).build().unwrap();
    let mut check = grep_check(dir.path());
    let mut step = Step::new("m", "Write a.rs.");
    step.check_rounds(2);
    let failure = step.run_checked(backend(&server).as_mut(), &mut sandbox, &mut check, &mut |_| {}).unwrap_err();
    assert!(matches!(failure.error, Error::CheckFailed { rounds: 2, .. }), "{failure}");
    assert!(failure.to_string().contains("error[E0308]"), "{failure}");
    // The first silence was answered with the diagnostics, as a repair round.
    let fourth = server.requests()[3].json();
    let told = fourth["messages"].as_array().unwrap().last().unwrap()["content"].as_str().unwrap().to_string();
    assert!(told.contains("You stopped without calling `finish`") && told.contains("repair round 2 of 2"), "{told}");
    assert!(told.contains("error[E0308]"), "{told}");
}

/// A model that writes its files and stops without ever calling `finish` does not skip the
/// check either: the step ends only when they pass.
#[test]
fn silence_without_finish_runs_the_check_and_ends_the_step_only_when_it_passes() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeLlm::start(vec![
        write("fn a() -> u8 { \"x\" }"),
        Reply::turn(Turn::text("Here is a.rs.")),
        write("fn a() -> u8 { 1 } // fixed"),
        Reply::turn(Turn::text("Fixed.")),
    ]);
    let mut sandbox = Sandbox::builder(dir.path().join("out")).build().unwrap();
    let mut check = grep_check(dir.path());
    let output = Step::new("m", "Write a.rs.")
        .run_checked(backend(&server).as_mut(), &mut sandbox, &mut check, &mut |_| {})
        .unwrap();
    assert_eq!(output.end, codegen_core::transcript::EndOutcome::NoToolCall);
    assert_eq!(output.transcript.totals().check_rounds, 1);
    assert_eq!(std::fs::read_to_string(dir.path().join("out/a.rs")).unwrap(), "fn a() -> u8 { 1 } // fixed");
}

/// A check that can only pass in part (`PutOff`) lets the step finish, and says why.
#[test]
fn a_check_put_off_in_part_lets_the_step_finish_and_notes_why() {
    struct PartOnly;
    impl Check for PartOnly {
        fn name(&self) -> String {
            "cargo test".into()
        }
        fn run(&mut self, _: &std::path::Path) -> Result<CheckOutcome, codegen_core::check::CheckError> {
            Ok(CheckOutcome::PutOff("the tests need `app`, which step 04 writes".into()))
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let server = FakeLlm::start(vec![write("fn a() {}"), finish()]);
    let mut sandbox = Sandbox::builder(dir.path().join("out")).build().unwrap();
    let output = Step::new("m", "Write a.rs.")
        .run_checked(backend(&server).as_mut(), &mut sandbox, &mut PartOnly, &mut |_| {})
        .unwrap();
    assert!(output.notes.iter().any(|n| n.contains("put off") && n.contains("step 04")), "{:?}", output.notes);
    assert!(
        output.transcript.events.iter().any(|e| matches!(e, Event::Check { put_off: Some(_), diagnostics: None, .. }))
    );
}
