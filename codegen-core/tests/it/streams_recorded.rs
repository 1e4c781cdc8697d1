//! The OpenAI backend pinned to streams captured from the real llama.cpp servers (data files
//! in `tests/data/streams/`), served verbatim over loopback, one event per chunk as the
//! servers send them.

use std::time::Duration;

use codegen_core::__private::tools::tool_specs;
use codegen_core::backend::{Backend, BackendConfig, BackendKind, ChatRequest, ChatResponse, Delivery, RetryPolicy};
use codegen_core::chat::{Arguments, Message};
use promptgen_tests::{FakeLlm, Reply};
use serde_json::{Value, json};

fn data(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/streams").join(name);
    std::fs::read_to_string(&path).unwrap()
}

/// A captured stream, one event per chunk.
fn stream(name: &str) -> Reply {
    let body = data(name);
    let events: Vec<String> = body.split_inclusive("\n\n").map(str::to_string).collect();
    Reply::raw_stream(&events.iter().map(String::as_str).collect::<Vec<_>>())
}

fn whole(name: &str) -> Reply {
    Reply::json(serde_json::from_str::<Value>(&data(name)).unwrap())
}

fn backend(server: &FakeLlm) -> Box<dyn Backend> {
    let mut config = BackendConfig::new(BackendKind::OpenAi);
    config.base_url = Some(format!("{}/v1", server.url()));
    config.http.retry = RetryPolicy { initial_backoff: Duration::from_millis(1), ..RetryPolicy::default() };
    config.open().unwrap()
}

fn ask(backend: &mut dyn Backend, tools: bool) -> ChatResponse {
    let specs = if tools { tool_specs() } else { Vec::new() };
    let messages = [Message::system("You are brief."), Message::user("Say hello.")];
    let request = ChatRequest {
        model: "smollm2",
        messages: &messages,
        tools: &specs,
        seed: Some(1),
        temperature: Some(0.0),
        constraint: None,
    };
    backend.chat(&request).unwrap()
}

#[test]
fn llama_server_streams_text_and_its_token_counts() {
    let server = FakeLlm::start(vec![stream("llama-server-text.sse")]);
    let reply = ask(backend(&server).as_mut(), false);
    assert_eq!(reply.delivery, Delivery::Streamed);
    assert_eq!(reply.message.content, "Hello! I'm here to");
    assert_eq!((reply.usage.prompt_tokens, reply.usage.completion_tokens), (Some(21), Some(6)));
    assert_eq!(reply.finish_reason.as_deref(), Some("length"));
    assert_eq!(server.requests().len(), 1);
}

/// llama-cpp-python ignores `stream_options`: its streams never carry token counts, which
/// the lock records, so the reply is asked for whole, and later ones are not streamed.
#[test]
fn llama_cpp_python_streams_without_token_counts_so_the_reply_is_asked_for_whole() {
    let server = FakeLlm::start(vec![
        stream("llama-cpp-python-text.sse"),
        whole("llama-cpp-python-text.json"),
        whole("llama-cpp-python-text.json"),
    ]);
    let mut backend = backend(&server);
    let reply = ask(backend.as_mut(), false);
    assert!(
        matches!(&reply.delivery, Delivery::Fallback(reason) if reason.contains("no token counts")),
        "{:?}",
        reply.delivery
    );
    assert_eq!(reply.message.content, "Hello! I'm here to");
    assert_eq!((reply.usage.prompt_tokens, reply.usage.completion_tokens), (Some(21), Some(6)));
    assert_eq!(ask(backend.as_mut(), false).delivery, Delivery::Whole);
    let streamed: Vec<Value> = server.requests().iter().map(|r| r.json()["stream"].clone()).collect();
    assert_eq!(streamed, [json!(true), json!(false), json!(false)]);
}

/// llama-cpp-python answers a streamed request with tools with HTTP 200 and nothing at all.
#[test]
fn llama_cpp_python_sends_an_empty_stream_when_tools_are_offered_so_the_reply_is_asked_for_whole() {
    assert_eq!(data("llama-cpp-python-tools.sse"), "");
    let server = FakeLlm::start(vec![
        Reply::empty_stream().header("content-type", "text/event-stream; charset=utf-8"),
        whole("llama-cpp-python-tools.json"),
    ]);
    let reply = ask(backend(&server).as_mut(), true);
    assert!(
        matches!(&reply.delivery, Delivery::Fallback(reason) if reason.contains("empty stream")),
        "{:?}",
        reply.delivery
    );
    let call = &reply.message.tool_calls[0];
    assert_eq!(call.id, "call__0_write_file_cmpl-92ba7f89-e396-473b-bf78-4127068128cb");
    let expected = json!({"path": "write_file.txt", "content": "This is a test."});
    assert_eq!(call.arguments, Arguments::Object(expected.as_object().unwrap().clone()));
    assert_eq!(reply.usage.completion_tokens, Some(23));
    let requests = server.requests();
    assert_eq!(
        (requests[0].json()["stream"].clone(), requests[1].json()["stream"].clone()),
        (json!(true), json!(false))
    );
}
