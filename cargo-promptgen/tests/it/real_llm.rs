//! End to end against REAL model servers: llama.cpp's `llama-server` and llama-cpp-python,
//! both serving SmolLM2-135M. `scripts/real-llm.sh` builds them, starts one, and runs these
//! tests with `--ignored` against it; then does the same with the other. Without a server they
//! are ignored (and run by hand without one, they fail loudly rather than pass).
//!
//! The model is tiny: what it writes and when it stops are not up to us. These tests assert
//! only what does not depend on the model being clever: the protocol works both ways, calls
//! are parsed and run inside the sandbox, tokens are counted, overflows and dead servers are
//! clear errors, and every outcome is either a clean result or a clear error that leaves the
//! lock alone. A server that dies while they run is reported as a death (its signal and its
//! log's tail), never as a connection error.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use codegen_core::backend::{BackendConfig, BackendError, BackendKind, ChatRequest, Progress};
use codegen_core::chat::Message;
use codegen_core::sandbox::Sandbox;
use codegen_core::transcript::{CallSource, EndOutcome, Event, Transcript, Volatility};
use codegen_core::{Constrain, Error, Observer, Step, StepFailure, StepOutput, ToolProtocol};

use crate::support;
use crate::support::{Package, run, text};

const WHY: &str = "needs a real llama.cpp server: run scripts/real-llm.sh";

/// The cap on each reply: a babbling 135M model otherwise fills the context.
const OUTPUT_CAP: u32 = 384;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: these tests {WHY}"))
}

fn server_url() -> String {
    env("PROMPTGEN_REAL_LLM_URL")
}

/// `llama-server` or `llama-cpp-python`.
fn server_kind() -> String {
    env("PROMPTGEN_REAL_LLM_SERVER")
}

/// Put at the top of every test: if the test fails and the shared server has died, says so,
/// with its signal and the end of its log (scripts/real-llm.sh watches it and writes its exit
/// status), so that a crash is not mistaken for the connection errors it causes.
struct ServerWatch;

impl Drop for ServerWatch {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(death) = server_death()
        {
            eprintln!("\n*** {death}");
        }
    }
}

/// How the shared server ended, if it has: "the server exited with signal 4 (status 132);
/// its log ends: ...".
fn server_death() -> Option<String> {
    let status = std::fs::read_to_string(std::env::var("PROMPTGEN_REAL_LLM_SERVER_STATUS").ok()?).ok()?;
    let code: i32 = status.trim().parse().ok()?;
    let how = if code > 128 { format!("signal {} (status {code})", code - 128) } else { format!("status {code}") };
    let log = std::env::var("PROMPTGEN_REAL_LLM_SERVER_LOG").ok().and_then(|p| std::fs::read_to_string(p).ok());
    let tail: Vec<&str> = log.as_deref().unwrap_or("").lines().rev().take(20).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Some(format!("the {} server exited with {how}; its log ends:\n{}", server_kind(), tail.join("\n")))
}

fn backend(url: &str) -> Box<dyn codegen_core::backend::Backend> {
    let mut config = BackendConfig::new(BackendKind::OpenAi);
    config.base_url = Some(url.to_string());
    config.max_output_tokens = OUTPUT_CAP;
    config.http.request_timeout = Duration::from_secs(300);
    config.open().unwrap()
}

/// Runs one step in `dir/out`, and checks that nothing appeared in `dir` outside it.
fn one_step(protocol: ToolProtocol, max_model_calls: u32) -> (tempfile::TempDir, Result<StepOutput, StepFailure>) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut sandbox = Sandbox::builder(&out).build().unwrap();
    let mut step = Step::new(
        "smollm2",
        // Worded the way a 135M model most often answers with a call rather than with code
        // (tried on llama-server with the tools in its template).
        "Save the text hello world to hello.txt.",
    );
    // These tests pin what the servers do with the protocols unconstrained; the constrained
    // ones below set their own.
    step.protocol(protocol).seed(1).temperature(0.0).max_model_calls(max_model_calls).constrain(Constrain::Off);
    let result = step.run(backend(&server_url()).as_mut(), &mut sandbox);
    let outside: Vec<PathBuf> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).filter(|p| *p != out).collect();
    assert!(outside.is_empty(), "files outside the output root: {outside:?}");
    (dir, result)
}

fn transcript(result: &Result<StepOutput, StepFailure>) -> &Transcript {
    match result {
        Ok(output) => &output.transcript,
        Err(failure) => &failure.transcript,
    }
}

/// Model calls, tokens, and the loop's own time (wall time less the time spent waiting for
/// the server), printed for the README's "tested against" table.
fn report(label: &str, transcript: &Transcript) {
    let totals = transcript.totals();
    let ours = totals.wall_time.saturating_sub(totals.model_time);
    println!(
        "MEASURE {} {label}: {} model calls, {} prompt + {} completion tokens, wall {:.2}s, server {:.2}s, loop {:.1}ms ({:.3}% of wall)",
        server_kind(),
        totals.model_calls,
        totals.prompt_tokens,
        totals.completion_tokens,
        totals.wall_time.as_secs_f64(),
        totals.model_time.as_secs_f64(),
        ours.as_secs_f64() * 1000.0,
        100.0 * ours.as_secs_f64() / totals.wall_time.as_secs_f64().max(1e-9),
    );
}

/// A clean result, or the one error a weak model may earn: running out of budget.
fn assert_clean(result: &Result<StepOutput, StepFailure>) {
    if let Err(failure) = result {
        if let Some(death) = server_death() {
            panic!("{death}\n(the step failed with: {failure})");
        }
        assert!(matches!(failure.error, Error::BudgetExhausted { .. }), "unexpected failure: {failure}");
        assert!(failure.to_string().contains("max_model_calls"), "{failure}");
    }
}

#[test]
#[ignore = "needs a real llama.cpp server: run scripts/real-llm.sh"]
fn a_native_step_runs_against_the_real_server_in_the_sandbox_and_counts_tokens() {
    let _watch = ServerWatch;
    let (dir, result) = one_step(ToolProtocol::Native, 6);
    let transcript = transcript(&result);
    report("native step", transcript);
    assert_clean(&result);
    let jsonl = transcript.to_jsonl(codegen_core::transcript::Volatility::Keep);
    let first_call = transcript.events.iter().find_map(|e| match e {
        Event::ModelCall { number: 1, finish_reason, usage, .. } => Some((finish_reason.clone(), *usage)),
        _ => None,
    });
    let (finish_reason, usage) = first_call.expect("one model call");
    assert!(usage.prompt_tokens.unwrap_or(0) > 0 && usage.completion_tokens.unwrap_or(0) > 0, "{usage:?}");
    if server_kind() == "llama-cpp-python" {
        // chatml-function-calling constrains the first reply with a grammar: it is a call,
        // which the loop parses and runs in the sandbox.
        let first_run = transcript.events.iter().find_map(|e| match e {
            Event::ToolRun { model_call: 1, via, tool, .. } => Some((*via, tool.clone())),
            _ => None,
        });
        assert_eq!(first_run, Some((CallSource::Native, "write_file".to_string())), "{jsonl}");
        assert_eq!(finish_reason.as_deref(), Some("tool_calls"));
    }
    // Every file a call wrote is under the output root (one_step checked nothing is outside).
    for event in &transcript.events {
        if let Event::ToolRun { tool, ok: true, arguments: codegen_core::chat::Arguments::Object(args), .. } = event
            && tool == "write_file"
        {
            let path = args.get("path").and_then(|p| p.as_str()).unwrap();
            assert!(dir.path().join("out").join(path).is_file(), "{path} is under the output root");
        }
    }
    if let Ok(output) = &result {
        assert!(matches!(output.end, EndOutcome::Finished | EndOutcome::NoToolCall));
    }
}

/// The tools reach the model: llama-server with SmolLM2's own template ignores `tools`
/// silently, so the same request is sent with and without them and the prompt must grow by
/// about the size of their schemas.
#[test]
#[ignore = "needs a real llama.cpp server: run scripts/real-llm.sh"]
fn the_tools_are_rendered_into_the_prompt_the_model_sees() {
    let _watch = ServerWatch;
    let mut backend = backend(&server_url());
    let messages = [Message::system("You work through tools."), Message::user("Say hello.")];
    let specs = codegen_core::__private::tools::specs_for(false);
    let mut ask = |tools: &[codegen_core::chat::ToolSpec]| {
        let request = ChatRequest {
            model: "smollm2",
            messages: &messages,
            tools,
            seed: Some(1),
            temperature: Some(0.0),
            constraint: None,
        };
        backend.chat(&request).unwrap_or_else(|e| panic!("{e}")).usage.prompt_tokens.unwrap_or(0)
    };
    let (without, with) = (ask(&[]), ask(&specs));
    println!("MEASURE {} prompt tokens without tools {without}, with tools {with}", server_kind());
    assert!(with >= without + 150, "the tools did not reach the model: {without} tokens without them, {with} with");
}

/// A real tool call, parsed by the server into `tool_calls`, read by our backend, and echoed
/// back with its result, which the server must accept. llama-cpp-python's grammar makes the
/// first reply a call; SmolLM2 on llama-server answers with code instead, so there the
/// assistant turn is begun with `<tool_call>` (llama-server continues a final assistant
/// message) and its tool-call parser reads what the model completes.
#[test]
#[ignore = "needs a real llama.cpp server: run scripts/real-llm.sh"]
fn a_real_tool_call_round_trips_through_the_backend() {
    let _watch = ServerWatch;
    let mut backend = backend(&server_url());
    let specs = codegen_core::__private::tools::specs_for(false);
    let mut messages = vec![
        Message::system("You work on a project through tools."),
        Message::user("Save the text hello world to hello.txt."),
    ];
    let mut sent = messages.clone();
    if server_kind() == "llama-server" {
        sent.push(Message::assistant(
            "<tool_call>\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"hello.txt\", \"content\": \"",
            Vec::new(),
        ));
    }
    let request = ChatRequest {
        model: "smollm2",
        messages: &sent,
        tools: &specs,
        seed: Some(1),
        temperature: Some(0.0),
        constraint: None,
    };
    let reply = backend.chat(&request).unwrap_or_else(|e| panic!("{e}"));
    println!(
        "MEASURE {} tool call: finish_reason {:?}, {:?}",
        server_kind(),
        reply.finish_reason,
        reply.message.tool_calls
    );
    // llama-server reports a call the output cap cut short as `length`, with the call parsed.
    let expected: &[&str] = if server_kind() == "llama-server" { &["tool_calls", "length"] } else { &["tool_calls"] };
    assert!(expected.contains(&reply.finish_reason.as_deref().unwrap_or("")), "{reply:?}");
    let call = reply.message.tool_calls.first().unwrap_or_else(|| panic!("no tool call parsed: {reply:?}")).clone();
    assert_eq!(call.name, "write_file");
    assert!(!call.id.is_empty());
    // Its arguments are an object, or text we keep as malformed for a repair: never a panic.
    if let codegen_core::chat::Arguments::Malformed { raw, .. } = &call.arguments {
        println!("MEASURE {} sent malformed arguments: {raw}", server_kind());
    }
    // The echo of the call and its result, in our wire shape, is accepted.
    messages.push(Message::assistant("", vec![call.clone()]));
    messages.push(Message::tool_result(&call, "Wrote hello.txt (11 bytes)."));
    let request = ChatRequest {
        model: "smollm2",
        messages: &messages,
        tools: &specs,
        seed: Some(1),
        temperature: Some(0.0),
        constraint: None,
    };
    let next = backend.chat(&request).unwrap_or_else(|e| panic!("the server refused our echo of its own call: {e}"));
    assert!(next.usage.prompt_tokens.unwrap_or(0) > 0, "{next:?}");
}

#[test]
#[ignore = "needs a real llama.cpp server: run scripts/real-llm.sh"]
fn the_json_and_blocks_protocols_reach_the_model_and_end_cleanly() {
    let _watch = ServerWatch;
    for protocol in [ToolProtocol::Json, ToolProtocol::Blocks] {
        let (_dir, result) = one_step(protocol, 4);
        let transcript = transcript(&result);
        report(&format!("{protocol:?} step"), transcript);
        assert_clean(&result);
        assert!(transcript.totals().model_calls >= 1);
        assert!(transcript.totals().prompt_tokens > 0, "the server counted the prompt");
    }
}

#[test]
#[ignore = "needs a real llama.cpp server: run scripts/real-llm.sh"]
fn an_unknown_model_name_is_served_by_the_default_model() {
    let _watch = ServerWatch;
    // llama-cpp-python serves its one model under any name (`LlamaProxy::__call__` falls back
    // to the default alias), so no "model not found" can be had from it: the not-found path is
    // pinned by the recorded Ollama replies and the fake server instead. What we can check is
    // that the name travels and the answer is used.
    let dir = tempfile::tempdir().unwrap();
    let mut sandbox = Sandbox::builder(dir.path()).build().unwrap();
    let mut step = Step::new("no-such-model-anywhere", "Say hello.");
    step.protocol(ToolProtocol::Json).max_model_calls(2).constrain(Constrain::Off);
    let result = step.run(backend(&server_url()).as_mut(), &mut sandbox);
    assert_clean(&result);
    assert!(transcript(&result).totals().prompt_tokens > 0);
}

/// A prompt longer than the server's context (8192 tokens) is refused by the server before it
/// generates anything; the error must say what to change, not just "HTTP 400".
#[test]
#[ignore = "needs a real llama.cpp server: run scripts/real-llm.sh"]
fn a_prompt_over_the_context_window_is_a_clear_error_naming_what_to_change() {
    let _watch = ServerWatch;
    let dir = tempfile::tempdir().unwrap();
    let mut sandbox = Sandbox::builder(dir.path()).build().unwrap();
    let long = "Here is a long input that the model must read. ".repeat(1200);
    let mut step = Step::new("smollm2", format!("{long}\nNow write hello.txt."));
    step.protocol(ToolProtocol::Json).max_model_calls(2);
    let started = Instant::now();
    let failure = step.run(backend(&server_url()).as_mut(), &mut sandbox).unwrap_err();
    println!(
        "MEASURE {} context overflow refused in {:.2}s: {failure}",
        server_kind(),
        started.elapsed().as_secs_f64()
    );
    // llama-server says how large the prompt is before anything is sent (constrained decoding
    // identified it); llama-cpp-python refuses the request itself.
    match (&failure.error, server_kind().as_str()) {
        (Error::PromptTooLarge { prompt_tokens, context, max_output_tokens }, "llama-server") => {
            assert!(*prompt_tokens > 8192 && *context == 8192 && *max_output_tokens == OUTPUT_CAP, "{failure}");
        }
        (Error::Backend(BackendError::ContextOverflow { .. }), "llama-cpp-python") => {}
        (other, kind) => panic!("expected a context overflow from {kind}, got: {other}"),
    }
    let message = failure.to_string();
    assert!(message.contains("context") && message.contains("--ctx-size") && message.contains("inputs"), "{message}");
    assert_eq!(failure.transcript.totals().model_calls, 0, "the refused request generated nothing");
}

const ONE_STEP: &str = r#"
[package.metadata.promptgen]
backend = "openai"
model = "smollm2"
seed = 1
temperature = 0.0
max_model_calls = 4
protocol = "json"
request_timeout_secs = 300
max_output_tokens = 160

[[package.metadata.promptgen.steps]]
id = "01"
prompt = "prompts/01.md"
outputs = ["hello.txt"]
"#;

#[test]
#[ignore = "needs a real llama.cpp server: run scripts/real-llm.sh"]
fn cargo_promptgen_records_a_real_run_and_the_next_run_calls_no_model() {
    let _watch = ServerWatch;
    let package = Package::new(ONE_STEP, "");
    package.write("prompts/01.md", "Write the file hello.txt containing the text: hello world.\n");
    let started = Instant::now();
    let out = run(package.promptgen(&[]).env("OPENAI_BASE_URL", server_url()));
    println!("MEASURE cargo promptgen, one step: {:.2}s\n{}", started.elapsed().as_secs_f64(), text(&out));
    if out.status.success() {
        let lock = package.read("promptgen.lock");
        assert!(lock.contains("backend = \"openai\"") && lock.contains("model = \"smollm2\""), "{lock}");
        assert!(package.path("promptgen/01.transcript.jsonl").is_file());
        let out = run(&mut package.promptgen(&["check"]));
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        // No server at all for the second run: it must not need one.
        let out = run(package.promptgen(&[]).env("OPENAI_BASE_URL", promptgen_tests::refused_url() + "/v1"));
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains("0 of 1 steps regenerated"), "{}", text(&out));
    } else {
        // A weak model may exhaust its budget: then the error says so and nothing is recorded.
        assert!(String::from_utf8_lossy(&out.stderr).contains("max_model_calls"), "{}", text(&out));
        assert!(!package.path("promptgen.lock").exists());
    }
}

/// `cargo promptgen eval` against the real server: two seeds of a one-file step, each a
/// trial of its own with real calls and real token counts; the package is left as it was, and
/// `--replay` judges the same trials again with no server at all.
#[test]
#[ignore = "needs a real llama.cpp server: run scripts/real-llm.sh"]
fn eval_runs_every_trial_against_the_real_server_and_records_nothing_of_the_package() {
    let _watch = ServerWatch;
    let metadata = ONE_STEP.replace("max_model_calls = 4", "max_model_calls = 2");
    let package = Package::new(&metadata, "");
    package.write("prompts/01.md", "Write the file hello.txt containing the text: hello world.\n");
    let before = support::snapshot(package.dir.path());
    let started = Instant::now();
    let out = run(package
        .promptgen(&["eval", "--seeds", "2", "--temperature", "0.7", "--format", "json"])
        .env("OPENAI_BASE_URL", server_url()));
    println!("MEASURE cargo promptgen eval, 2 trials: {:.2}s\n{}", started.elapsed().as_secs_f64(), text(&out));
    assert_eq!(out.status.code(), Some(0), "no threshold is set: {}", text(&out));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = &summary["rows"][0];
    assert_eq!(
        (row["step"].as_str(), row["model"].as_str(), row["trials"].as_u64()),
        (Some("01"), Some("smollm2"), Some(2))
    );
    let passed = row["passed"].as_u64().unwrap();
    let failures: u64 = row["failures"].as_array().unwrap().iter().map(|f| f[1].as_u64().unwrap()).sum();
    assert!(failures >= 2 - passed, "every failed trial has a class: {row:#}");
    // Real calls, real token counts, one record per trial.
    assert!(summary["spent"]["model_calls"].as_u64().unwrap() >= 2, "{summary:#}");
    assert!(summary["spent"]["tokens"].as_u64().unwrap() > 0, "the server counts tokens: {summary:#}");
    let run_dir = support::shared_target().join("promptgen/eval").join(summary["run"].as_str().unwrap());
    let trials: Vec<serde_json::Value> = std::fs::read_to_string(run_dir.join("trials.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seeds: Vec<u64> = trials.iter().map(|t| t["seed"].as_u64().unwrap()).collect();
    assert_eq!(seeds.len(), 2, "{trials:?}");
    assert!(seeds.contains(&1) && seeds.contains(&2), "seeds 1 and 2 from the configured seed 1: {seeds:?}");
    assert_eq!(support::changes(&before, &support::snapshot(package.dir.path())), Vec::<String>::new());

    // Judged again with no server to call: nothing may need one.
    let run_name = summary["run"].as_str().unwrap().to_string();
    let out = run(package
        .promptgen(&["eval", "--replay", &run_name, "--format", "json"])
        .env("OPENAI_BASE_URL", promptgen_tests::refused_url() + "/v1"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let replayed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(replayed["rows"][0]["trials"], 2, "{replayed:#}");
}

/// A second server of our own, so that stopping it does not disturb the other tests.
struct OwnServer {
    child: Child,
    url: String,
}

impl OwnServer {
    /// Starts the same kind of server as the shared one, on a port of its own, through
    /// `PROMPTGEN_REAL_LLM_SERVE` (`bash scripts/real-llm.sh serve <kind>`, which execs it).
    fn start() -> OwnServer {
        let serve = env("PROMPTGEN_REAL_LLM_SERVE");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut words = serve.split_whitespace();
        let mut child = Command::new(words.next().unwrap())
            .args(words)
            .arg(port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}/v1");
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("the second {} server exited while starting: {status}", server_kind());
            }
            // llama-server accepts connections while it loads (and answers 503): ask for the
            // model list, which only a ready server gives.
            if models_answer(port) {
                break;
            }
            assert!(Instant::now() < deadline, "the second server did not start within 3 minutes");
            std::thread::sleep(Duration::from_millis(200));
        }
        OwnServer { child, url }
    }
}

/// Whether `GET /v1/models` on `port` answers 200.
fn models_answer(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const TWO_STEPS: &str = r#"
[package.metadata.promptgen]
backend = "openai"
model = "smollm2"
max_model_calls = 4
protocol = "json"
max_output_tokens = 64

[[package.metadata.promptgen.steps]]
id = "01"
prompt = "prompts/01.md"
outputs = ["hello.txt"]

[[package.metadata.promptgen.steps]]
id = "02"
prompt = "prompts/02.md"
outputs = ["bye.txt"]
"#;

#[test]
#[ignore = "needs a real llama.cpp server: run scripts/real-llm.sh"]
fn a_server_stopped_midway_is_a_clear_error_and_the_lock_keeps_what_finished() {
    let _watch = ServerWatch;
    let mut server = OwnServer::start();
    let package = Package::new(TWO_STEPS, "");
    package.write("prompts/01.md", "Write hello to hello.txt.\n");
    package.write("prompts/02.md", "Write goodbye to bye.txt.\n");
    let mut child = package.promptgen(&[]).env("OPENAI_BASE_URL", &server.url).stderr(Stdio::piped()).spawn().unwrap();
    // Stop the server as soon as step 01 is recorded (or the run ends).
    let lock = package.path("promptgen.lock");
    let deadline = Instant::now() + Duration::from_secs(240);
    while !lock.exists() && child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = server.child.kill();
    let _ = server.child.wait();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    // Step 01 writes hello.txt and finishes: the server enforces the json protocol's schema,
    // which admits only a write of hello.txt until it exists; step 02's request is in flight
    // when the server dies (or about to be sent).
    assert!(lock.exists(), "step 01 was recorded before the stop: {stderr}");
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("step `02` failed"), "{stderr}");
    assert!(stderr.contains("could not connect") || stderr.contains("broke off its reply"), "{stderr}");
    let lock_text = std::fs::read_to_string(&lock).unwrap();
    assert!(lock_text.contains("id = \"01\"") && !lock_text.contains("id = \"02\""), "{lock_text}");
}

/// Watches a step: each model call's streamed text, joined, and how many pieces it came in.
#[derive(Default)]
struct Streams {
    calls: Vec<(String, u64)>,
    current: (String, u64),
}

impl Observer for Streams {
    fn event(&mut self, event: &Event) {
        if let Event::ModelCall { .. } = event {
            self.calls.push(std::mem::take(&mut self.current));
        }
    }

    fn progress(&mut self, progress: &Progress<'_>) {
        self.current.0.push_str(progress.text);
        self.current.1 = progress.pieces;
    }
}

/// A transcript with each tool call id replaced by its number in order of appearance:
/// llama-cpp-python gives every call a random id (`call__0_write_file_cmpl-<uuid>`), so that
/// no two runs record the same ids, streamed or not.
fn with_ids_in_order(jsonl: &str) -> String {
    let mut ids: Vec<String> = Vec::new();
    let mut number = |id: &str| {
        let n = ids.iter().position(|known| known == id).unwrap_or_else(|| {
            ids.push(id.to_string());
            ids.len() - 1
        });
        format!("id{n}")
    };
    let mut out = String::new();
    for line in jsonl.lines() {
        let mut event: serde_json::Value = serde_json::from_str(line).unwrap();
        let message = &mut event["message"];
        if let Some(id) = message["tool_call_id"].as_str().map(str::to_string) {
            message["tool_call_id"] = number(&id).into();
        }
        for call in message["tool_calls"].as_array_mut().into_iter().flatten() {
            if let Some(id) = call["id"].as_str().map(str::to_string) {
                call["id"] = number(&id).into();
            }
        }
        out.push_str(&format!("{event}\n"));
    }
    out
}

/// How each model call's reply arrived, from the transcript's volatile data.
fn deliveries(transcript: &Transcript) -> Vec<String> {
    transcript
        .to_jsonl(Volatility::Keep)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok()?["volatile"].get("delivery").cloned())
        .map(|d| match d {
            serde_json::Value::String(s) => s,
            other => other.to_string(),
        })
        .collect()
}

/// Streaming (issue 15): a step records the same transcript streamed as asked whole, the
/// observer sees each streamed reply grow, and where the server cannot stream a request the
/// reply is asked for whole (llama-cpp-python: an empty stream when tools are offered, and
/// streams without token counts).
#[test]
#[ignore = "needs a real llama.cpp server: run scripts/real-llm.sh"]
fn a_streamed_step_records_what_the_same_step_asked_whole_records() {
    let _watch = ServerWatch;
    for protocol in [ToolProtocol::Native, ToolProtocol::Json] {
        let run = |stream: bool, observer: &mut dyn Observer| {
            let dir = tempfile::tempdir().unwrap();
            let mut sandbox = Sandbox::builder(dir.path().join("out")).build().unwrap();
            let mut config = BackendConfig::new(BackendKind::OpenAi);
            config.base_url = Some(server_url());
            config.max_output_tokens = OUTPUT_CAP;
            config.stream = stream;
            let mut step = Step::new(
                "smollm2",
                "Write the file hello.txt containing the text: hello world. Use the write_file tool, then call finish.",
            );
            // Unconstrained: this pins how each server streams tool calls natively.
            step.protocol(protocol).seed(1).temperature(0.0).max_model_calls(3).constrain(Constrain::Off);
            let result = step.run_with(config.open().unwrap().as_mut(), &mut sandbox, None, observer);
            assert_clean(&result);
            transcript(&result).clone()
        };
        // llama.cpp reuses the cached start of a prompt, and a prompt read from its cache gives
        // slightly different numbers from one read cold: greedy decoding then diverges (seen
        // here). A first run warms the cache, so that both runs compared read from it.
        run(false, &mut |_: &Event| {});
        let mut streams = Streams::default();
        let streamed = run(true, &mut streams);
        let whole = run(false, &mut |_: &Event| {});
        report(&format!("{protocol:?} step, streamed"), &streamed);
        report(&format!("{protocol:?} step, whole"), &whole);
        let seen = deliveries(&streamed);
        println!("MEASURE {} {protocol:?} step, how each reply came: {seen:?}", server_kind());
        assert_eq!(
            with_ids_in_order(&streamed.to_jsonl(Volatility::Omit)),
            with_ids_in_order(&whole.to_jsonl(Volatility::Omit)),
            "the recorded transcript depends on streaming"
        );
        assert!(deliveries(&whole).iter().all(|d| d == "whole"), "{:?}", deliveries(&whole));
        let replies: Vec<String> = streamed
            .events
            .iter()
            .filter_map(|e| match e {
                Event::Message { message, .. } if message.role == codegen_core::chat::Role::Assistant => {
                    Some(message.content.clone())
                }
                _ => None,
            })
            .collect();
        for ((delivery, (text, pieces)), reply) in seen.iter().zip(&streams.calls).zip(&replies) {
            if delivery == "streamed" {
                assert!(*pieces > 0, "a streamed reply was seen growing");
                assert_eq!(text, reply, "the pieces shown make up the reply");
            }
        }
        match (server_kind().as_str(), protocol) {
            ("llama-cpp-python", ToolProtocol::Native) => {
                assert!(seen[0].contains("empty stream"), "{seen:?}");
                assert!(seen[1..].iter().all(|d| d == "whole"), "not streamed again: {seen:?}");
            }
            ("llama-cpp-python", _) => {
                assert!(seen[0].contains("no token counts"), "{seen:?}");
                assert!(seen[1..].iter().all(|d| d == "whole"), "not streamed again: {seen:?}");
            }
            _ => assert!(seen.iter().all(|d| d == "streamed"), "{seen:?}"),
        }
    }
}

/// Sends `signal` (`STOP`, `CONT`) to a process.
fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status().unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

/// A server frozen in the middle of a streamed reply (SIGSTOP: the connection stays open,
/// nothing more comes) is a stall, reported within the idle timeout, not at the end of the
/// ten-minute whole-request timeout.
#[test]
#[ignore = "needs a real llama.cpp server: run scripts/real-llm.sh"]
fn a_server_frozen_in_the_middle_of_a_reply_is_a_stall_within_the_idle_timeout() {
    let _watch = ServerWatch;
    let server = OwnServer::start();
    let pid = server.child.id();
    let mut config = BackendConfig::new(BackendKind::OpenAi);
    config.base_url = Some(server.url.clone());
    config.max_output_tokens = OUTPUT_CAP;
    config.http.idle_timeout = Duration::from_secs(2);
    let mut backend = config.open().unwrap();
    let messages = [codegen_core::chat::Message::user("Tell a long story about a lighthouse keeper.")];
    let request = ChatRequest {
        model: "smollm2",
        messages: &messages,
        tools: &[],
        seed: Some(1),
        temperature: Some(0.0),
        constraint: None,
    };
    let mut frozen_after = None;
    let started = Instant::now();
    let result = backend.chat_observed(&request, &mut |progress| {
        if frozen_after.is_none() && progress.pieces >= 3 {
            signal(pid, "STOP");
            frozen_after = Some(progress.pieces);
        }
    });
    if frozen_after.is_some() {
        signal(pid, "CONT");
    }
    let shown = result.as_ref().map(|reply| reply.message.content.clone()).map_err(ToString::to_string);
    println!(
        "MEASURE {} frozen after {frozen_after:?} pieces: {:.2}s: {shown:?}",
        server_kind(),
        started.elapsed().as_secs_f64()
    );
    let frozen_after = frozen_after.expect("the reply streamed: at least 3 pieces arrived");
    match result {
        Err(BackendError::Stalled { silent, pieces, began: true, limit: "idle_timeout", .. }) => {
            assert_eq!(silent, Duration::from_secs(2));
            assert_eq!(pieces, frozen_after);
        }
        other => panic!("expected a stall, got {other:?}"),
    }
}

/// A step constrained by the real server: a trivial one-file task, in one protocol, seed `seed`.
fn constrained_step(
    protocol: ToolProtocol,
    seed: u64,
    constrain: Constrain,
    cap: u32,
) -> Result<StepOutput, StepFailure> {
    let dir = tempfile::tempdir().unwrap();
    let mut sandbox = Sandbox::builder(dir.path().join("out")).build().unwrap();
    let mut config = BackendConfig::new(BackendKind::OpenAi);
    config.base_url = Some(server_url());
    config.max_output_tokens = cap;
    config.http.request_timeout = Duration::from_secs(300);
    let mut backend = config.open().unwrap();
    let mut step =
        Step::new("smollm2", "Write the file a.rs containing exactly this line:\npub fn one() -> u32 { 1 }\n");
    step.protocol(protocol).seed(seed).temperature(0.7).max_model_calls(3).expect_output("a.rs").constrain(constrain);
    step.run(backend.as_mut(), &mut sandbox)
}

/// Every reply the real server sends under the constraint is one tool call the loop runs, in
/// every protocol: `json` under a schema, `blocks` under a grammar, `native` carried in `json`
/// (neither server can be made to call a tool natively). The model is too small to write the
/// right line; the shape is what the server guarantees.
#[test]
#[ignore = "needs a real llama.cpp server: run scripts/real-llm.sh"]
fn constrained_replies_are_runnable_calls_in_every_protocol() {
    let _watch = ServerWatch;
    for protocol in ToolProtocol::ALL {
        let (mut sent, mut runnable) = (0, 0);
        for seed in 1..=3 {
            let result = constrained_step(protocol, seed, Constrain::Auto, 160);
            if let Err(failure) = &result {
                assert!(matches!(failure.error, Error::BudgetExhausted { .. }), "unexpected failure: {failure}");
            }
            let transcript = transcript(&result);
            let by = transcript.events.iter().find_map(|e| match e {
                Event::Constrained { protocol, by, server } => Some((*protocol, *by, server.clone())),
                _ => None,
            });
            let (ran_in, _, server) = by.unwrap_or_else(|| panic!("{protocol}: the step was not constrained"));
            assert_eq!(server, server_kind());
            assert_eq!(ran_in, if protocol == ToolProtocol::Native { ToolProtocol::Json } else { protocol });
            let replies = transcript.replies();
            sent += replies.sent;
            runnable += replies.runnable;
            if replies.runnable < replies.sent {
                println!("{}", transcript.to_jsonl(Volatility::Omit));
            }
        }
        println!(
            "MEASURE {} constrained {protocol}: {runnable} of {sent} replies were one runnable call",
            server_kind()
        );
        assert_eq!(runnable, sent, "{protocol}: every constrained reply is a runnable call");
    }
}

/// A re-run by edit against the real server: the recorded file is in place, `edit_file` is
/// among what the constraint admits, and every reply is a call the loop runs, in every
/// protocol (an `edit_file` call included: its `old` and `new` arrive well-formed). What the
/// model makes of the file is its own; the calls it sent are printed.
#[test]
#[ignore = "needs a real llama.cpp server: run scripts/real-llm.sh"]
fn a_re_run_by_edit_gets_only_runnable_calls_and_edit_file_among_them() {
    let _watch = ServerWatch;
    const RECORDED: &str = "pub fn one() -> u32 {\n    2\n}\n";
    let mut tools_used: Vec<String> = Vec::new();
    for protocol in ToolProtocol::ALL {
        let (mut sent, mut runnable) = (0, 0);
        for seed in 1..=2 {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(dir.path().join("out")).unwrap();
            std::fs::write(dir.path().join("out/a.rs"), RECORDED).unwrap();
            let mut sandbox = Sandbox::builder(dir.path().join("out")).build().unwrap();
            let mut config = BackendConfig::new(BackendKind::OpenAi);
            config.base_url = Some(server_url());
            config.max_output_tokens = 160;
            config.http.request_timeout = Duration::from_secs(300);
            let mut backend = config.open().unwrap();
            let mut step =
                Step::new("smollm2", "In a.rs, `one` must return 1, not 2. Change that line, then finish.\n");
            step.system_prompt(format!(
                "This task was done before: a.rs is in place:\n```\n{RECORDED}```\nChange the line this requires with {} and keep every other line.",
                protocol.edit_named()
            ));
            step.protocol(protocol).seed(seed).temperature(0.7).max_model_calls(3).expect_output("a.rs");
            let result = step.run(backend.as_mut(), &mut sandbox);
            if let Err(failure) = &result {
                assert!(matches!(failure.error, Error::BudgetExhausted { .. }), "unexpected failure: {failure}");
            }
            let transcript = transcript(&result);
            let replies = transcript.replies();
            sent += replies.sent;
            runnable += replies.runnable;
            for event in &transcript.events {
                if let Event::ToolRun { tool, ok, .. } = event {
                    tools_used.push(format!("{protocol} {tool}{}", if *ok { "" } else { " (refused)" }));
                }
            }
            let now = std::fs::read_to_string(dir.path().join("out/a.rs")).unwrap();
            println!("MEASURE {} re-run by edit {protocol} seed {seed}: a.rs {:?}", server_kind(), now);
        }
        println!(
            "MEASURE {} re-run by edit {protocol}: {runnable} of {sent} replies were one runnable call",
            server_kind()
        );
        assert_eq!(runnable, sent, "{protocol}: every constrained reply is a runnable call");
    }
    println!("MEASURE {} re-run by edit, the calls run: {tools_used:?}", server_kind());
}

/// Why a `native` step is carried in `json` on llama-server: asked with `tool_choice:
/// "required"`, it still lets the model answer in prose (its grammar for a template without a
/// tool-call prefix of its own admits text before the call), so no native request can be made
/// to be a call. If this ever fails, llama-server enforces it now: constrain `native` natively.
#[test]
#[ignore = "needs a real llama.cpp server: run scripts/real-llm.sh"]
fn llama_server_lets_prose_come_before_a_required_tool_call() {
    let _watch = ServerWatch;
    if server_kind() != "llama-server" {
        return;
    }
    let mut backend = backend(&server_url());
    let specs = codegen_core::__private::tools::specs_for(false);
    let messages = [
        Message::system("You work on a project through tools."),
        Message::user("Write the file a.rs containing exactly this line:\npub fn one() -> u32 { 1 }\n"),
    ];
    let constraint = codegen_core::constrain::Constraint::ToolCall;
    let mut prose = 0;
    for seed in 1..=4 {
        let request = ChatRequest {
            model: "smollm2",
            messages: &messages,
            tools: &specs,
            seed: Some(seed),
            temperature: Some(0.7),
            constraint: Some(&constraint),
        };
        let reply = backend.chat(&request).unwrap_or_else(|e| panic!("{e}"));
        if reply.message.tool_calls.is_empty() {
            prose += 1;
        }
    }
    println!("MEASURE llama-server tool_choice required: {prose} of 4 replies were not a tool call");
    assert!(prose > 0, "every reply was a call: llama-server enforces a required tool call with this template now");
}

/// The server's prompt cache: from turn 2 on, llama-server reuses everything it was sent
/// before (every reply goes back exactly as it generated it, cut-off replies included), so
/// what it reads again is what is new that turn, plus at most the previous reply itself: the
/// tokens a model samples (under a grammar above all) are not always the tokenization the
/// server gives the same text when it comes back, and llama-server compares tokens.
#[test]
#[ignore = "needs a real llama.cpp server: run scripts/real-llm.sh"]
fn the_server_reads_only_what_is_new_each_turn() {
    let _watch = ServerWatch;
    if server_kind() != "llama-server" {
        return;
    }
    for (constrain, cap) in [(Constrain::Off, 64), (Constrain::Auto, 160)] {
        let result = constrained_step(ToolProtocol::Json, 1, constrain, cap);
        let transcript = transcript(&result);
        let calls: Vec<(u64, u64, u64, bool)> = transcript
            .events
            .iter()
            .filter_map(|e| match e {
                Event::ModelCall { usage, finish_reason, volatile: Some(v), .. } => v.prompt_cache.map(|c| {
                    (
                        c.read,
                        c.read + c.reused.unwrap_or(0),
                        usage.completion_tokens.unwrap_or(0),
                        finish_reason.as_deref() == Some("length"),
                    )
                }),
                _ => None,
            })
            .collect();
        assert!(calls.len() >= 2, "{constrain}: {calls:?}\n{}", transcript.to_jsonl(Volatility::Omit));
        for pair in calls.windows(2) {
            let ((_, before, generated, cut), (read, now, _, _)) = (pair[0], pair[1]);
            // New this turn: what the prompt grew by, less the reply the server generated.
            let new = now.saturating_sub(before + generated).max(1);
            let reused = now - read;
            println!(
                "MEASURE llama-server cache, constrain {constrain} cap {cap}: read {read} of {now}, new {new}, previous reply {generated}: {:.2}x the new tokens{}",
                read as f64 / new as f64,
                if cut { " (after a cut-off reply)" } else { "" }
            );
            let history = transcript.to_jsonl(Volatility::Keep);
            assert!(
                reused >= before,
                "{constrain}: the server read again what it had before the last reply ({reused} reused of {before}): {calls:?}\n{history}"
            );
            assert!(
                read <= new + generated + 4,
                "{constrain}: read {read} tokens where {new} were new after a {generated}-token reply: {calls:?}\n{history}"
            );
        }
    }
}
