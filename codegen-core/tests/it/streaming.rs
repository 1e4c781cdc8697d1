//! Streamed replies through the real HTTP backends and the fake LLM server: assembly in both
//! protocols, the fallbacks to a whole reply, the silence limits, and that nothing recorded
//! depends on whether a reply streamed.

use std::time::Duration;

use codegen_core::__private::tools::tool_specs;
use codegen_core::backend::{
    Backend, BackendConfig, BackendError, BackendKind, ChatRequest, ChatResponse, Delivery, HttpConfig, Progress,
    RetryPolicy,
};
use codegen_core::chat::Arguments;
use codegen_core::sandbox::Sandbox;
use codegen_core::transcript::{Event, Volatility};
use codegen_core::{Observer, Step, ToolProtocol};
use promptgen_tests::{ArgsShape, FakeCall, FakeLlm, Reply, Turn};
use serde_json::{Value, json};

use crate::support::{base_url, hello, object};

/// Short limits, so that failure paths take milliseconds: 300 ms of silence is a stall.
fn impatient() -> HttpConfig {
    HttpConfig {
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(5),
        first_byte_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_millis(300),
        retry: RetryPolicy { initial_backoff: Duration::from_millis(5), ..RetryPolicy::none() },
    }
}

fn config(kind: BackendKind, server: &FakeLlm) -> BackendConfig {
    let mut config = BackendConfig::new(kind);
    config.base_url = Some(base_url(kind, server));
    config.http = impatient();
    config
}

fn open(kind: BackendKind, server: &FakeLlm) -> Box<dyn Backend> {
    config(kind, server).open().unwrap()
}

/// Asks with the tools every step is offered, or with none.
fn ask(backend: &mut dyn Backend, tools: bool) -> Result<ChatResponse, BackendError> {
    let specs = if tools { tool_specs() } else { Vec::new() };
    backend.chat(&ChatRequest {
        model: "m",
        messages: &hello(),
        tools: &specs,
        seed: Some(1),
        temperature: Some(0.0),
        constraint: None,
    })
}

/// Whether each request asked for a stream.
fn streamed(server: &FakeLlm) -> Vec<bool> {
    server.requests().iter().map(|r| r.json()["stream"] == true).collect()
}

const BOTH: [BackendKind; 2] = [BackendKind::Ollama, BackendKind::OpenAi];

#[test]
fn openai_assembles_text_and_tool_calls_from_fragments_with_usage_from_the_last_chunk() {
    let args = json!({"path": "src/a.rs", "content": "fn a() -> &'static str {\n    \"é\\\"\"\n}\n"});
    let turn = Turn::calls(vec![
        FakeCall::new("write_file", args.clone()).id("call_w"),
        FakeCall::new("finish", json!({"summary": "done"})),
    ])
    .with_content("I will write it.")
    .tokens(120, 33);
    let server = FakeLlm::start(vec![Reply::turn(turn).in_pieces(3)]);
    let reply = ask(open(BackendKind::OpenAi, &server).as_mut(), true).unwrap();
    assert_eq!(reply.delivery, Delivery::Streamed);
    assert_eq!(reply.message.content, "I will write it.");
    let calls = &reply.message.tool_calls;
    assert_eq!(calls.len(), 2);
    assert_eq!((calls[0].id.as_str(), calls[0].name.as_str()), ("call_w", "write_file"));
    assert_eq!(calls[0].arguments, object(args));
    assert_eq!((calls[1].id.as_str(), calls[1].name.as_str()), ("call_1", "finish"));
    assert_eq!(calls[1].arguments, object(json!({"summary": "done"})));
    assert_eq!((reply.usage.prompt_tokens, reply.usage.completion_tokens), (Some(120), Some(33)));
    assert_eq!(reply.finish_reason.as_deref(), Some("tool_calls"));
    let request = server.requests()[0].json();
    assert_eq!(
        (request["stream"].clone(), request["stream_options"].clone()),
        (json!(true), json!({"include_usage": true}))
    );
}

#[test]
fn ollama_assembles_text_pieces_and_whole_tool_calls_with_usage_from_the_done_line() {
    let turn = Turn::calls(vec![
        FakeCall::new("read_file", json!({"path": "a.rs"})),
        FakeCall::new("write_file", json!({"path": "b.rs", "content": "b"})).id("call_x"),
    ])
    .with_content("Reading first.")
    .tokens(169, 18);
    let server = FakeLlm::start(vec![Reply::turn(turn).in_pieces(2)]);
    let reply = ask(open(BackendKind::Ollama, &server).as_mut(), true).unwrap();
    assert_eq!(reply.delivery, Delivery::Streamed);
    assert_eq!(reply.message.content, "Reading first.");
    let calls: Vec<(&str, &Arguments)> =
        reply.message.tool_calls.iter().map(|c| (c.name.as_str(), &c.arguments)).collect();
    assert_eq!(
        calls,
        [
            ("read_file", &object(json!({"path": "a.rs"}))),
            ("write_file", &object(json!({"path": "b.rs", "content": "b"})))
        ]
    );
    assert!(!reply.message.tool_calls[0].id.is_empty(), "a missing id is minted");
    assert_eq!(reply.message.tool_calls[1].id, "call_x");
    assert_eq!((reply.usage.prompt_tokens, reply.usage.completion_tokens), (Some(169), Some(18)));
    assert_eq!(reply.finish_reason.as_deref(), Some("stop"));
}

/// The tool calls of every shape, text, and the counts: streamed or whole, the same response
/// (but for how it arrived).
#[test]
fn a_streamed_reply_is_the_response_the_whole_reply_gives() {
    let turns = || {
        vec![
            Turn::text("just text, with ünïcode and \"quotes\"\nand lines").tokens(7, 8),
            Turn::calls(vec![
                FakeCall::new("write_file", json!({"path": "a.rs", "content": "x"})),
                FakeCall::new("list_files", json!(null)).shape(ArgsShape::RawString(String::new())),
                FakeCall::new("read_file", json!({"path": "b.rs"})).shape(ArgsShape::Object),
                FakeCall::new("write_file", json!(null)).shape(ArgsShape::RawString("{\"path\": \"a.rs\", ".into())),
                FakeCall::new("finish", json!({})).id("given"),
            ])
            .with_content("calls"),
        ]
    };
    for kind in BOTH {
        let replies = |stream: bool| {
            let server = FakeLlm::start(turns().into_iter().map(|t| Reply::turn(t).in_pieces(3)).collect());
            let mut config = config(kind, &server);
            config.stream = stream;
            let mut backend = config.open().unwrap();
            let replies: Vec<ChatResponse> = (0..2).map(|_| ask(backend.as_mut(), true).unwrap()).collect();
            assert_eq!(streamed(&server), [stream, stream]);
            replies
        };
        let (streamed, whole) = (replies(true), replies(false));
        for (mut streamed, whole) in streamed.into_iter().zip(whole) {
            assert_eq!((&streamed.delivery, &whole.delivery), (&Delivery::Streamed, &Delivery::Whole));
            streamed.delivery = Delivery::Whole;
            assert_eq!(streamed, whole, "{kind}");
        }
    }
}

/// The transcript a lock records (volatile data left out) does not depend on streaming.
#[test]
fn a_step_streamed_and_the_same_step_whole_record_the_same_transcript() {
    let script = || {
        vec![
            Reply::turn(Turn::call("list_files", json!({})).with_content("Let me look.").tokens(100, 12)),
            // A reply without a call while v.rs is missing: the model is told so.
            Reply::turn(Turn::text("Here is my plan.").tokens(120, 5)),
            Reply::turn(
                Turn::call("write_file", json!({"path": "v.rs", "content": "pub trait View {}\n"})).tokens(140, 30),
            ),
            Reply::turn(Turn::call("finish", json!({"summary": "Wrote v.rs."})).tokens(190, 9)),
        ]
    };
    for kind in BOTH {
        let run = |stream: bool| {
            let server = FakeLlm::start(script().into_iter().map(|r| r.in_pieces(2)).collect());
            let mut config = config(kind, &server);
            config.stream = stream;
            let dir = tempfile::tempdir().unwrap();
            let mut sandbox = Sandbox::builder(dir.path().join("out")).build().unwrap();
            let mut step = Step::new("m", "Write v.rs.");
            step.expect_output("v.rs").protocol(ToolProtocol::Native);
            let output = step.run(config.open().unwrap().as_mut(), &mut sandbox).unwrap();
            assert_eq!(streamed(&server), [stream; 4], "{kind}");
            output.transcript
        };
        let (streamed, whole) = (run(true), run(false));
        assert_eq!(streamed.to_jsonl(Volatility::Omit), whole.to_jsonl(Volatility::Omit), "{kind}");
        let counts = |t: &codegen_core::transcript::Transcript| {
            let totals = t.totals();
            (totals.model_calls, totals.prompt_tokens, totals.completion_tokens, totals.repairs)
        };
        assert_eq!(counts(&streamed), counts(&whole));
        assert_eq!(counts(&streamed), (4, 550, 56, 1));
        let deliveries: Vec<String> = streamed
            .to_jsonl(Volatility::Keep)
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok()?["volatile"].get("delivery").cloned())
            .map(|d| d.to_string())
            .collect();
        assert_eq!(deliveries, ["\"streamed\""; 4], "how each reply came is kept with the volatile data");
    }
}

/// llama-cpp-python answers a streamed request that offers tools with HTTP 200 and an empty
/// stream (its log: "Automatic streaming tool choice is not supported").
#[test]
fn an_empty_stream_is_asked_again_whole_and_requests_with_tools_are_not_streamed_again() {
    let server = FakeLlm::start(vec![
        Reply::empty_stream(),
        Reply::turn(Turn::call("write_file", json!({"path": "a.rs", "content": "a"})).tokens(50, 6)),
        Reply::turn(Turn::call("finish", json!({}))),
        Reply::turn(Turn::text("no tools, streamed")),
    ]);
    let mut backend = open(BackendKind::OpenAi, &server);
    let first = ask(backend.as_mut(), true).unwrap();
    assert_eq!(first.message.tool_calls[0].name, "write_file");
    assert_eq!(first.usage.prompt_tokens, Some(50));
    match &first.delivery {
        Delivery::Fallback(reason) => {
            assert!(reason.contains("empty stream") && reason.contains("requests that offer tools"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    let second = ask(backend.as_mut(), true).unwrap();
    assert_eq!(second.delivery, Delivery::Whole);
    let third = ask(backend.as_mut(), false).unwrap();
    assert_eq!((third.message.content.as_str(), &third.delivery), ("no tools, streamed", &Delivery::Streamed));
    assert_eq!(streamed(&server), [true, false, false, true], "the failed attempt is paid once");
    let second_request = server.requests()[1].json();
    assert!(second_request.get("stream_options").is_none(), "{second_request}");
    assert_eq!(second_request["tools"], server.requests()[0].json()["tools"], "the same request, whole");
}

#[test]
fn a_stream_cut_before_its_final_event_is_asked_again_whole() {
    let turn =
        || Turn::call("write_file", json!({"path": "a.rs", "content": "fn a() {}"})).with_content("abc").tokens(9, 9);
    for kind in BOTH {
        // Ollama sends 3 chunks (the text, the call, the last line), OpenAI more.
        for cut in [Reply::turn(turn()).cut_after(2), Reply::turn(turn()).hang_up_after(2)] {
            let server = FakeLlm::start(vec![cut, Reply::turn(turn())]);
            let mut backend = open(kind, &server);
            let reply = ask(backend.as_mut(), true).unwrap();
            assert_eq!(streamed(&server), [true, false], "{kind}");
            assert_eq!(reply.message.content, "abc", "the whole reply, not the pieces before the cut");
            assert_eq!(reply.message.tool_calls[0].arguments, object(json!({"path": "a.rs", "content": "fn a() {}"})));
            assert_eq!(reply.usage.completion_tokens, Some(9));
            let Delivery::Fallback(reason) = &reply.delivery else { panic!("{:?}", reply.delivery) };
            assert!(reason.contains("after") && reason.contains("pieces"), "{reason}");
        }
    }
}

/// A stream that ends without `data: [DONE]` / `done: true` is never "the model said nothing".
#[test]
fn a_step_whose_reply_stream_breaks_off_goes_on_with_the_whole_reply() {
    let server = FakeLlm::start(vec![
        Reply::turn(Turn::call("write_file", json!({"path": "v.rs", "content": "v"}))).cut_after(1),
        Reply::turn(Turn::call("write_file", json!({"path": "v.rs", "content": "v"}))),
        Reply::turn(Turn::call("finish", json!({"summary": "ok"}))),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let mut sandbox = Sandbox::builder(dir.path()).build().unwrap();
    let mut step = Step::new("m", "Write v.rs.");
    step.expect_output("v.rs");
    let output = step.run(open(BackendKind::Ollama, &server).as_mut(), &mut sandbox).unwrap();
    assert_eq!(output.written, ["v.rs"]);
    assert_eq!(output.transcript.totals().model_calls, 2, "the broken stream is not a model call of its own");
    assert_eq!(streamed(&server), [true, false, false]);
    assert!(
        output.notes.iter().any(|n| n.contains("could not stream") && n.contains("asked for whole")),
        "{:?}",
        output.notes
    );
    let kept = output.transcript.to_jsonl(Volatility::Keep);
    assert!(kept.contains("\"fallback\""), "the fallback is in the volatile data: {kept}");
    assert!(!output.transcript.to_jsonl(Volatility::Omit).contains("fallback"));
}

#[test]
fn a_stream_that_stalls_midway_fails_within_the_idle_timeout_and_says_what_to_do() {
    for kind in BOTH {
        let server = FakeLlm::start(vec![
            Reply::turn(Turn::text("a long reply that stops")).in_pieces(2).stall_after(3, Duration::from_secs(30)),
            Reply::turn(Turn::text("never asked")),
        ]);
        let mut backend = open(kind, &server);
        // No tools: Ollama is allowed long silences only while it may be writing a tool call.
        let err = ask(backend.as_mut(), false).unwrap_err();
        match &err {
            BackendError::Stalled { silent, pieces, began: true, limit: "idle_timeout", .. } => {
                assert_eq!(*silent, Duration::from_millis(300));
                assert!(*pieces >= 1, "{pieces}");
            }
            other => panic!("{kind}: {other:?}"),
        }
        let text = err.to_string();
        assert!(text.contains(&server.url()), "names the server: {text}");
        assert!(text.contains("went silent for 0.3 s in the middle of its streamed reply"), "{text}");
        assert!(text.contains("stalled or crashed") && text.contains("raise `idle_timeout`"), "{text}");
        assert_eq!(server.requests().len(), 1, "a stall is not retried");
    }
}

#[test]
fn a_reply_that_never_begins_fails_within_the_first_byte_timeout() {
    let server = FakeLlm::start(vec![Reply::stall(Duration::from_secs(30))]);
    let err = ask(open(BackendKind::OpenAi, &server).as_mut(), true).unwrap_err();
    assert!(
        matches!(err, BackendError::Stalled { began: false, pieces: 0, limit: "first_byte_timeout", .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("sent nothing for 0.3 s after the request") && text.contains("first_byte_timeout"), "{text}");
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn a_slow_but_steady_stream_outlives_the_idle_timeout() {
    for kind in BOTH {
        // 4 to 8 chunks, 100 ms apart: longer than 300 ms in all, never 300 ms of silence.
        let server = FakeLlm::start(vec![
            Reply::turn(Turn::text("slow but steady").tokens(3, 15)).in_pieces(4).every(Duration::from_millis(100)),
        ]);
        let reply = ask(open(kind, &server).as_mut(), false).unwrap();
        assert_eq!((reply.message.content.as_str(), reply.usage.completion_tokens), ("slow but steady", Some(15)));
        assert_eq!(reply.delivery, Delivery::Streamed);
    }
}

/// Ollama sends nothing while the model writes a tool call, on both of its APIs: a request
/// that offers it tools is allowed the whole-request timeout of silence.
#[test]
fn ollama_may_be_silent_while_it_writes_a_tool_call() {
    // Ollama: the call's line, then 500 ms of silence (the idle limit is 300 ms), the last line.
    let call = Turn::call("write_file", json!({"path": "a.rs", "content": "a"}));
    let server = FakeLlm::start(vec![Reply::turn(call).every(Duration::from_millis(500))]);
    let reply = ask(open(BackendKind::Ollama, &server).as_mut(), true).unwrap();
    assert_eq!(reply.message.tool_calls[0].name, "write_file");

    // Ollama's `/v1` is known by its fingerprint once its first chunk has arrived; the call
    // then comes whole after a silence.
    let first = r#"data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"system_fingerprint":"fp_ollama"}

"#;
    let rest = r#"data: {"choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_o","index":0,"type":"function","function":{"name":"write_file","arguments":"{}"}}]}}],"system_fingerprint":"fp_ollama"}

data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}],"system_fingerprint":"fp_ollama"}

data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":6}}

data: [DONE]

"#;
    let server = FakeLlm::start(vec![Reply::raw_stream(&[first, rest]).every(Duration::from_millis(500))]);
    let reply = ask(open(BackendKind::OpenAi, &server).as_mut(), true).unwrap();
    assert_eq!((reply.message.tool_calls[0].id.as_str(), reply.usage.completion_tokens), ("call_o", Some(6)));

    // Any other OpenAI-compatible server streams a call as it is written: that is a stall.
    let other = first.replace("fp_ollama", "b1234");
    let server = FakeLlm::start(vec![Reply::raw_stream(&[&other, rest]).every(Duration::from_millis(500))]);
    let err = ask(open(BackendKind::OpenAi, &server).as_mut(), true).unwrap_err();
    assert!(matches!(err, BackendError::Stalled { limit: "idle_timeout", pieces: 0, began: true, .. }), "{err:?}");
}

#[test]
fn an_ollama_error_line_in_the_middle_of_a_stream_is_the_servers_error() {
    let server = FakeLlm::start(vec![
        Reply::turn(Turn::text("partial reply"))
            .in_pieces(2)
            .error_after(2, "an error was encountered while running the model"),
        Reply::turn(Turn::text("never asked")),
    ]);
    let err = ask(open(BackendKind::Ollama, &server).as_mut(), true).unwrap_err();
    assert!(matches!(err, BackendError::Status { .. }), "{err:?}");
    assert!(err.to_string().contains("an error was encountered while running the model"), "{err}");
    assert_eq!(server.requests().len(), 1, "the server's own error is reported, not retried");
}

#[test]
fn errors_in_an_openai_stream_are_reported_in_both_shapes_servers_use() {
    let llama_server = "error: {\"code\":500,\"message\":\"slot unavailable\",\"type\":\"server_error\"}\n\n";
    let openai = "data: {\"error\":{\"message\":\"The server had an error\",\"type\":\"server_error\"}}\n\n";
    for (event, message) in [(llama_server, "slot unavailable"), (openai, "The server had an error")] {
        let first = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n";
        let server = FakeLlm::start(vec![Reply::raw_stream(&[first, event])]);
        let err = ask(open(BackendKind::OpenAi, &server).as_mut(), true).unwrap_err();
        assert!(err.to_string().contains(message), "{err}");
    }
}

#[test]
fn a_stream_piece_that_is_not_json_is_a_bad_response_quoting_it() {
    let server = FakeLlm::start(vec![Reply::raw_stream(&["data: {\"choices\": [oops\n\n", "data: [DONE]\n\n"])]);
    let err = ask(open(BackendKind::OpenAi, &server).as_mut(), true).unwrap_err();
    assert!(matches!(err, BackendError::BadResponse { .. }), "{err:?}");
    assert!(err.to_string().contains("{\"choices\": [oops"), "{err}");
}

#[test]
fn a_server_that_refuses_streaming_is_asked_whole_from_then_on() {
    let server = FakeLlm::start(vec![
        Reply::error(400, "Streaming is not supported by this server"),
        Reply::turn(Turn::text("whole")),
        Reply::turn(Turn::text("whole again")),
    ]);
    let mut backend = open(BackendKind::OpenAi, &server);
    let first = ask(backend.as_mut(), false).unwrap();
    let Delivery::Fallback(reason) = &first.delivery else { panic!("{:?}", first.delivery) };
    assert!(reason.contains("HTTP 400: Streaming is not supported"), "{reason}");
    assert_eq!(ask(backend.as_mut(), true).unwrap().message.content, "whole again");
    assert_eq!(streamed(&server), [true, false, false]);

    // Other client errors are errors, whatever they say.
    let server = FakeLlm::start(vec![Reply::error(400, "upstream model is missing"), Reply::turn(Turn::text("x"))]);
    assert!(ask(open(BackendKind::OpenAi, &server).as_mut(), false).is_err());
    assert_eq!(server.requests().len(), 1);
}

/// Azure and older servers refuse `stream_options`; without it a stream may carry no token
/// counts, and then the whole reply (which has them) is asked for.
#[test]
fn a_server_that_rejects_stream_options_is_asked_without_it() {
    let turn = || Turn::text("counted").tokens(11, 2);
    let server = FakeLlm::start(vec![
        Reply::openai_error(
            400,
            "Unrecognized request argument supplied: stream_options",
            "invalid_request_error",
            None,
        ),
        Reply::turn(turn()),
        Reply::turn(turn()),
    ]);
    let reply = ask(open(BackendKind::OpenAi, &server).as_mut(), false).unwrap();
    assert_eq!((reply.message.content.as_str(), reply.usage.prompt_tokens), ("counted", Some(11)));
    let requests: Vec<Value> = server.requests().iter().map(|r| r.json()).collect();
    assert_eq!(requests[0]["stream_options"], json!({"include_usage": true}));
    assert_eq!((requests[1]["stream"].clone(), requests[1].get("stream_options")), (json!(true), None));
    assert_eq!(requests[2]["stream"], false, "the stream had no counts: asked whole");
}

/// llama-cpp-python's streams never carry token counts, which the lock records.
#[test]
fn a_stream_without_token_counts_is_asked_again_whole_and_not_streamed_again() {
    let server = FakeLlm::start(vec![
        Reply::turn(Turn::text("uncounted")).without_stream_usage(),
        Reply::turn(Turn::text("counted").tokens(40, 3)),
        Reply::turn(Turn::text("next")),
    ]);
    let mut backend = open(BackendKind::OpenAi, &server);
    let reply = ask(backend.as_mut(), false).unwrap();
    assert_eq!((reply.message.content.as_str(), reply.usage.prompt_tokens), ("counted", Some(40)));
    let Delivery::Fallback(reason) = &reply.delivery else { panic!("{:?}", reply.delivery) };
    assert!(reason.contains("no token counts"), "{reason}");
    assert_eq!(ask(backend.as_mut(), false).unwrap().delivery, Delivery::Whole);
    assert_eq!(streamed(&server), [true, false, false]);
}

#[test]
fn a_server_that_ignores_stream_and_answers_whole_is_read_whole() {
    let whole = json!({
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "whole anyway"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2}
    });
    let server = FakeLlm::start(vec![Reply::json(whole)]);
    let reply = ask(open(BackendKind::OpenAi, &server).as_mut(), true).unwrap();
    assert_eq!((reply.message.content.as_str(), &reply.delivery), ("whole anyway", &Delivery::Whole));
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn streaming_can_be_turned_off() {
    for kind in BOTH {
        let server = FakeLlm::start(vec![Reply::turn(Turn::text("whole"))]);
        let mut config = config(kind, &server);
        config.stream = false;
        let reply = ask(config.open().unwrap().as_mut(), true).unwrap();
        assert_eq!(reply.delivery, Delivery::Whole);
        let request = server.requests()[0].json();
        assert_eq!((request["stream"].clone(), request.get("stream_options")), (json!(false), None));
    }
}

#[test]
fn the_fallback_reason_is_shown_once_in_the_steps_notes() {
    let call = |name: &str, args: Value| Reply::turn(Turn::call(name, args));
    let server = FakeLlm::start(vec![
        Reply::empty_stream(),
        call("write_file", json!({"path": "a.rs", "content": "a"})),
        call("finish", json!({})),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let mut sandbox = Sandbox::builder(dir.path()).build().unwrap();
    let output = Step::new("m", "Write a.rs.").run(open(BackendKind::OpenAi, &server).as_mut(), &mut sandbox).unwrap();
    assert_eq!(output.notes.len(), 1, "{:?}", output.notes);
    assert!(
        output.notes[0].starts_with(&server.url()) && output.notes[0].contains("empty stream"),
        "{:?}",
        output.notes
    );
    let calls: Vec<&Event> = output.transcript.events.iter().filter(|e| matches!(e, Event::ModelCall { .. })).collect();
    assert_eq!(calls.len(), 2);
}

/// A progress report, owned.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    pieces: u64,
    text_chars: u64,
    argument_chars: u64,
    tool: Option<String>,
    text: String,
    elapsed: Duration,
}

fn seen(progress: &Progress<'_>) -> Seen {
    Seen {
        pieces: progress.pieces,
        text_chars: progress.text_chars,
        argument_chars: progress.argument_chars,
        tool: progress.tool.map(str::to_string),
        text: progress.text.to_string(),
        elapsed: progress.elapsed,
    }
}

fn ask_observed(backend: &mut dyn Backend, tools: bool, reports: &mut Vec<Seen>) -> ChatResponse {
    let specs = if tools { tool_specs() } else { Vec::new() };
    let request =
        ChatRequest { model: "m", messages: &hello(), tools: &specs, seed: None, temperature: None, constraint: None };
    backend.chat_observed(&request, &mut |progress| reports.push(seen(progress))).unwrap()
}

#[test]
fn the_progress_hook_sees_an_openai_reply_grow_piece_by_piece() {
    let args = json!({"path": "a.rs", "content": "fn a() {}\n"});
    let turn = Turn::call("write_file", args.clone()).with_content("Writing a.rs now.");
    let server = FakeLlm::start(vec![Reply::turn(turn).in_pieces(3)]);
    let mut reports = Vec::new();
    let reply = ask_observed(open(BackendKind::OpenAi, &server).as_mut(), true, &mut reports);

    let text: String = reports.iter().map(|r| r.text.as_str()).collect();
    assert_eq!(text, "Writing a.rs now.", "each report has the text that arrived since the last");
    let argument_text = args.to_string();
    // 6 text pieces, the call's first fragment, its arguments in pieces of 3 characters.
    let expected_pieces = 6 + 1 + argument_text.chars().count().div_ceil(3) as u64;
    assert_eq!(reports.len() as u64, expected_pieces, "one report per piece that added to the reply");
    assert!(reports.windows(2).all(|w| w[1].pieces == w[0].pieces + 1 && w[1].elapsed >= w[0].elapsed));
    let first_call = reports.iter().position(|r| r.tool.is_some()).unwrap();
    assert_eq!(first_call, 6, "the tool is named as soon as the call's first fragment arrives");
    assert!(reports[..first_call].iter().all(|r| r.tool.is_none() && r.argument_chars == 0));
    assert!(reports[first_call..].iter().all(|r| r.tool.as_deref() == Some("write_file")));
    let last = reports.last().unwrap();
    assert_eq!((last.text_chars, last.argument_chars), (17, argument_text.chars().count() as u64));
    assert_eq!(reply.message.tool_calls[0].arguments, object(args));
}

#[test]
fn the_progress_hook_sees_ollamas_text_in_pieces_and_a_tool_call_at_once() {
    let turn = Turn::call("read_file", json!({"path": "a.rs"})).with_content("héllo");
    let server = FakeLlm::start(vec![Reply::turn(turn).in_pieces(2)]);
    let mut reports = Vec::new();
    ask_observed(open(BackendKind::Ollama, &server).as_mut(), true, &mut reports);
    let shown: Vec<(&str, Option<&str>, u64)> =
        reports.iter().map(|r| (r.text.as_str(), r.tool.as_deref(), r.text_chars)).collect();
    assert_eq!(shown, [("hé", None, 2), ("ll", None, 4), ("o", None, 5), ("", Some("read_file"), 5)]);
    assert_eq!(reports.last().unwrap().argument_chars, json!({"path": "a.rs"}).to_string().chars().count() as u64);
}

#[test]
fn a_whole_reply_shows_no_progress() {
    let server = FakeLlm::start(vec![Reply::turn(Turn::text("whole"))]);
    let mut config = config(BackendKind::OpenAi, &server);
    config.stream = false;
    let mut reports = Vec::new();
    ask_observed(config.open().unwrap().as_mut(), true, &mut reports);
    assert!(reports.is_empty(), "{reports:?}");
}

/// An observer of a step: its events, and progress reports between them.
#[derive(Default)]
struct Watcher {
    log: Vec<String>,
}

impl Observer for Watcher {
    fn event(&mut self, event: &Event) {
        if let Event::ModelCall { number, .. } = event {
            self.log.push(format!("call {number}"));
        }
    }

    fn progress(&mut self, progress: &Progress<'_>) {
        self.log.push(format!("{} {}", progress.pieces, progress.tool.unwrap_or("-")));
    }
}

#[test]
fn a_step_shows_its_observer_each_reply_as_it_streams_and_records_none_of_it() {
    let script = || {
        vec![
            Reply::turn(Turn::call("write_file", json!({"path": "a.rs", "content": "a"})).with_content("ok"))
                .in_pieces(2),
            Reply::turn(Turn::call("finish", json!({}))).in_pieces(50),
        ]
    };
    let run = |observer: &mut dyn Observer| {
        let server = FakeLlm::start(script());
        let dir = tempfile::tempdir().unwrap();
        let mut sandbox = Sandbox::builder(dir.path()).build().unwrap();
        let step = Step::new("m", "Write a.rs.");
        step.run_with(open(BackendKind::OpenAi, &server).as_mut(), &mut sandbox, None, observer).unwrap().transcript
    };
    let mut watcher = Watcher::default();
    let watched = run(&mut watcher);
    // Text "ok" (1 piece), the call's first fragment, `{"content":"a","path":"a.rs"}` in 15 pieces.
    let first: Vec<String> = (1..=17).map(|n| format!("{n} {}", if n == 1 { "-" } else { "write_file" })).collect();
    let mut expected = first;
    expected.push("call 1".into());
    expected.extend(["1 finish".to_string(), "2 finish".to_string(), "call 2".to_string()]);
    assert_eq!(watcher.log, expected);

    let mut events_only = |_: &Event| {};
    let unwatched = run(&mut events_only);
    assert_eq!(watched.to_jsonl(Volatility::Omit), unwatched.to_jsonl(Volatility::Omit));
}

/// Limits are the user's to choose: one too long to add to the clock means "no limit".
#[test]
fn limits_too_long_for_the_clock_mean_no_limit() {
    let server = FakeLlm::start(vec![Reply::turn(Turn::text("fine")).every(Duration::from_millis(10))]);
    let mut config = config(BackendKind::Ollama, &server);
    config.http.first_byte_timeout = Duration::MAX;
    config.http.idle_timeout = Duration::MAX;
    config.http.request_timeout = Duration::MAX;
    assert_eq!(ask(config.open().unwrap().as_mut(), true).unwrap().message.content, "fine");
}
