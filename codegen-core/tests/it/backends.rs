//! The HTTP backends against the fake LLM server: wire shapes, retries, and the errors a
//! user acts on.

use std::time::Duration;

use codegen_core::__private::tools::tool_specs;
use codegen_core::backend::{Backend, BackendConfig, BackendError, BackendKind, ChatRequest, HttpConfig, RetryPolicy};
use codegen_core::chat::{Arguments, Message, ToolCall};
use promptgen_tests::{ArgsShape, FakeCall, FakeLlm, Reply, Turn, refused_url};
use serde_json::json;

use crate::support::{hello, object};

/// Quick retries and short timeouts, so failure paths take milliseconds.
fn fast_http() -> HttpConfig {
    HttpConfig {
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_millis(1500),
        first_byte_timeout: Duration::from_millis(1500),
        idle_timeout: Duration::from_millis(1500),
        retry: RetryPolicy {
            max_retries: 2,
            initial_backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(20),
            max_retry_after: Duration::from_millis(60),
        },
    }
}

fn open(kind: BackendKind, base_url: String) -> Box<dyn Backend> {
    let mut config = BackendConfig::new(kind);
    config.base_url = Some(base_url);
    config.http = fast_http();
    config.open().unwrap()
}

fn ollama(server: &FakeLlm) -> Box<dyn Backend> {
    open(BackendKind::Ollama, server.url())
}

fn openai(server: &FakeLlm) -> Box<dyn Backend> {
    open(BackendKind::OpenAi, format!("{}/v1", server.url()))
}

fn ask(backend: &mut dyn Backend, messages: &[Message]) -> Result<codegen_core::backend::ChatResponse, BackendError> {
    let specs = tool_specs();
    backend.chat(&ChatRequest {
        model: "m1",
        messages,
        tools: &specs,
        seed: Some(7),
        temperature: Some(0.0),
        constraint: None,
    })
}

#[test]
fn ollama_request_has_the_native_shape() {
    let server = FakeLlm::start(vec![Reply::turn(Turn::text("hi").tokens(169, 18))]);
    let mut backend = ollama(&server);
    let reply = ask(backend.as_mut(), &hello()).unwrap();
    assert_eq!(reply.message.content, "hi");
    assert_eq!(reply.usage.prompt_tokens, Some(169));
    assert_eq!(reply.usage.completion_tokens, Some(18));

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].method, "POST");
    assert_eq!(requests[0].path, "/api/chat");
    let body = requests[0].json();
    assert_eq!(body["model"], "m1");
    assert_eq!(body["stream"], true, "replies are streamed by default");
    assert!(body.get("stream_options").is_none(), "Ollama's last line always has the counts: {body}");
    assert_eq!(body["think"], false);
    assert_eq!(
        body["options"],
        json!({
            "seed": 7,
            "temperature": 0.0,
            "num_ctx": BackendConfig::DEFAULT_NUM_CTX,
            "num_predict": BackendConfig::DEFAULT_MAX_OUTPUT_TOKENS,
        })
    );
    assert_eq!(
        body["messages"],
        json!([{"role": "system", "content": "sys"}, {"role": "user", "content": "write a.rs"}])
    );
    let tools = body["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 5);
    assert_eq!(tools[1]["type"], "function");
    assert_eq!(tools[1]["function"]["name"], "write_file");
    assert_eq!(tools[1]["function"]["parameters"]["required"], json!(["path", "content"]));
    assert!(requests[0].header("authorization").is_none());
}

#[test]
fn ollama_num_ctx_and_output_cap_are_configurable_and_tools_are_left_out_when_none_are_offered() {
    let server = FakeLlm::start(vec![Reply::turn(Turn::text("ok"))]);
    let mut config = BackendConfig::new(BackendKind::Ollama);
    config.base_url = Some(server.url());
    config.num_ctx = 32_768;
    config.max_output_tokens = 512;
    let mut backend = config.open().unwrap();
    backend
        .chat(&ChatRequest {
            model: "m",
            messages: &hello(),
            tools: &[],
            seed: None,
            temperature: None,
            constraint: None,
        })
        .unwrap();
    let body = server.requests()[0].json();
    assert_eq!(body["options"], json!({"num_ctx": 32768, "num_predict": 512}));
    assert!(body.get("tools").is_none(), "{body}");
}

#[test]
fn ollama_tool_calls_with_and_without_ids() {
    let server = FakeLlm::start(vec![Reply::turn(Turn::calls(vec![
        FakeCall::new("write_file", json!({"path": "a.rs", "content": "fn a() {}"})).id("call_ab12cd34"),
        FakeCall::new("read_file", json!({"path": "b.rs"})),
        FakeCall::new("finish", json!({})).shape(ArgsShape::String),
    ]))]);
    let mut backend = ollama(&server);
    let reply = ask(backend.as_mut(), &hello()).unwrap();
    let calls = &reply.message.tool_calls;
    assert_eq!(calls.len(), 3);
    assert_eq!(calls[0].id, "call_ab12cd34");
    assert_eq!(calls[0].arguments, object(json!({"path": "a.rs", "content": "fn a() {}"})));
    assert!(!calls[1].id.is_empty() && calls[1].id != calls[0].id, "a missing id is minted");
    assert_ne!(calls[1].id, calls[2].id);
    assert_eq!(calls[2].arguments, object(json!({})));
    // `done_reason` is "stop" even on a tool turn: the calls are what counts.
    assert_eq!(reply.finish_reason.as_deref(), Some("stop"));
}

#[test]
fn ollama_echoes_tool_calls_as_objects_and_results_with_the_tool_name() {
    let server = FakeLlm::start(vec![Reply::turn(Turn::text("done"))]);
    let mut backend = ollama(&server);
    let call = ToolCall { id: "c1".into(), name: "read_file".into(), arguments: object(json!({"path": "a.rs"})) };
    let mut messages = hello();
    messages.push(Message::assistant("", vec![call.clone()]));
    messages.push(Message::tool_result(&call, "fn a() {}"));
    ask(backend.as_mut(), &messages).unwrap();
    let body = server.requests()[0].json();
    assert_eq!(
        body["messages"][2],
        json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {"name": "read_file", "arguments": {"path": "a.rs"}}}]})
    );
    assert_eq!(
        body["messages"][3],
        json!({"role": "tool", "content": "fn a() {}", "tool_name": "read_file", "tool_call_id": "c1"})
    );
}

#[test]
fn openai_request_has_the_chat_completions_shape() {
    let server = FakeLlm::start(vec![Reply::turn(Turn::text("hi").tokens(11, 3))]);
    let mut config = BackendConfig::new(BackendKind::OpenAi);
    config.base_url = Some(format!("{}/v1/", server.url()));
    config.api_key = Some("sk-test".into());
    let mut backend = config.open().unwrap();
    let reply = ask(backend.as_mut(), &hello()).unwrap();
    assert_eq!(reply.message.content, "hi");
    assert_eq!((reply.usage.prompt_tokens, reply.usage.completion_tokens), (Some(11), Some(3)));
    let request = &server.requests()[0];
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(request.header("authorization"), Some("Bearer sk-test"));
    let body = request.json();
    assert_eq!(body["tool_choice"], "auto");
    assert_eq!(body["seed"], 7);
    assert_eq!(body["temperature"], 0.0);
    assert_eq!(body["stream"], true, "replies are streamed by default");
    assert_eq!(body["stream_options"], json!({"include_usage": true}), "token counts are asked for");
    assert_eq!(body["max_tokens"], BackendConfig::DEFAULT_MAX_OUTPUT_TOKENS);
    assert!(body.get("max_completion_tokens").is_none(), "{body}");
    assert_eq!(body["tools"][0]["type"], "function");
    assert_eq!(body["tools"][0]["function"]["name"], "read_file");
    assert!(body.get("options").is_none() && body.get("think").is_none());
}

/// Without a cap a babbling model filled llama-server's whole context (4096 tokens, 106 s),
/// and the next request overflowed it: every request carries the cap.
#[test]
fn openai_requests_carry_the_output_cap_in_the_field_the_server_reads() {
    let server = FakeLlm::start(vec![Reply::turn(Turn::text("ok"))]);
    let mut config = BackendConfig::new(BackendKind::OpenAi);
    config.base_url = Some(format!("{}/v1", server.url()));
    config.max_output_tokens = 300;
    config
        .open()
        .unwrap()
        .chat(&ChatRequest {
            model: "m",
            messages: &hello(),
            tools: &[],
            seed: None,
            temperature: None,
            constraint: None,
        })
        .unwrap();
    let body = server.requests()[0].json();
    assert_eq!(body["max_tokens"], 300, "{body}");
    assert!(body.get("max_completion_tokens").is_none(), "{body}");
}

#[test]
fn a_context_overflow_from_llama_server_says_what_to_change_and_is_not_retried() {
    // The body llama-server sent when a babbling reply had filled its context (seen here).
    let body = json!({"error": {"code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 4155, "n_ctx": 4096,
        "message": "request (4155 tokens) exceeds the available context size (4096 tokens), try increasing it"}});
    let server = FakeLlm::start(vec![Reply::status(400, body)]);
    let mut backend = openai(&server);
    let err = ask(backend.as_mut(), &hello()).unwrap_err();
    assert!(matches!(err, BackendError::ContextOverflow { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("4155 tokens") && text.contains("--ctx-size") && text.contains("fewer or smaller inputs"),
        "{text}"
    );
    assert_eq!(server.requests().len(), 1, "an overflow is not retried");
}

#[test]
fn a_context_overflow_from_llama_cpp_python_is_recognised_too() {
    let server = FakeLlm::start(vec![Reply::openai_error(
        400,
        "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens (2100 in the messages, 4096 in the completion). Please reduce the length of the messages or completion.",
        "invalid_request_error",
        Some("context_length_exceeded"),
    )]);
    let err = ask(openai(&server).as_mut(), &hello()).unwrap_err();
    assert!(matches!(err, BackendError::ContextOverflow { .. }), "{err:?}");
}

#[test]
fn openai_arguments_as_string_empty_string_object_and_invalid_text() {
    let server = FakeLlm::start(vec![Reply::turn(Turn::calls(vec![
        FakeCall::new("write_file", json!({"path": "a.rs", "content": "x"})),
        FakeCall::new("list_files", json!(null)).shape(ArgsShape::RawString(String::new())),
        FakeCall::new("read_file", json!({"path": "b.rs"})).shape(ArgsShape::Object),
        FakeCall::new("write_file", json!(null)).shape(ArgsShape::RawString("{\"path\": \"a.rs\", ".into())),
    ]))]);
    let mut backend = openai(&server);
    let reply = ask(backend.as_mut(), &hello()).unwrap();
    let calls = &reply.message.tool_calls;
    assert_eq!(calls[0].arguments, object(json!({"path": "a.rs", "content": "x"})));
    assert_eq!(calls[1].arguments, object(json!({})));
    assert_eq!(calls[2].arguments, object(json!({"path": "b.rs"})));
    match &calls[3].arguments {
        Arguments::Malformed { raw, error } => {
            assert_eq!(raw, "{\"path\": \"a.rs\", ");
            assert!(error.contains("not valid JSON"), "{error}");
        }
        other => panic!("expected malformed arguments, got {other:?}"),
    }
    assert_eq!(reply.finish_reason.as_deref(), Some("tool_calls"));
}

#[test]
fn openai_echoes_calls_as_json_text_with_type_function_and_string_content() {
    let server = FakeLlm::start(vec![Reply::turn(Turn::text("done"))]);
    let mut backend = openai(&server);
    let call = ToolCall { id: "call_1".into(), name: "read_file".into(), arguments: object(json!({"path": "a.rs"})) };
    let mut messages = hello();
    messages.push(Message::assistant("", vec![call.clone()]));
    messages.push(Message::tool_result(&call, "fn a() {}"));
    ask(backend.as_mut(), &messages).unwrap();
    let body = server.requests()[0].json();
    assert_eq!(
        body["messages"][2],
        json!({"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a.rs\"}"}}]})
    );
    assert_eq!(body["messages"][3], json!({"role": "tool", "content": "fn a() {}", "tool_call_id": "call_1"}));
}

/// llama-server parses the arguments of every echoed call and answers the whole request with
/// HTTP 500 "Failed to parse tool call arguments as JSON" when one does not parse (seen with a
/// call its output cap had cut short): malformed arguments are echoed as `{}`.
#[test]
fn openai_echoes_malformed_arguments_as_an_empty_object_so_the_server_accepts_the_history() {
    let server = FakeLlm::start(vec![Reply::turn(Turn::text("done"))]);
    let mut backend = openai(&server);
    let cut = r#"{"path": "hello.txt", "content": "Hello, World! This is a te"#;
    let call =
        ToolCall { id: "call_1".into(), name: "write_file".into(), arguments: Arguments::from_value(json!(cut)) };
    assert!(matches!(call.arguments, Arguments::Malformed { .. }), "{:?}", call.arguments);
    let mut messages = hello();
    messages.push(Message::assistant("", vec![call.clone()]));
    messages.push(Message::tool_result(&call, "the arguments are not valid JSON"));
    ask(backend.as_mut(), &messages).unwrap();
    let body = server.requests()[0].json();
    assert_eq!(body["messages"][2]["tool_calls"][0]["function"]["arguments"], "{}");
}

#[test]
fn server_errors_are_retried_then_succeed() {
    for status in [500, 502, 503, 408, 409] {
        let server = FakeLlm::start(vec![Reply::error(status, "busy"), Reply::turn(Turn::text("ok"))]);
        let mut backend = openai(&server);
        let reply = ask(backend.as_mut(), &hello()).unwrap();
        assert_eq!(reply.message.content, "ok", "status {status}");
        assert_eq!(server.requests().len(), 2, "status {status}");
        assert_eq!(reply.retries.len(), 1);
        assert_eq!(reply.retries[0].reason, format!("HTTP {status}"));
    }
}

#[test]
fn retries_stop_at_the_budget_and_say_how_many_attempts_were_made() {
    let server = FakeLlm::start(vec![Reply::error(503, "queue full"); 5]);
    let mut backend = ollama(&server);
    let err = ask(backend.as_mut(), &hello()).unwrap_err();
    assert_eq!(server.requests().len(), 3, "one attempt and two retries");
    match &err {
        BackendError::Status { status: 503, attempts: 3, server_message, .. } => {
            assert_eq!(server_message, "queue full")
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("HTTP 503 (3 attempts): queue full"), "{err}");
}

#[test]
fn retry_after_is_honoured_up_to_its_bound() {
    let server = FakeLlm::start(vec![
        Reply::error(429, "slow down").header("retry-after-ms", "25"),
        Reply::error(429, "slow down").header("Retry-After", "3600"),
        Reply::turn(Turn::text("ok")),
    ]);
    let mut backend = openai(&server);
    let reply = ask(backend.as_mut(), &hello()).unwrap();
    let waits: Vec<Duration> = reply.retries.iter().map(|r| r.waited).collect();
    assert_eq!(waits, vec![Duration::from_millis(25), Duration::from_millis(60)], "the hour is cut to the 60 ms bound");
}

#[test]
fn client_errors_are_not_retried() {
    for (status, message) in
        [(400, "bad request"), (401, "Incorrect API key"), (403, "forbidden"), (404, "model `m1` not found")]
    {
        let server = FakeLlm::start(vec![Reply::error(status, message), Reply::turn(Turn::text("never"))]);
        let mut backend = openai(&server);
        assert!(ask(backend.as_mut(), &hello()).is_err());
        assert_eq!(server.requests().len(), 1, "HTTP {status} must not be retried");
    }
}

#[test]
fn insufficient_quota_is_not_retried_and_says_so() {
    let server = FakeLlm::start(vec![
        Reply::openai_error(429, "You exceeded your current quota", "insufficient_quota", Some("insufficient_quota")),
        Reply::turn(Turn::text("never")),
    ]);
    let mut backend = openai(&server);
    let err = ask(backend.as_mut(), &hello()).unwrap_err();
    assert!(matches!(err, BackendError::QuotaExceeded { .. }), "{err:?}");
    assert_eq!(server.requests().len(), 1);
    assert!(err.to_string().contains("not retried"), "{err}");
}

#[test]
fn bad_api_key_names_the_variable_to_fix() {
    let server = FakeLlm::start(vec![Reply::openai_error(
        401,
        "Incorrect API key provided: sk-bad",
        "invalid_request_error",
        Some("invalid_api_key"),
    )]);
    let mut backend = openai(&server);
    let err = ask(backend.as_mut(), &hello()).unwrap_err();
    assert!(matches!(err, BackendError::Unauthorized { status: 401, .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("Incorrect API key provided") && text.contains("OPENAI_API_KEY"), "{text}");
}

#[test]
fn model_not_pulled_tells_the_pull_command() {
    let server = FakeLlm::start(vec![Reply::error(404, "model 'qwen2.5-coder:7b' not found, try pulling it first")]);
    let mut backend = ollama(&server);
    let specs = tool_specs();
    let err = backend
        .chat(&ChatRequest {
            model: "qwen2.5-coder:7b",
            messages: &hello(),
            tools: &specs,
            seed: None,
            temperature: None,
            constraint: None,
        })
        .unwrap_err();
    assert!(matches!(err, BackendError::ModelNotFound { .. }), "{err:?}");
    assert!(err.to_string().contains("ollama pull qwen2.5-coder:7b"), "{err}");
}

#[test]
fn a_model_without_tools_names_the_protocols_to_use_instead() {
    let server = FakeLlm::start(vec![Reply::error(400, "registry.ollama.ai/library/gemma:2b does not support tools")]);
    let mut backend = ollama(&server);
    let err = ask(backend.as_mut(), &hello()).unwrap_err();
    assert!(matches!(err, BackendError::ToolsUnsupported { .. }), "{err:?}");
    assert!(err.to_string().contains("protocol = \"json\""), "{err}");
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn server_not_running_names_the_url_and_how_to_start_ollama() {
    let url = refused_url();
    let mut backend = open(BackendKind::Ollama, url.clone());
    let err = ask(backend.as_mut(), &hello()).unwrap_err();
    match &err {
        BackendError::Unreachable { attempts, .. } => assert_eq!(*attempts, 3, "connection errors are retried"),
        other => panic!("{other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains(&url) && text.contains("ollama serve") && text.contains("OLLAMA_HOST"), "{text}");
    // The hint names the base URL to put in OLLAMA_HOST, never the endpoint.
    assert!(text.contains(&format!("instead of {url}.")) && !text.contains("/api/chat."), "{text}");

    let mut backend = open(BackendKind::OpenAi, format!("{url}/v1"));
    let text = ask(backend.as_mut(), &hello()).unwrap_err().to_string();
    assert!(text.contains("OPENAI_BASE_URL") && text.contains(&url), "{text}");
}

#[test]
fn a_stall_past_the_request_timeout_is_a_timeout_and_is_not_retried() {
    // A whole reply (streaming off) has one limit for all of it.
    let server = FakeLlm::start(vec![Reply::stall(Duration::from_secs(30)), Reply::turn(Turn::text("never"))]);
    let mut config = BackendConfig::new(BackendKind::Ollama);
    config.base_url = Some(server.url());
    config.http = fast_http();
    config.stream = false;
    let err = ask(config.open().unwrap().as_mut(), &hello()).unwrap_err();
    assert!(matches!(err, BackendError::Timeout { .. }), "{err:?}");
    assert_eq!(server.requests().len(), 1);
    assert_eq!(server.requests()[0].json()["stream"], false);
    assert!(err.to_string().contains("raise the request timeout"), "{err}");
}

#[test]
fn a_truncated_body_or_a_hang_up_is_retried() {
    let good = json!({"model": "m1", "message": {"role": "assistant", "content": "whole"}, "done": true});
    let server = FakeLlm::start(vec![Reply::truncated(good.clone()), Reply::hang_up(), Reply::json(good)]);
    let mut backend = ollama(&server);
    let reply = ask(backend.as_mut(), &hello()).unwrap();
    assert_eq!(reply.message.content, "whole");
    assert_eq!(reply.retries.len(), 2);
    assert_eq!(server.requests().len(), 3);
}

#[test]
fn a_reply_broken_on_every_attempt_is_a_clear_error() {
    let body = json!({"model": "m1", "message": {"role": "assistant", "content": "whole"}, "done": true});
    let server =
        FakeLlm::start(vec![Reply::truncated(body.clone()), Reply::truncated(body.clone()), Reply::truncated(body)]);
    let mut backend = ollama(&server);
    let err = ask(backend.as_mut(), &hello()).unwrap_err();
    assert!(matches!(err, BackendError::Interrupted { attempts: 3, .. }), "{err:?}");
}

#[test]
fn a_2xx_that_is_not_a_chat_response_is_reported_with_its_start() {
    let server = FakeLlm::start(vec![Reply::json(json!({"unexpected": true}))]);
    let mut backend = openai(&server);
    let err = ask(backend.as_mut(), &hello()).unwrap_err();
    assert!(matches!(err, BackendError::BadResponse { .. }), "{err:?}");
    assert!(err.to_string().contains("choices"), "{err}");

    let server =
        FakeLlm::start(vec![Reply::json(json!({"error": "an error was encountered while running the model"}))]);
    let mut backend = ollama(&server);
    let err = ask(backend.as_mut(), &hello()).unwrap_err();
    assert!(err.to_string().contains("an error was encountered while running the model"), "{err}");
}

#[test]
fn a_wrong_base_url_suggests_the_v1_suffix() {
    let server = FakeLlm::start(vec![Reply::status(404, json!({"error": "404 page not found"}))]);
    let mut backend = open(BackendKind::OpenAi, server.url());
    let err = ask(backend.as_mut(), &hello()).unwrap_err();
    assert!(err.to_string().contains("/v1"), "{err}");
}
