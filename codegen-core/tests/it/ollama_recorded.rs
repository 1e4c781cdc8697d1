//! The Ollama backend pinned to replies in the exact shapes Ollama's native API sends
//! (data files in `tests/data/ollama/`, written from the wire-protocol reference), served
//! verbatim over loopback.

use std::time::Duration;

use codegen_core::__private::tools::tool_specs;
use codegen_core::Step;
use codegen_core::backend::{Backend, BackendConfig, BackendError, BackendKind, ChatRequest, RetryPolicy};
use codegen_core::chat::{Arguments, Message};
use codegen_core::sandbox::Sandbox;
use codegen_core::transcript::{CallSource, Event};
use promptgen_tests::{FakeLlm, Reply, Turn};
use serde_json::{Value, json};

fn data(name: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ollama").join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn backend(server: &FakeLlm) -> Box<dyn Backend> {
    let mut config = BackendConfig::new(BackendKind::Ollama);
    config.base_url = Some(server.url());
    config.http.retry = RetryPolicy { initial_backoff: Duration::from_millis(1), ..RetryPolicy::default() };
    config.open().unwrap()
}

fn ask(server: &FakeLlm) -> Result<codegen_core::backend::ChatResponse, BackendError> {
    let specs = tool_specs();
    let messages = [Message::user("Write a.rs.")];
    backend(server).chat(&ChatRequest {
        model: "qwen2.5-coder:7b",
        messages: &messages,
        tools: &specs,
        seed: Some(1),
        temperature: Some(0.0),
        constraint: None,
    })
}

fn object(value: Value) -> Arguments {
    Arguments::from_value(value)
}

#[test]
fn a_tool_call_with_id_and_index_and_done_reason_stop() {
    let server = FakeLlm::start(vec![Reply::json(data("tool_call_with_id.json"))]);
    let reply = ask(&server).unwrap();
    assert_eq!(reply.message.tool_calls.len(), 1, "a tool turn is recognised by its calls, not by done_reason");
    let call = &reply.message.tool_calls[0];
    assert_eq!((call.id.as_str(), call.name.as_str()), ("call_ab12cd34", "write_file"));
    assert_eq!(call.arguments, object(json!({"path": "a.rs", "content": "pub fn a() {}\n"})));
    assert_eq!((reply.usage.prompt_tokens, reply.usage.completion_tokens), (Some(169), Some(18)));
    assert_eq!(reply.finish_reason.as_deref(), Some("stop"));
}

#[test]
fn tool_calls_without_ids_get_distinct_minted_ones() {
    let server = FakeLlm::start(vec![Reply::json(data("tool_call_without_id.json"))]);
    let reply = ask(&server).unwrap();
    let calls = &reply.message.tool_calls;
    assert_eq!(calls.len(), 2);
    assert!(!calls[0].id.is_empty() && calls[0].id != calls[1].id);
    assert_eq!(calls[1].arguments, object(json!({})));
}

#[test]
fn a_reply_without_metrics_has_no_usage() {
    let server = FakeLlm::start(vec![Reply::json(data("no_metrics.json"))]);
    let reply = ask(&server).unwrap();
    assert_eq!(reply.message.content, "All files are written.");
    assert_eq!((reply.usage.prompt_tokens, reply.usage.completion_tokens), (None, None));
}

#[test]
fn qwen_and_llama_style_calls_in_content_are_run() {
    for file in [
        "qwen_call_in_content.json",
        "qwen_call_in_fence.json",
        "qwen_call_in_tags.json",
        "llama_parameters_in_content.json",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let finish = Reply::turn(Turn::call("finish", json!({"summary": "done"})));
        let server = FakeLlm::start(vec![Reply::json(data(file)), finish]);
        let mut sandbox = Sandbox::builder(dir.path()).build().unwrap();
        let output =
            Step::new("qwen2.5-coder:7b", "Write view.rs.").run(backend(&server).as_mut(), &mut sandbox).unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join("view.rs")).unwrap(), "pub trait View {}\n", "{file}");
        assert!(
            output
                .transcript
                .events
                .iter()
                .any(|e| matches!(e, Event::ToolRun { via: CallSource::Text, ok: true, .. })),
            "{file}"
        );
    }
}

#[test]
fn error_bodies_become_errors_that_say_what_to_do() {
    let server = FakeLlm::start(vec![Reply::status(404, data("error_model_not_found.json"))]);
    let err = ask(&server).unwrap_err();
    assert!(
        matches!(err, BackendError::ModelNotFound { .. }) && err.to_string().contains("ollama pull qwen2.5-coder:7b"),
        "{err}"
    );

    let server = FakeLlm::start(vec![Reply::status(400, data("error_no_tool_support.json"))]);
    let err = ask(&server).unwrap_err();
    assert!(matches!(err, BackendError::ToolsUnsupported { .. }), "{err:?}");

    let server = FakeLlm::start(vec![Reply::status(400, data("error_no_thinking.json"))]);
    let err = ask(&server).unwrap_err();
    assert!(
        matches!(err, BackendError::Status { status: 400, .. })
            && err.to_string().contains("does not support thinking"),
        "{err}"
    );
    assert_eq!(server.requests().len(), 1, "a 400 is not retried");

    let server =
        FakeLlm::start(vec![Reply::status(503, data("error_queue_full.json")), Reply::json(data("no_metrics.json"))]);
    assert_eq!(ask(&server).unwrap().message.content, "All files are written.", "a full queue is retried");
}
