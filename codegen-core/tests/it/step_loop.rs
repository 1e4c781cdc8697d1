//! The loop, end to end through the real HTTP backends and the fake LLM server: protocols,
//! fallbacks, repairs, budget, and the transcript.

use std::path::Path;
use std::time::Duration;

use codegen_core::backend::{Backend, BackendConfig, BackendKind};
use codegen_core::chat::Role;
use codegen_core::sandbox::Sandbox;
use codegen_core::transcript::{CallSource, EndOutcome, Event, Volatility};
use codegen_core::{Error, Step, StepFailure, StepOutput, ToolProtocol};
use promptgen_tests::{ArgsShape, FakeCall, FakeLlm, Reply, Turn};
use serde_json::{Value, json};

use crate::support::fake_server_config;

fn backend(kind: BackendKind, server: &FakeLlm) -> Box<dyn Backend> {
    fake_server_config(kind, server).open().unwrap()
}

struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        Setup { dir: tempfile::tempdir().unwrap() }
    }

    fn out(&self) -> std::path::PathBuf {
        self.dir.path().join("out")
    }

    fn sandbox(&self) -> Sandbox {
        Sandbox::builder(self.out()).build().unwrap()
    }

    fn read(&self, path: &str) -> String {
        std::fs::read_to_string(self.out().join(path)).unwrap()
    }
}

fn run(kind: BackendKind, server: &FakeLlm, setup: &Setup, step: &Step) -> Result<StepOutput, StepFailure> {
    let mut backend = backend(kind, server);
    step.run(backend.as_mut(), &mut setup.sandbox())
}

fn write(path: &str, content: &str) -> Turn {
    Turn::call("write_file", json!({"path": path, "content": content}))
}

fn finish() -> Turn {
    Turn::call("finish", json!({"summary": "Wrote it."}))
}

/// The text of the tool result or user turn sent back after model call `n` (1-based):
/// everything the loop added to the history between reply `n` and request `n + 1`.
fn sent_after(server: &FakeLlm, n: usize) -> Vec<Value> {
    let requests = server.requests();
    let before = requests[n - 1].json()["messages"].as_array().unwrap().len();
    let after = requests[n].json()["messages"].as_array().unwrap().clone();
    after[before + 1..].to_vec()
}

#[test]
fn ollama_native_step_reads_writes_and_finishes() {
    let setup = Setup::new();
    let server = FakeLlm::start(vec![
        Reply::turn(Turn::call("list_files", json!({})).tokens(100, 10)),
        Reply::turn(write("view.rs", "pub trait View {}\n").tokens(120, 30)),
        Reply::turn(finish().tokens(150, 8)),
    ]);
    let mut step = Step::new("qwen2.5-coder:7b", "Write view.rs.");
    step.seed(123).temperature(0.0).expect_output("view.rs");
    let output = run(BackendKind::Ollama, &server, &setup, &step).unwrap();

    assert_eq!(output.end, EndOutcome::Finished);
    assert_eq!(output.summary.as_deref(), Some("Wrote it."));
    assert_eq!(output.written, ["view.rs"]);
    assert_eq!(output.protocol, ToolProtocol::Native);
    assert_eq!(setup.read("view.rs"), "pub trait View {}\n");

    let totals = output.transcript.totals();
    assert_eq!((totals.model_calls, totals.prompt_tokens, totals.completion_tokens, totals.repairs), (3, 370, 48, 0));

    // Each request carries the whole history; tool results go back with the tool's name.
    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    let first = requests[0].json();
    assert_eq!(first["options"]["seed"], 123);
    assert_eq!(first["messages"][0]["role"], "system");
    assert!(first["messages"][0]["content"].as_str().unwrap().contains("view.rs"), "declared outputs are named");
    assert_eq!(first["messages"][1], json!({"role": "user", "content": "Write view.rs."}));
    let results = sent_after(&server, 1);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["role"], "tool");
    assert_eq!(results[0]["tool_name"], "list_files");
    assert_eq!(results[0]["content"], "(no files yet)");
    let results = sent_after(&server, 2);
    assert_eq!(results[0]["content"], "view.rs: written, 18 bytes.");
    assert_eq!(requests[1].json()["messages"][2]["tool_calls"][0]["function"]["arguments"], json!({}));
}

#[test]
fn openai_native_step_answers_every_call_id() {
    let setup = Setup::new();
    let server = FakeLlm::start(vec![
        Reply::turn(Turn::calls(vec![
            FakeCall::new("write_file", json!({"path": "a.rs", "content": "a"})).id("call_a"),
            FakeCall::new("write_file", json!({"path": "b.rs", "content": "b"})).id("call_b"),
        ])),
        Reply::turn(finish()),
    ]);
    let output = run(BackendKind::OpenAi, &server, &setup, &Step::new("gpt", "Write a.rs and b.rs.")).unwrap();
    assert_eq!(output.written, ["a.rs", "b.rs"]);
    let results = sent_after(&server, 1);
    let ids: Vec<&str> = results.iter().map(|m| m["tool_call_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["call_a", "call_b"]);
    assert!(results.iter().all(|m| m["role"] == "tool"));
}

#[test]
fn tool_calls_written_as_text_are_run_in_the_native_protocol() {
    let call = json!({"name": "write_file", "arguments": {"path": "q.rs", "content": "fn q() {}\n"}});
    let shapes = [
        call.to_string(),
        format!("Here you go:\n```json\n{call:#}\n```"),
        format!("<tool_call>\n{call}\n</tool_call>"),
        json!({"name": "write_file", "parameters": {"path": "q.rs", "content": "fn q() {}\n"}}).to_string(),
    ];
    for content in shapes {
        let setup = Setup::new();
        let server = FakeLlm::start(vec![Reply::turn(Turn::text(&content)), Reply::turn(finish())]);
        let output = run(BackendKind::Ollama, &server, &setup, &Step::new("qwen2.5-coder:7b", "Write q.rs.")).unwrap();
        assert_eq!(setup.read("q.rs"), "fn q() {}\n", "content: {content}");
        assert!(
            output
                .transcript
                .events
                .iter()
                .any(|e| matches!(e, Event::ToolRun { via: CallSource::Text, ok: true, .. }))
        );
        // A call made in text is answered in text: a tool-role message would answer no call id.
        let answer = sent_after(&server, 1);
        assert_eq!(answer.len(), 1);
        assert_eq!(answer[0]["role"], "user");
        assert!(answer[0]["content"].as_str().unwrap().contains("q.rs: written"), "{answer:?}");
    }
}

#[test]
fn a_model_without_tool_support_falls_back_to_the_json_protocol_and_says_so() {
    let setup = Setup::new();
    let server = FakeLlm::start(vec![
        Reply::error(400, "registry.ollama.ai/library/gemma:2b does not support tools"),
        Reply::turn(Turn::text(
            &json!({"tool": "write_file", "arguments": {"path": "g.rs", "content": "g"}}).to_string(),
        )),
        Reply::turn(Turn::text(r#"{"tool": "finish", "arguments": {"summary": "done"}}"#)),
    ]);
    let mut step = Step::new("gemma:2b", "Write g.rs.");
    step.max_model_calls(2);
    let output = run(BackendKind::Ollama, &server, &setup, &step).unwrap();
    assert_eq!(output.protocol, ToolProtocol::Json);
    assert_eq!(setup.read("g.rs"), "g");
    assert!(output.notes.iter().any(|n| n.contains("fell back to the `json` protocol")), "{:?}", output.notes);
    assert!(
        output
            .transcript
            .events
            .iter()
            .any(|e| matches!(e, Event::Fallback { from: ToolProtocol::Native, to: ToolProtocol::Json, .. }))
    );
    assert_eq!(output.transcript.totals().model_calls, 2, "the rejected request is not a model call");

    let requests = server.requests();
    assert!(requests[0].json().get("tools").is_some());
    let second = requests[1].json();
    assert!(second.get("tools").is_none(), "no tools field after the fallback");
    assert!(
        second["messages"][0]["content"].as_str().unwrap().contains("\"tool\""),
        "the system prompt now describes the JSON answer format"
    );
}

#[test]
fn blocks_protocol_writes_code_without_json_escaping() {
    let setup = Setup::new();
    let reply = "I'll write it.\n@@@write_begin(src/lib.rs)\npub fn quote() -> &'static str { \"\\\"hi\\\"\" }\n@@@write_end\n@@@done(wrote lib.rs)";
    let server = FakeLlm::start(vec![Reply::turn(Turn::text(reply))]);
    let mut step = Step::new("tiny", "Write src/lib.rs.");
    step.protocol(ToolProtocol::Blocks).expect_output("src/lib.rs");
    let output = run(BackendKind::OpenAi, &server, &setup, &step).unwrap();
    assert_eq!(output.end, EndOutcome::Finished);
    assert_eq!(setup.read("src/lib.rs"), "pub fn quote() -> &'static str { \"\\\"hi\\\"\" }\n");
    let request = server.requests()[0].json();
    assert!(request.get("tools").is_none());
    assert!(request["messages"][0]["content"].as_str().unwrap().contains("@@@write_begin"));
}

#[test]
fn every_broken_call_is_repaired_recorded_and_counted() {
    let setup = Setup::new();
    let server = FakeLlm::start(vec![
        Reply::turn(Turn::calls(vec![
            FakeCall::new("write_file", json!(null)).shape(ArgsShape::RawString("{\"path\": ".into())),
        ])),
        Reply::turn(Turn::call("delete_file", json!({"path": "x"}))),
        Reply::turn(Turn::call("write_file", json!({"path": "v.rs"}))),
        Reply::turn(write("../escape.rs", "x")),
        Reply::turn(finish()),
        Reply::turn(write("v.rs", "ok")),
        Reply::turn(finish()),
    ]);
    let mut step = Step::new("m", "Write v.rs.");
    step.max_model_calls(7).expect_output("v.rs");
    let output = run(BackendKind::OpenAi, &server, &setup, &step).unwrap();
    assert_eq!(output.end, EndOutcome::Finished);
    assert_eq!(setup.read("v.rs"), "ok");
    assert!(!setup.dir.path().join("escape.rs").exists(), "nothing written outside the output root");

    let repairs: Vec<&str> = output.transcript.repairs().collect();
    assert_eq!(repairs.len(), 5, "{repairs:#?}");
    assert!(repairs[0].contains("could not be read") && repairs[0].contains("not valid JSON"), "{}", repairs[0]);
    assert!(
        repairs[1].contains("no tool `delete_file`")
            && repairs[1].contains("read_file, write_file, edit_file, list_files, finish"),
        "{}",
        repairs[1]
    );
    assert!(repairs[2].contains("needs the argument `content`"), "{}", repairs[2]);
    assert!(repairs[3].contains("../escape.rs"), "{}", repairs[3]);
    assert!(repairs[4].contains("`finish` refused") && repairs[4].contains("v.rs"), "{}", repairs[4]);
    assert_eq!(output.transcript.totals().repairs, 5);
    assert_eq!(output.transcript.totals().model_calls, 7, "repairs count against max_model_calls");

    // The model is told each problem in the tool result of the offending call.
    assert_eq!(sent_after(&server, 2)[0]["content"].as_str().unwrap(), repairs[1]);
}

#[test]
fn the_budget_ends_a_step_that_never_finishes_and_names_it() {
    let setup = Setup::new();
    let server = FakeLlm::start(vec![Reply::turn(Turn::call("list_files", json!({}))); 10]);
    let mut step = Step::new("m", "Write v.rs.");
    step.max_model_calls(3).expect_output("v.rs");
    let failure = run(BackendKind::Ollama, &server, &setup, &step).unwrap_err();
    assert_eq!(server.requests().len(), 3);
    match &failure.error {
        Error::BudgetExhausted { max_model_calls: 3, missing_outputs, .. } => assert_eq!(missing_outputs, &["v.rs"]),
        other => panic!("{other:?}"),
    }
    let text = failure.to_string();
    assert!(text.contains("all 3 model calls") && text.contains("max_model_calls") && text.contains("v.rs"), "{text}");
    assert_eq!(failure.transcript.totals().model_calls, 3);
    assert!(matches!(failure.transcript.events.last(), Some(Event::End { outcome: EndOutcome::Failed, .. })));
}

#[test]
fn a_reply_without_a_tool_call_ends_the_step_and_is_kept() {
    let setup = Setup::new();
    let server = FakeLlm::start(vec![Reply::turn(Turn::text("I cannot do that without more detail."))]);
    let output = run(BackendKind::Ollama, &server, &setup, &Step::new("m", "Do something.")).unwrap();
    assert_eq!(output.end, EndOutcome::NoToolCall);
    let last = output.transcript.messages().last().unwrap();
    assert_eq!((last.role, last.content.as_str()), (Role::Assistant, "I cannot do that without more detail."));
}

#[test]
fn a_reply_without_a_tool_call_while_outputs_are_missing_is_repaired() {
    let setup = Setup::new();
    let server = FakeLlm::start(vec![
        Reply::turn(Turn::text("Sure, here is the plan.")),
        Reply::turn(write("v.rs", "v")),
        Reply::turn(finish()),
    ]);
    let mut step = Step::new("m", "Write v.rs.");
    step.expect_output("v.rs");
    let output = run(BackendKind::Ollama, &server, &setup, &step).unwrap();
    assert_eq!(output.end, EndOutcome::Finished);
    let nudge = sent_after(&server, 1);
    assert_eq!(nudge[0]["role"], "user");
    assert!(nudge[0]["content"].as_str().unwrap().contains("v.rs still missing"), "{nudge:?}");
}

#[test]
fn calls_after_finish_are_not_run() {
    let setup = Setup::new();
    let server = FakeLlm::start(vec![Reply::turn(Turn::calls(vec![
        FakeCall::new("write_file", json!({"path": "a.rs", "content": "a"})),
        FakeCall::new("finish", json!({"summary": "done"})),
        FakeCall::new("write_file", json!({"path": "late.rs", "content": "late"})),
    ]))]);
    let output = run(BackendKind::Ollama, &server, &setup, &Step::new("m", "Write a.rs.")).unwrap();
    assert_eq!(output.written, ["a.rs"]);
    assert!(!setup.out().join("late.rs").exists());
}

#[test]
fn a_server_failing_mid_step_fails_it_with_the_transcript_so_far() {
    let setup = Setup::new();
    let server = FakeLlm::start(vec![Reply::turn(write("a.rs", "a")), Reply::error(500, "model crashed")]);
    let failure = run(BackendKind::Ollama, &server, &setup, &Step::new("m", "Write a.rs.")).unwrap_err();
    assert!(matches!(failure.error, Error::Backend(_)), "{:?}", failure.error);
    assert!(failure.to_string().contains("model crashed"), "{failure}");
    assert_eq!(failure.transcript.totals().model_calls, 1);
}

#[test]
fn committed_transcripts_do_not_churn_between_identical_runs() {
    let script = || {
        vec![
            Reply::turn(write("a.rs", "a").tokens(10, 2)),
            Reply::error(503, "busy"),
            Reply::turn(finish().tokens(12, 1)),
        ]
    };
    let transcripts: Vec<_> = (0..2)
        .map(|_| {
            let setup = Setup::new();
            let server = FakeLlm::start(script());
            let mut backend = {
                let mut config = BackendConfig::new(BackendKind::Ollama);
                config.base_url = Some(server.url());
                config.http.retry.initial_backoff = Duration::from_millis(1);
                config.open().unwrap()
            };
            Step::new("m", "Write a.rs.").run(backend.as_mut(), &mut setup.sandbox()).unwrap().transcript
        })
        .collect();
    let stable = transcripts[0].to_jsonl(Volatility::Omit);
    assert_eq!(stable, transcripts[1].to_jsonl(Volatility::Omit));
    assert!(!stable.contains("volatile") && !stable.contains("127.0.0.1"), "{stable}");
    let full = transcripts[0].to_jsonl(Volatility::Keep);
    assert!(full.contains("\"duration_ms\"") && full.contains("\"wall_ms\"") && full.contains("HTTP 503"), "{full}");
    for line in full.lines() {
        serde_json::from_str::<Value>(line).unwrap();
    }
}

#[test]
fn the_one_call_shortcut_writes_under_the_output_root() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gen");
    let server = FakeLlm::start(vec![Reply::turn(write("x.rs", "x")), Reply::turn(finish())]);
    let mut backend = backend(BackendKind::Ollama, &server);
    let output = codegen_core::run_prompt(backend.as_mut(), "m", "Write x.rs.", &out).unwrap();
    assert_eq!(output.written, ["x.rs"]);
    assert_eq!(std::fs::read_to_string(Path::new(&out).join("x.rs")).unwrap(), "x");
}

/// A reply the server cut at its output cap (`finish_reason: "length"`) that leaves work
/// undone is answered with what happened, and the model tries again within the budget.
#[test]
fn a_reply_cut_off_at_the_output_cap_with_work_left_is_answered_with_why() {
    let cut = cut_reply("Here is the file: ```rust\nfn a(");
    let server =
        FakeLlm::start(vec![Reply::json(cut), Reply::turn(write("a.rs", "fn a() {}\n")), Reply::turn(finish())]);
    let setup = Setup::new();
    let mut step = Step::new("m", "Write a.rs.");
    step.expect_output("a.rs");
    let output = run(BackendKind::OpenAi, &server, &setup, &step).unwrap();
    assert_eq!(output.end, EndOutcome::Finished);
    assert_eq!(setup.read("a.rs"), "fn a() {}\n");
    let second = server.requests()[1].json();
    let told = second["messages"].as_array().unwrap().last().unwrap()["content"].as_str().unwrap().to_string();
    assert!(told.contains("cut off at the server's output limit") && told.contains("a.rs"), "{told}");
}

/// A cut reply of prose alone, with nothing missing, ends the step like any reply without a
/// call: a babbling model is not kept talking until its budget runs out.
#[test]
fn a_reply_of_prose_cut_off_with_nothing_left_to_do_ends_the_step() {
    let server = FakeLlm::start(vec![Reply::json(cut_reply("Hello! Hello! Hello! Hello!"))]);
    let setup = Setup::new();
    let output = run(BackendKind::OpenAi, &server, &setup, &Step::new("m", "Say hello.")).unwrap();
    assert_eq!(output.end, EndOutcome::NoToolCall);
    assert_eq!(server.requests().len(), 1);
}

fn cut_reply(content: &str) -> Value {
    json!({
        "id": "x", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 512}
    })
}
