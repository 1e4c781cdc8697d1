//! A cancelled step stops now, not at the next timeout: a request in flight is abandoned
//! whether its reply streams, is awaited whole, has not begun, or waits for a retry; the
//! loop ends the step as interrupted with what it recorded so far.
//!
//! Every wait here is on something that would otherwise last far longer than the test (a
//! stall of minutes, limits of minutes): if cancelling did not work, the error would be
//! another one (a stall, a broken reply), never `Cancelled`. Nothing is timed.

use std::time::Duration;

use codegen_core::backend::{BackendConfig, BackendError, BackendKind, ChatRequest, HttpConfig, Progress, RetryPolicy};
use codegen_core::chat::Message;
use codegen_core::sandbox::Sandbox;
use codegen_core::transcript::{EndOutcome, Event};
use codegen_core::{Cancel, Error, Observer, Step};
use promptgen_tests::{FakeLlm, Reply, Turn};
use serde_json::json;

use crate::support::base_url;

/// Limits far beyond the test's patience: only the cancel flag can end a wait.
fn patient() -> HttpConfig {
    HttpConfig {
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(600),
        first_byte_timeout: Duration::from_secs(600),
        idle_timeout: Duration::from_secs(600),
        retry: RetryPolicy {
            max_retries: 2,
            initial_backoff: Duration::from_secs(600),
            max_backoff: Duration::from_secs(600),
            ..RetryPolicy::default()
        },
    }
}

fn config(kind: BackendKind, server: &FakeLlm, cancel: &Cancel, stream: bool) -> BackendConfig {
    let mut config = BackendConfig::new(kind);
    config.base_url = Some(base_url(kind, server));
    config.http = patient();
    config.stream = stream;
    config.cancel = cancel.clone();
    config
}

fn request<'a>(messages: &'a [Message]) -> ChatRequest<'a> {
    ChatRequest { model: "m", messages, tools: &[], seed: None, temperature: None, constraint: None }
}

/// Sets `cancel` once `server` has received its first request.
fn cancel_on_first_request(server: &FakeLlm, cancel: &Cancel) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while server.requests().is_empty() {
        assert!(std::time::Instant::now() < deadline, "no request reached the server");
        std::thread::sleep(Duration::from_millis(10));
    }
    cancel.cancel();
}

#[test]
fn a_reply_awaited_whole_is_abandoned_when_cancelled() {
    for kind in [BackendKind::Ollama, BackendKind::OpenAi] {
        let server = FakeLlm::start(vec![Reply::stall(Duration::from_secs(300))]);
        let cancel = Cancel::new();
        let mut backend = config(kind, &server, &cancel, false).open().unwrap();
        std::thread::scope(|scope| {
            let watcher = scope.spawn(|| cancel_on_first_request(&server, &cancel));
            let messages = [Message::user("hi")];
            let err = backend.chat(&request(&messages)).unwrap_err();
            assert!(matches!(err, BackendError::Cancelled { .. }), "{kind}: {err:?}");
            assert!(err.to_string().contains("abandoned"), "{err}");
            watcher.join().unwrap();
        });
        assert_eq!(server.requests().len(), 1, "{kind}: a cancelled request is not retried");
    }
}

#[test]
fn a_streamed_reply_is_abandoned_between_its_pieces() {
    for kind in [BackendKind::Ollama, BackendKind::OpenAi] {
        // A few pieces, then five minutes of silence: only the flag ends the wait for the next.
        let turn = Turn::text("a long reply that drips in slowly").tokens(3, 30);
        let server = FakeLlm::start(vec![Reply::turn(turn).in_pieces(2).stall_after(3, Duration::from_secs(300))]);
        let cancel = Cancel::new();
        let mut backend = config(kind, &server, &cancel, true).open().unwrap();
        let messages = [Message::user("hi")];
        let mut pieces = 0;
        let err = backend
            .chat_observed(&request(&messages), &mut |progress: &Progress<'_>| {
                pieces = progress.pieces;
                cancel.cancel();
            })
            .unwrap_err();
        assert!(matches!(err, BackendError::Cancelled { .. }), "{kind}: {err:?}");
        assert!(pieces >= 1, "{kind}: the reply had begun");
    }
}

#[test]
fn a_streamed_reply_that_has_not_begun_and_a_wait_before_a_retry_are_abandoned() {
    let server = FakeLlm::start(vec![Reply::stall(Duration::from_secs(300))]);
    let cancel = Cancel::new();
    let mut backend = config(BackendKind::Ollama, &server, &cancel, true).open().unwrap();
    std::thread::scope(|scope| {
        scope.spawn(|| cancel_on_first_request(&server, &cancel));
        let messages = [Message::user("hi")];
        let err = backend.chat(&request(&messages)).unwrap_err();
        assert!(matches!(err, BackendError::Cancelled { .. }), "{err:?}");
    });

    // A 503 is retried after a backoff of ten minutes; cancelling ends the wait.
    let server = FakeLlm::start(vec![Reply::error(503, "busy"), Reply::error(503, "busy")]);
    let cancel = Cancel::new();
    let mut backend = config(BackendKind::OpenAi, &server, &cancel, false).open().unwrap();
    std::thread::scope(|scope| {
        scope.spawn(|| cancel_on_first_request(&server, &cancel));
        let messages = [Message::user("hi")];
        let err = backend.chat(&request(&messages)).unwrap_err();
        assert!(matches!(err, BackendError::Cancelled { .. }), "{err:?}");
    });
    assert_eq!(server.requests().len(), 1, "no retry after the cancel");
}

/// Cancels on the first streamed piece of the second model call.
struct CancelOnSecondCall {
    cancel: Cancel,
    calls: u32,
    events: Vec<String>,
}

impl Observer for CancelOnSecondCall {
    fn event(&mut self, event: &Event) {
        if let Event::ModelCall { .. } = event {
            self.calls += 1;
        }
        let value = serde_json::to_value(event).unwrap();
        self.events.push(value["event"].as_str().unwrap_or_default().to_string());
    }

    fn progress(&mut self, _: &Progress<'_>) {
        if self.calls == 1 {
            self.cancel.cancel();
        }
    }
}

#[test]
fn a_cancelled_step_ends_interrupted_with_what_it_recorded() {
    let write = Turn::call("write_file", json!({"path": "a.rs", "content": "pub fn a() {}\n"}));
    let slow = Turn::call("finish", json!({"summary": "done"}));
    let server = FakeLlm::start(vec![
        Reply::turn(write),
        Reply::turn(slow).in_pieces(1).stall_after(2, Duration::from_secs(300)),
    ]);
    let cancel = Cancel::new();
    let mut backend = config(BackendKind::OpenAi, &server, &cancel, true).open().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut sandbox = Sandbox::builder(dir.path()).build().unwrap();
    let mut step = Step::new("m", "write a.rs");
    step.expect_output("a.rs").cancel_on(cancel.clone());
    let mut observer = CancelOnSecondCall { cancel, calls: 0, events: Vec::new() };
    let failure = step.run_with(backend.as_mut(), &mut sandbox, None, &mut observer).unwrap_err();
    assert!(matches!(failure.error, Error::Interrupted { model_calls: 2, during_call: true }), "{:?}", failure.error);
    assert_eq!(failure.error.to_string(), "the step was interrupted during model call 2");
    let totals = failure.transcript.totals();
    assert_eq!(totals.model_calls, 1, "the abandoned call is not recorded");
    match failure.transcript.events.last() {
        Some(Event::End { outcome: EndOutcome::Interrupted, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(observer.events.last().map(String::as_str), Some("end"));
    assert_eq!(server.requests().len(), 2);

    // A step whose flag is already set makes no call at all.
    let cancel = Cancel::new();
    cancel.cancel();
    let mut step = Step::new("m", "write a.rs");
    step.cancel_on(cancel);
    let failure = step.run(backend.as_mut(), &mut sandbox).unwrap_err();
    assert!(matches!(failure.error, Error::Interrupted { model_calls: 0, .. }), "{:?}", failure.error);
    assert_eq!(server.requests().len(), 2);
}
