//! Constrained decoding against the fake server, identified as each real server: the request
//! fields per backend and protocol, the per-turn narrowing, the fallback when a server refuses
//! the constraint, and what the transcript records.

use codegen_core::backend::{Backend, BackendKind};
use codegen_core::constrain::ConstraintKind;
use codegen_core::sandbox::Sandbox;
use codegen_core::transcript::{Event, Replies};
use codegen_core::{Constrain, Step, StepOutput, ToolProtocol};
use promptgen_tests::{FakeCall, FakeLlm, Identity, Reply, Turn};
use serde_json::{Value, json};

use crate::support::fake_server_config;

fn backend(kind: BackendKind, server: &FakeLlm, max_output_tokens: u32) -> Box<dyn Backend> {
    let mut config = fake_server_config(kind, server);
    config.max_output_tokens = max_output_tokens;
    config.open().unwrap()
}

/// Runs a step that must write `a.rs`, in `protocol`, against `server` seen as `identity`.
fn run(
    kind: BackendKind,
    server: &FakeLlm,
    identity: Identity,
    protocol: ToolProtocol,
) -> (StepOutput, tempfile::TempDir) {
    server.identify_as(identity);
    let dir = tempfile::tempdir().unwrap();
    let mut sandbox = Sandbox::builder(dir.path().join("out")).build().unwrap();
    let mut backend = backend(kind, server, 256);
    let output = Step::new("m", "Write a.rs.")
        .protocol(protocol)
        .expect_output("a.rs")
        .run(backend.as_mut(), &mut sandbox)
        .unwrap();
    (output, dir)
}

fn json_call(tool: &str, arguments: Value) -> Reply {
    Reply::turn(Turn::text(&json!({"tool": tool, "arguments": arguments}).to_string()))
}

fn json_turns() -> Vec<Reply> {
    vec![
        json_call("write_file", json!({"path": "a.rs", "content": "fn a() {}\n"})),
        json_call("finish", json!({"summary": "Wrote a.rs."})),
    ]
}

fn blocks_turns() -> Vec<Reply> {
    vec![
        Reply::turn(Turn::text("@@@write_begin(a.rs)\nfn a() {}\n@@@write_end")),
        Reply::turn(Turn::text("@@@done(Wrote a.rs.)")),
    ]
}

/// The tools a schema's branches name, in order.
fn schema_tools(schema: &Value) -> Vec<String> {
    schema["anyOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["properties"]["tool"]["const"].as_str().unwrap().to_owned())
        .collect()
}

fn constrained_events(output: &StepOutput) -> Vec<(ToolProtocol, ConstraintKind, String)> {
    output
        .transcript
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Constrained { protocol, by, server } => Some((*protocol, *by, server.clone())),
            _ => None,
        })
        .collect()
}

fn digests(output: &StepOutput) -> Vec<Option<String>> {
    output
        .transcript
        .events
        .iter()
        .filter_map(|e| match e {
            Event::ModelCall { constraint, .. } => Some(constraint.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_server_without_a_grammar_gets_a_json_schema_that_admits_finish_only_once_the_output_exists() {
    // Ollama's `/v1` takes a schema in `response_format`, and no grammar.
    let server = FakeLlm::start(json_turns());
    let (output, _dir) = run(BackendKind::OpenAi, &server, Identity::Ollama("0.6.2".into()), ToolProtocol::Json);
    assert_eq!(output.written, ["a.rs"]);
    let requests = server.requests();
    let first = requests[0].json();
    assert_eq!(first["response_format"]["type"], "json_schema");
    let schema = &first["response_format"]["json_schema"]["schema"];
    assert_eq!(schema_tools(schema), ["write_file"], "nothing to read or list yet, finish not yet: {schema}");
    assert_eq!(schema["anyOf"][0]["properties"]["arguments"]["properties"]["path"]["enum"], json!(["a.rs"]));
    // The content fits in the reply: 256 tokens less the call around it.
    assert_eq!(schema["anyOf"][0]["properties"]["arguments"]["properties"]["content"]["maxLength"], 208);
    assert!(first.get("grammar").is_none() && first.get("tools").is_none());
    let second = &requests[1].json()["response_format"]["json_schema"]["schema"];
    // a.rs is written and nothing checks it: finishing is the one call that moves the step on.
    assert_eq!(schema_tools(second), ["finish"]);
    assert_eq!(second["anyOf"][0]["properties"]["arguments"]["properties"]["summary"]["maxLength"], 208);
    // The transcript says how, and which constraint each call carried.
    assert_eq!(
        constrained_events(&output),
        [(ToolProtocol::Json, ConstraintKind::JsonSchema, "Ollama (/v1)".to_owned())]
    );
    let digests = digests(&output);
    assert_eq!(digests.len(), 2);
    assert!(digests.iter().all(Option::is_some) && digests[0] != digests[1], "{digests:?}");
    assert!(output.notes.is_empty(), "{:?}", output.notes);
    assert_eq!(server.discovery().iter().map(|r| r.path.as_str()).collect::<Vec<_>>(), ["/v1/models"]);
}

#[test]
fn llama_cpp_servers_get_a_grammar_for_json_that_leaves_the_model_no_whitespace_and_one_for_blocks() {
    for identity in [Identity::LlamaServer, Identity::LlamaCppPython] {
        let server = FakeLlm::start(json_turns());
        let (output, dir) = run(BackendKind::OpenAi, &server, identity.clone(), ToolProtocol::Json);
        assert_eq!(std::fs::read_to_string(dir.path().join("out/a.rs")).unwrap(), "fn a() {}\n");
        let requests = server.requests();
        let first = requests[0].json();
        let grammar = first["grammar"].as_str().unwrap_or_else(|| panic!("{identity:?}: {first}"));
        assert!(grammar.starts_with("root ::= call-write-file\n"), "{identity:?}: {grammar}");
        assert!(
            grammar
                .contains(r#"call-write-file ::= "{\"tool\": \"write_file\", \"arguments\": {" "\"path\": " writable"#),
            "{grammar}"
        );
        assert!(grammar.contains("writable ::= \"\\\"a.rs\\\"\"\n"), "{grammar}");
        assert!(requests[1].json()["grammar"].as_str().unwrap().starts_with("root ::= call-finish\n"));
        assert!(first.get("response_format").is_none());
        assert_eq!(constrained_events(&output)[0].1, ConstraintKind::Grammar);
    }

    for identity in [Identity::LlamaServer, Identity::LlamaCppPython] {
        let server = FakeLlm::start(blocks_turns());
        let (output, dir) = run(BackendKind::OpenAi, &server, identity.clone(), ToolProtocol::Blocks);
        assert_eq!(std::fs::read_to_string(dir.path().join("out/a.rs")).unwrap(), "fn a() {}\n");
        let requests = server.requests();
        let first = requests[0].json();
        let grammar = first["grammar"].as_str().unwrap();
        assert!(grammar.starts_with("root ::= write\n"), "{identity:?}: {grammar}");
        assert!(grammar.contains("writable ::= \"a.rs\"") && grammar.contains("content ::= piece{0,208}"), "{grammar}");
        assert!(requests[1].json()["grammar"].as_str().unwrap().starts_with("root ::= done\n"));
        assert!(first.get("response_format").is_none());
        assert_eq!(constrained_events(&output)[0].1, ConstraintKind::Grammar);
    }
}

#[test]
fn where_native_calls_cannot_be_required_the_step_is_carried_in_json_and_says_so() {
    let server = FakeLlm::start(json_turns());
    let (output, _dir) = run(BackendKind::OpenAi, &server, Identity::LlamaServer, ToolProtocol::Native);
    assert_eq!(output.protocol, ToolProtocol::Json);
    assert_eq!(output.written, ["a.rs"]);
    let first = server.requests()[0].json();
    assert!(first.get("tools").is_none() && first["grammar"].as_str().is_some(), "{first}");
    assert!(first["messages"][0]["content"].as_str().unwrap().contains("JSON object"), "the json protocol's prompt");
    assert_eq!(output.notes.len(), 1, "{:?}", output.notes);
    assert!(output.notes[0].contains("llama-server cannot be made to call a tool natively"), "{}", output.notes[0]);
    assert!(output.notes[0].contains("under a GBNF grammar"), "{}", output.notes[0]);
    assert!(output.notes[0].contains("constrain = \"off\""), "{}", output.notes[0]);
}

#[test]
fn vllm_requires_a_native_tool_call_from_tools_narrowed_to_what_can_run() {
    let server = FakeLlm::start(vec![
        Reply::turn(Turn::call("write_file", json!({"path": "a.rs", "content": "fn a() {}\n"}))),
        Reply::turn(Turn::call("finish", json!({"summary": "Wrote a.rs."}))),
    ]);
    let (output, _dir) = run(BackendKind::OpenAi, &server, Identity::Vllm, ToolProtocol::Native);
    assert_eq!(output.protocol, ToolProtocol::Native);
    let requests = server.requests();
    let names = |request: &Value| -> Vec<String> {
        request["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let first = requests[0].json();
    assert_eq!(first["tool_choice"], "required");
    assert_eq!(names(&first), ["write_file"]);
    assert_eq!(first["tools"][0]["function"]["parameters"]["properties"]["path"]["enum"], json!(["a.rs"]));
    assert_eq!(names(&requests[1].json()), ["finish"]);
    assert_eq!(constrained_events(&output)[0].1, ConstraintKind::ToolCall);

    // Its grammar field for blocks is `structured_outputs`.
    let server = FakeLlm::start(blocks_turns());
    run(BackendKind::OpenAi, &server, Identity::Vllm, ToolProtocol::Blocks);
    let first = server.requests()[0].json();
    assert!(first["structured_outputs"]["grammar"].as_str().unwrap().starts_with("root ::= write"), "{first}");
    assert!(first.get("grammar").is_none());
}

#[test]
fn ollama_takes_the_schema_as_format_from_0_5_on_and_an_older_one_is_told_apart() {
    let server = FakeLlm::start(json_turns());
    let (output, _dir) = run(BackendKind::Ollama, &server, Identity::Ollama("0.6.2".into()), ToolProtocol::Native);
    assert_eq!(output.protocol, ToolProtocol::Json);
    let first = server.requests()[0].json();
    assert_eq!(schema_tools(&first["format"]), ["write_file"]);
    assert!(first.get("tools").is_none());
    assert_eq!(
        constrained_events(&output),
        [(ToolProtocol::Json, ConstraintKind::JsonSchema, "Ollama 0.6.2".to_owned())]
    );

    let server = FakeLlm::start(json_turns());
    let (output, _dir) = run(BackendKind::Ollama, &server, Identity::Ollama("0.4.7".into()), ToolProtocol::Json);
    assert!(server.requests()[0].json().get("format").is_none());
    assert!(output.notes.iter().any(|n| n.contains("0.4.7") && n.contains("0.5.0")), "{:?}", output.notes);
}

#[test]
fn a_server_that_says_nothing_or_a_step_that_is_off_sends_no_constraint() {
    let server = FakeLlm::start(json_turns());
    let (output, _dir) = run(BackendKind::OpenAi, &server, Identity::Anonymous, ToolProtocol::Json);
    let first = server.requests()[0].json();
    assert!(first.get("response_format").is_none() && first.get("grammar").is_none(), "{first}");
    assert!(output.notes.is_empty() && constrained_events(&output).is_empty());
    assert!(digests(&output).iter().all(Option::is_none));

    let server = FakeLlm::start(json_turns());
    server.identify_as(Identity::LlamaServer);
    let dir = tempfile::tempdir().unwrap();
    let mut sandbox = Sandbox::builder(dir.path()).build().unwrap();
    let mut backend = backend(BackendKind::OpenAi, &server, 256);
    Step::new("m", "Write a.rs.")
        .protocol(ToolProtocol::Json)
        .constrain(Constrain::Off)
        .expect_output("a.rs")
        .run(backend.as_mut(), &mut sandbox)
        .unwrap();
    assert!(server.discovery().is_empty(), "off asks the server nothing");
    assert!(server.requests()[0].json().get("response_format").is_none());
}

#[test]
fn a_server_that_refuses_the_constraint_is_asked_again_without_it_once() {
    let mut script = vec![Reply::openai_error(400, "failed to parse grammar", "invalid_request_error", None)];
    script.extend(json_turns());
    let server = FakeLlm::start(script);
    let (output, _dir) = run(BackendKind::OpenAi, &server, Identity::LlamaServer, ToolProtocol::Json);
    assert_eq!(output.written, ["a.rs"]);
    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    assert!(requests[0].json().get("grammar").is_some());
    assert!(requests[1..].iter().all(|r| r.json().get("grammar").is_none()), "no constraint after the refusal");
    assert!(
        output.notes.iter().any(|n| n.contains("HTTP 400") && n.contains("failed to parse grammar")),
        "{:?}",
        output.notes
    );
    let refusals: Vec<&String> = output
        .transcript
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Unconstrained { reason } => Some(reason),
            _ => None,
        })
        .collect();
    assert_eq!(refusals.len(), 1);
    assert!(refusals[0].starts_with("HTTP 400"), "{}", refusals[0]);
    assert_eq!(output.transcript.totals().model_calls, 2, "the refused request generated nothing");

    // An error that says something else (a model the server does not serve) is not taken for a
    // refusal of the constraint.
    let server = FakeLlm::start(vec![Reply::openai_error(404, "model m not found", "not_found_error", None)]);
    server.identify_as(Identity::LlamaServer);
    let dir = tempfile::tempdir().unwrap();
    let mut sandbox = Sandbox::builder(dir.path()).build().unwrap();
    let mut backend = backend(BackendKind::OpenAi, &server, 256);
    let failure =
        Step::new("m", "Write a.rs.").protocol(ToolProtocol::Json).run(backend.as_mut(), &mut sandbox).unwrap_err();
    assert_eq!(server.requests().len(), 1, "{}", failure.error);
}

#[test]
fn native_arguments_go_back_exactly_as_the_server_sent_them() {
    // Spacing and key order a re-serialisation would change.
    let sent = r#"{"path": "a.rs",   "content": "fn a() {}\n"}"#;
    let server = FakeLlm::start(vec![
        Reply::turn(Turn::calls(vec![
            FakeCall::new("write_file", json!({"path": "a.rs", "content": "fn a() {}\n"}))
                .id("call_1")
                .shape(promptgen_tests::ArgsShape::RawString(sent.to_owned())),
        ])),
        Reply::turn(Turn::call("finish", json!({"summary": "Wrote a.rs."}))),
    ]);
    let (output, _dir) = run(BackendKind::OpenAi, &server, Identity::Anonymous, ToolProtocol::Native);
    assert_eq!(output.written, ["a.rs"]);
    let second = server.requests()[1].json();
    let echoed = second["messages"].as_array().unwrap().iter().find(|m| m["role"] == "assistant").unwrap();
    assert_eq!(echoed["tool_calls"][0]["function"]["arguments"], sent);
}

#[test]
fn what_the_server_read_of_the_prompt_and_took_from_its_cache_is_recorded() {
    let reply = |content: &str, prompt_n: u64, cache_n: u64| {
        Reply::json(json!({
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_n + cache_n, "completion_tokens": 5},
            "timings": {"prompt_n": prompt_n, "cache_n": cache_n}
        }))
    };
    let write = json!({"tool": "write_file", "arguments": {"path": "a.rs", "content": "fn a() {}\n"}}).to_string();
    let finish = json!({"tool": "finish", "arguments": {"summary": "done"}}).to_string();
    let server = FakeLlm::start(vec![reply(&write, 300, 0), reply(&finish, 40, 310)]);
    let (output, _dir) = run(BackendKind::OpenAi, &server, Identity::LlamaServer, ToolProtocol::Json);
    let caches: Vec<_> = output
        .transcript
        .events
        .iter()
        .filter_map(|e| match e {
            Event::ModelCall { volatile: Some(v), .. } => v.prompt_cache.map(|c| (c.read, c.reused)),
            _ => None,
        })
        .collect();
    assert_eq!(caches, [(300, Some(0)), (40, Some(310))]);
}

#[test]
fn replies_are_counted_runnable_only_when_they_are_one_call_that_could_run() {
    let server = FakeLlm::start(vec![
        Reply::turn(Turn::text("Sure! Here is the file you asked for.")),
        json_call("finish", json!({"summary": "too early"})),
        json_call("write_file", json!({"path": "../a.rs", "content": "x"})),
        json_call("write_file", json!({"path": "a.rs", "content": "fn a() {}\n"})),
        json_call("finish", json!({"summary": "Wrote a.rs."})),
    ]);
    let (output, _dir) = run(BackendKind::OpenAi, &server, Identity::Anonymous, ToolProtocol::Json);
    // Prose, a finish while a.rs is missing, and a path outside the sandbox are not runnable.
    assert_eq!(output.transcript.replies(), Replies { sent: 5, runnable: 2 });

    let server = FakeLlm::start(json_turns());
    let (output, _dir) = run(BackendKind::OpenAi, &server, Identity::LlamaServer, ToolProtocol::Json);
    assert_eq!(output.transcript.replies(), Replies { sent: 2, runnable: 2 });
}

#[test]
fn a_first_prompt_that_leaves_no_room_for_the_reply_is_refused_before_it_is_sent() {
    let server = FakeLlm::start(json_turns());
    server.identify_as(Identity::LlamaServer);
    let dir = tempfile::tempdir().unwrap();
    let mut sandbox = Sandbox::builder(dir.path()).build().unwrap();
    // A prompt that fits the context alone, but not with 256 tokens for the reply.
    let prompt = "word ".repeat(promptgen_tests::LLAMA_SERVER_CONTEXT as usize - 400);
    let mut backend = backend(BackendKind::OpenAi, &server, 256);
    let failure = Step::new("m", prompt).protocol(ToolProtocol::Json).run(backend.as_mut(), &mut sandbox).unwrap_err();
    match failure.error {
        codegen_core::Error::PromptTooLarge { prompt_tokens, context: 8192, max_output_tokens: 256 } => {
            assert!(prompt_tokens > 7792 && prompt_tokens < 8192, "it fits alone, not with the reply: {prompt_tokens}");
        }
        other => panic!("{other}"),
    }
    assert!(server.requests().is_empty(), "nothing was sent to the model");
    assert!(failure.to_string().contains("--ctx-size"));
    // A prompt that fits is sent.
    let server = FakeLlm::start(json_turns());
    let (output, _dir) = run(BackendKind::OpenAi, &server, Identity::LlamaServer, ToolProtocol::Json);
    assert_eq!(output.written, ["a.rs"]);
    assert!(server.discovery().iter().any(|r| r.path == "/tokenize"));
}
