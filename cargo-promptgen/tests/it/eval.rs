//! `cargo promptgen eval` end to end: the real binary, real `cargo`, and the fake LLM server
//! on loopback answering each request from its model, its seed and the conversation so far,
//! so that some seeds write code that fails the crate check and others code that fails the
//! crate's own tests. The crate is realistic: serde and serde_json from crates.io, a
//! hand-written module the generated code uses, and tests in `main.rs` that use it.
//!
//! Covered: the counts and rates of the table are exact; two models give two rows; thresholds
//! pass and fail with the documented exit codes (from the flag and from Cargo.toml); the
//! lock, the store and the package are byte-identical afterwards and no pending area appears;
//! `--replay` makes no request and judges the kept files by today's tests; an interrupted run
//! resumes without running its finished trials again; `--chain`; a step whose dependency has
//! no recorded output is refused with the fix; `--protocol` and `--constrain` against the fake
//! server seen as llama-server, a row per protocol × constraint with its runnable replies;
//! `--regenerate edit,fresh`, a row per way of starting with the diff from the recorded file
//! and the tokens generated, trials by edit told what changed (or that nothing did), and by
//! edit of a step with nothing recorded, from nothing and saying so.

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use promptgen_tests::{FakeLlm, Identity, RecordedRequest, Reply, Turn};
use serde_json::{Value, json};

use crate::support;
use crate::support::{
    A, Package, USER_JSON_GOOD, USER_JSON_MAIN, USER_JSON_TYPO, USER_JSON_WRONG, changes, pending_dir,
    promptgen_offline, snapshot, stderr, stdout, text,
};

const METADATA: &str = r#"
[package.metadata.promptgen]
backend = "ollama"
model = "good-coder"
seed = 10
temperature = 0.7
max_model_calls = 4
check_rounds = 0

[[package.metadata.promptgen.steps]]
id = "01"
prompt = "prompts/01.md"
outputs = ["user_json.rs"]
check = "cargo test"

[[package.metadata.promptgen.steps]]
id = "02"
prompt = "prompts/02.md"
outputs = ["greeting.rs"]
"#;

const GREETING: &str = "use crate::domain::User;\n\npub fn greet(user: &User) -> String {\n    format!(\"Hello, {}!\", super::user_json::describe(user))\n}\n";

/// What `good-coder` writes for step 01 with each seed (10..=14): three of five pass, one
/// fails the crate check, one fails a test.
fn user_json_for(seed: u64) -> &'static str {
    match seed % 5 {
        2 => USER_JSON_TYPO,
        3 => USER_JSON_WRONG,
        _ => USER_JSON_GOOD,
    }
}

/// The fake models. `good-coder` writes the step's file (by seed) and then finishes;
/// `bad-coder` only ever answers in prose, so it never finishes.
fn answer(body: &Value) -> Option<Reply> {
    let model = body["model"].as_str()?;
    // Ollama sends the seed in `options`, OpenAI-compatible servers at the top level.
    let seed = body["options"]["seed"].as_u64().or_else(|| body["seed"].as_u64())?;
    let messages = body["messages"].as_array()?;
    let turn = messages.iter().filter(|m| m["role"] == "assistant").count();
    let text = body.to_string();
    if model == "bad-coder" {
        return Some(Reply::turn(Turn::text("I would write the file like this: fn describe() {}")));
    }
    let (path, content) = if text.contains("Write greeting.rs") {
        ("greeting.rs", GREETING)
    } else {
        ("user_json.rs", user_json_for(seed))
    };
    Some(Reply::turn(match turn {
        0 => Turn::call("write_file", json!({"path": path, "content": content})),
        _ => Turn::call("finish", json!({"summary": "done"})),
    }))
}

fn server() -> FakeLlm {
    let server = FakeLlm::start(Vec::new());
    server.respond_with(answer);
    server
}

fn package(metadata: &str) -> Package {
    let package = Package::user_json(metadata);
    package.write("prompts/02.md", "Write greeting.rs: greet(user) using user_json::describe.\n");
    package
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", text(out)))
}

fn row<'a>(summary: &'a Value, step: &str, model: &str) -> &'a Value {
    summary["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["step"] == step && r["model"] == model)
        .unwrap_or_else(|| panic!("no row {step} · {model} in {summary:#}"))
}

#[test]
fn two_models_five_seeds_exact_counts_thresholds_and_nothing_recorded() {
    let server = server();
    let package = package(METADATA);
    // Record the chain once (seed 10 writes good code), as a team would have it.
    let out = promptgen_offline(&package, &server, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let recorded_requests = server.requests().len();
    let before = snapshot(package.dir.path());

    let out = promptgen_offline(
        &package,
        &server,
        &["eval", "--step", "01", "--model", "good-coder", "--model", "bad-coder", "--format", "json"],
    );
    assert_eq!(out.status.code(), Some(0), "no threshold is set: {}", text(&out));
    let summary = json_of(&out);
    assert_eq!(summary["rows"].as_array().unwrap().len(), 2, "{summary:#}");

    let good = row(&summary, "01", "good-coder");
    assert_eq!(good["trials"], 5);
    assert_eq!(good["passed_check"], 4, "the typo does not compile: {good:#}");
    assert_eq!(good["passed_tests"], 3, "the wrong description fails its test: {good:#}");
    assert_eq!(good["passed"], 3);
    assert_eq!(good["pass_at_1"], 0.6);
    let (low, high) = (good["interval"][0].as_f64().unwrap(), good["interval"][1].as_f64().unwrap());
    assert!((low - 0.2307).abs() < 1e-3 && (high - 0.8824).abs() < 1e-3, "Wilson 3/5: {low} {high}");
    assert_eq!(good["k"], 3);
    assert!((good["pass_hat_k"].as_f64().unwrap() - 0.1).abs() < 1e-12, "C(3,3)/C(5,3): {good:#}");
    assert_eq!(good["distinct_outputs"], 3, "USER_JSON_GOOD, USER_JSON_TYPO and USER_JSON_WRONG: {good:#}");
    assert_eq!(good["median_calls"], 2);
    assert_eq!(
        good["failures"],
        json!([["compiler error E0609", 1], ["failing test `tests::the_description_names_the_user_and_the_age`", 1]])
    );

    let bad = row(&summary, "01", "bad-coder");
    assert_eq!(
        (bad["trials"].as_u64(), bad["passed"].as_u64(), bad["passed_check"].as_u64()),
        (Some(5), Some(0), Some(0))
    );
    assert_eq!(bad["passed_tests"], 0);
    assert_eq!(bad["median_calls"], 4, "the whole budget: {bad:#}");
    assert_eq!(bad["failures"], json!([["no finish", 5]]));
    assert_eq!(bad["distinct_outputs"], 0);

    // Every trial sent its own seed to its own model: 10..=14, each model.
    let mut seen: Vec<(String, u64)> = server.requests()[recorded_requests..]
        .iter()
        .filter(|r| r.method == "POST")
        .map(|r| r.json())
        .filter(|b| b["messages"].as_array().is_some_and(|m| m.iter().all(|m| m["role"] != "assistant")))
        .map(|b| (b["model"].as_str().unwrap().to_string(), b["options"]["seed"].as_u64().unwrap()))
        .collect();
    seen.sort();
    let expected: Vec<(String, u64)> =
        ["bad-coder", "good-coder"].iter().flat_map(|m| (10..15).map(move |s| (m.to_string(), s))).collect();
    assert_eq!(seen, expected);
    // Spent and kept: the records name every trial; the transcripts are there for `log`.
    assert_eq!(summary["spent"]["model_calls"], 5 * 2 + 5 * 4);
    let run = summary["run"].as_str().unwrap().to_string();
    let run_dir = support::shared_target().join("promptgen/eval").join(&run);
    let trials = std::fs::read_to_string(run_dir.join("trials.jsonl")).unwrap();
    assert_eq!(trials.lines().count(), 10, "{trials}");
    assert!(run_dir.join("transcripts/01.m0.s12.jsonl").is_file());
    assert_eq!(std::fs::read_to_string(run_dir.join("trees/01.m0.s13/user_json.rs")).unwrap(), USER_JSON_WRONG);
    let out = promptgen_offline(&package, &server, &["log", "--eval", &run, "01.m0.s12", "--color", "never"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let log = stdout(&out);
    for phrase in ["step 01.m0.s12 · failed", "good-coder · native protocol · seed 12", "error[E0609]: no field `nmae`"]
    {
        assert!(log.contains(phrase), "expected `{phrase}` in:\n{log}");
    }

    // Nothing of the package changed: lock, store, sources. No pending area either.
    assert_eq!(changes(&before, &snapshot(package.dir.path())), Vec::<String>::new());
    assert!(!pending_dir(&package).exists(), "eval must not leave pending results");

    // The table for people, and the same numbers again from the records without a trial
    // (`--resume` of a finished run runs nothing).
    let requests = server.requests().len();
    let out = promptgen_offline(&package, &server, &["eval", "--resume", &run, "--format", "md"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.requests().len(), requests, "a finished run has nothing left to run");
    let md = stdout(&out);
    assert!(md.contains("| step | model | trials | check | tests | pass@1 | 95% CI | pass^k |"), "{md}");
    assert!(md.contains("| 01 | good-coder | 5 | 4/5 | 3/5 | 60% | 23%–88% | 0.10 (k=3) | 3 |"), "{md}");
    assert!(md.contains("| 01 | bad-coder | 5 | 0/5 | 0/5 | 0% | 0%–43% |"), "{md}");
    assert!(md.contains("- 01 · bad-coder: no finish (5)"), "{md}");
    let out = promptgen_offline(&package, &server, &["eval", "--resume", &run, "--format", "junit"]);
    let junit = stdout(&out);
    assert!(junit.contains("<testsuite name=\"step 01 · good-coder\" tests=\"5\" failures=\"2\">"), "{junit}");
    assert!(junit.contains("<failure message=\"compiler error E0609\">"), "{junit}");

    // Thresholds: a flag, per step × model and never on an average.
    let out = promptgen_offline(&package, &server, &["eval", "--resume", &run, "--min-pass-rate", "0.5"]);
    assert_eq!(out.status.code(), Some(1), "bad-coder is below 50 %: {}", text(&out));
    let err = stderr(&out);
    assert!(
        err.contains("error: step 01 with model `bad-coder` passed 0 of 5 trials (0%), below its min_pass_rate of 50%"),
        "{err}"
    );
    assert!(!err.contains("model `good-coder` passed"), "good-coder meets 50 %: {err}");
    assert!(stdout(&out).contains("01 · good-coder: pass@1 60% meets min_pass_rate 50%"), "{}", text(&out));

    // ... and from Cargo.toml, with a per-step override.
    let manifest = package.read("Cargo.toml");
    package.write(
        "Cargo.toml",
        &format!("{manifest}\n[package.metadata.promptgen.eval]\nmin_pass_rate = 0.9\nsteps = {{ \"01\" = 0.0 }}\n"),
    );
    let out = promptgen_offline(&package, &server, &["eval", "--resume", &run]);
    assert_eq!(out.status.code(), Some(0), "step 01's own threshold is 0: {}", text(&out));
    package.write("Cargo.toml", &format!("{manifest}\n[package.metadata.promptgen.eval]\nmin_pass_rate = 0.6\n"));
    let out = promptgen_offline(&package, &server, &["eval", "--resume", &run]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(stderr(&out).contains("model `bad-coder` passed 0 of 5"), "{}", text(&out));
    assert!(!stderr(&out).contains("model `good-coder` passed"), "60 % meets 0.6: {}", text(&out));
    package.write("Cargo.toml", &manifest);

    // --replay: no model is called, and the kept files are judged by today's tests. Drop the
    // test that the wrong description failed: that trial now passes; the typo still fails,
    // and bad-coder's trials, which never asked to finish, keep their outcome.
    package.write("src/main.rs", &USER_JSON_MAIN.replace("\"Ada (36)\"", "generated::user_json::describe(&ada())"));
    let requests = server.requests().len();
    let out = promptgen_offline(&package, &server, &["eval", "--replay", &run, "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.requests().len(), requests, "--replay calls no model");
    let replayed = json_of(&out);
    assert_eq!(replayed["plan"]["replay_of"], run.as_str());
    let good = row(&replayed, "01", "good-coder");
    assert_eq!((good["passed"].as_u64(), good["passed_check"].as_u64()), (Some(4), Some(4)), "{good:#}");
    assert_eq!(good["failures"], json!([["compiler error E0609", 1]]));
    assert_eq!(row(&replayed, "01", "bad-coder")["failures"], json!([["no finish", 5]]));
    assert_eq!(replayed["spent"]["model_calls"], summary["spent"]["model_calls"], "what the trials cost then");
    package.write("src/main.rs", USER_JSON_MAIN);

    // --chain: each trial runs 01 then 02 on what 01 wrote in the same trial.
    let requests = server.requests().len();
    let out = promptgen_offline(&package, &server, &["eval", "--chain", "--seeds", "2", "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let chained = json_of(&out);
    for step in ["01", "02", "chain"] {
        let row = row(&chained, step, "good-coder");
        assert_eq!((row["trials"].as_u64(), row["passed"].as_u64()), (Some(2), Some(2)), "{step}: {row:#}");
    }
    assert_eq!(server.requests().len() - requests, 2 * 2 * 2, "two steps of two calls, twice");

    assert_eq!(changes(&before, &snapshot(package.dir.path())), Vec::<String>::new());
    assert!(!pending_dir(&package).exists());
}

#[test]
fn an_interrupted_run_resumes_without_running_its_finished_trials_again() {
    let server = server();
    // Each model call takes a while, so the run is still going when it is interrupted.
    server.set_latency(Duration::from_millis(150));
    let package = package(METADATA);

    // Nothing is recorded yet: step 02 has nothing to start from, and says what to do.
    let out = promptgen_offline(&package, &server, &["eval", "--step", "02"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("step `02` runs after step `01`, which has no recorded output"), "{err}");
    assert!(err.contains("--chain"), "{err}");
    assert_eq!(server.requests().len(), 0);

    let mut child = package
        .promptgen(&["eval", "--step", "01", "--model", "bad-coder", "--seeds", "6"])
        .env("PROMPTGEN_BASE_URL", server.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let runs = support::shared_target().join("promptgen/eval");
    let deadline = Instant::now() + Duration::from_secs(120);
    let trials_file = loop {
        let found = std::fs::read_dir(&runs).into_iter().flatten().flatten().find_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let file = entry.path().join("trials.jsonl");
            (name.starts_with(&format!("{}-", package.name))
                && std::fs::read_to_string(&file).is_ok_and(|t| t.lines().count() >= 2))
            .then_some(file)
        });
        if let Some(file) = found {
            break file;
        }
        assert!(Instant::now() < deadline, "no trial finished in time");
        std::thread::sleep(Duration::from_millis(20));
    };
    let status = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let _ = child.wait();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("trials were not run; `cargo promptgen eval --resume"), "{err}");
    let done: Vec<Value> =
        std::fs::read_to_string(&trials_file).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(done.len() >= 2 && done.len() < 6, "interrupted part-way: {}", done.len());
    let finished_seeds: Vec<u64> = done.iter().map(|t| t["seed"].as_u64().unwrap()).collect();

    let requests = server.requests().len();
    let out = promptgen_offline(&package, &server, &["eval", "--resume", "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let summary = json_of(&out);
    assert_eq!(row(&summary, "01", "bad-coder")["trials"], 6, "{summary:#}");
    // Only the trials left ran: four calls each, and none with a finished trial's seed.
    let resumed: Vec<Value> = server.requests()[requests..].iter().map(|r| r.json()).collect();
    assert_eq!(resumed.len(), 4 * (6 - done.len()), "{}", text(&out));
    for body in &resumed {
        let seed = body["options"]["seed"].as_u64().unwrap();
        assert!(!finished_seeds.contains(&seed), "seed {seed} ran again");
    }

    // Seeds mean little at temperature 0 on Ollama: the run says so.
    let out = promptgen_offline(
        &package,
        &server,
        &["eval", "--step", "01", "--model", "bad-coder", "--seeds", "2", "--temperature", "0"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        stderr(&out).contains("warning: step 01 samples at temperature 0 on Ollama, which then often ignores the seed"),
        "{}",
        text(&out)
    );

    // ... and at temperature 0 on an OpenAI-compatible server, which decodes greedily.
    let out = promptgen_offline(
        &package,
        &server,
        &["eval", "--step", "01", "--model", "bad-coder", "--seeds", "2", "--temperature", "0", "--backend", "openai"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        stderr(&out).contains("warning: step 01 samples at temperature 0 (greedy decoding: llama.cpp's server"),
        "{}",
        text(&out)
    );

    let lines = std::fs::read_to_string(&trials_file).unwrap();
    let mut names: Vec<&str> =
        lines.lines().map(|l| l.split("\"trial\":\"").nth(1).unwrap().split('"').next().unwrap()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 6, "each trial once: {lines}");
}

#[test]
fn values_out_of_range_are_usage_errors_before_any_trial() {
    let server = server();
    let package = package(METADATA);
    for (args, says) in [
        (["--temperature", "5"], "a temperature is a number from 0 to 2"),
        (["--min-pass-rate", "1.5"], "a pass rate is a number from 0 to 1"),
        (["--seeds", "0"], "--seeds <N>"),
        (["--k", "0"], "--k <K>"),
    ] {
        let out = promptgen_offline(&package, &server, &[&["eval", "--step", "01"][..], &args[..]].concat());
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", text(&out));
    }
    assert_eq!(server.requests().len(), 0);
    assert!(
        !support::shared_target().join("promptgen/eval").read_dir().is_ok_and(|mut d| {
            d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with(&format!("{}-", package.name))))
        }),
        "no run folder for a refused command"
    );
}

/// One step writing `a.rs` through an OpenAI-compatible server, checked by rustc.
const OPENAI_ONE_STEP: &str = r#"
[package.metadata.promptgen]
backend = "openai"
model = "fake-coder"
seed = 1
temperature = 0.7
max_model_calls = 4

[[package.metadata.promptgen.steps]]
id = "01"
prompt = "prompts/01.md"
outputs = ["a.rs"]
check = "rustc"
"#;

/// Whether a request is in the `blocks` protocol: constrained by a grammar, or told about `@@@`
/// commands by its system prompt (else it is in `json`: nothing here offers native tools).
fn is_blocks(body: &Value) -> bool {
    body["messages"][0]["content"].as_str().is_some_and(|system| system.contains("@@@write_begin"))
}

/// Whether a request carries a constraint, as llama-server takes one.
fn is_constrained(body: &Value) -> bool {
    body.get("grammar").is_some() || body.get("response_format").is_some()
}

/// A model behind llama-server that writes `a.rs` and then finishes, in the protocol each
/// request is in. Unconstrained, seed 2 first answers in prose: the slip constrained
/// decoding rules out, which the `runnable` column is there to show.
fn decoding_answer(body: &Value) -> Option<Reply> {
    let messages = body["messages"].as_array()?;
    let replied = |what: &[&str]| {
        messages.iter().any(|m| {
            m["role"] == "assistant" && m["content"].as_str().is_some_and(|c| what.iter().any(|w| c.contains(w)))
        })
    };
    let first = !messages.iter().any(|m| m["role"] == "assistant");
    if first && !is_constrained(body) && body["seed"] == 2 {
        return Some(Reply::turn(Turn::text("Sure! I will write a.rs with the function a now.")));
    }
    let wrote = replied(&["write_file", "@@@write_begin"]);
    let text = match (is_blocks(body), wrote) {
        (true, false) => format!("@@@write_begin(a.rs)\n{A}@@@write_end"),
        (true, true) => "@@@done(Wrote a.rs.)".to_string(),
        (false, false) => json!({"tool": "write_file", "arguments": {"path": "a.rs", "content": A}}).to_string(),
        (false, true) => json!({"tool": "finish", "arguments": {"summary": "Wrote a.rs."}}).to_string(),
    };
    Some(Reply::turn(Turn::text(&text)))
}

/// `cargo promptgen <args>` against `server` as an OpenAI-compatible server, offline.
fn promptgen_openai(package: &Package, server: &FakeLlm, args: &[&str]) -> Output {
    support::run(
        package.promptgen(args).env("OPENAI_BASE_URL", format!("{}/v1", server.url())).env("CARGO_NET_OFFLINE", "true"),
    )
}

fn trials_of_run(run: &str) -> Vec<Value> {
    let file = support::shared_target().join("promptgen/eval").join(run).join("trials.jsonl");
    std::fs::read_to_string(&file).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn bodies(requests: &[RecordedRequest]) -> Vec<Value> {
    requests.iter().filter(|r| r.method == "POST").map(RecordedRequest::json).collect()
}

#[test]
fn protocols_and_constraints_are_rows_of_their_own_and_only_constrained_trials_send_the_constraint() {
    let server = FakeLlm::start(Vec::new());
    server.identify_as(Identity::LlamaServer);
    server.respond_with(decoding_answer);
    let package = Package::lettered(OPENAI_ONE_STEP, 1);

    let out = promptgen_openai(
        &package,
        &server,
        &[
            "eval",
            "--protocol",
            "json,blocks",
            "--constrain",
            "on",
            "--constrain",
            "off",
            "--seeds",
            "2",
            "--format",
            "json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let summary = json_of(&out);
    let rows = summary["rows"].as_array().unwrap();
    let said = stderr(&out);
    assert!(said.contains("  01 · fake-coder · blocks · unconstrained · seed 2: passed (3 calls,"), "{said}");
    let labels: Vec<&str> = rows.iter().map(|r| r["variant"].as_str().unwrap()).collect();
    assert_eq!(
        labels,
        [
            "fake-coder · json · constrained",
            "fake-coder · json · unconstrained",
            "fake-coder · blocks · constrained",
            "fake-coder · blocks · unconstrained"
        ]
    );
    for row in rows {
        assert_eq!(
            (row["model"].as_str(), row["trials"].as_u64(), row["passed"].as_u64()),
            (Some("fake-coder"), Some(2), Some(2)),
            "{row:#}"
        );
        // Constrained, every reply was a call the loop could run; unconstrained, seed 2 slipped once.
        let expected = if row["constrain"] == "auto" { (4, 4) } else { (4, 5) };
        assert_eq!(
            (row["runnable_replies"].as_u64(), row["replies"].as_u64()),
            (Some(expected.0), Some(expected.1)),
            "{row:#}"
        );
    }
    assert_eq!((rows[0]["protocol"].as_str(), rows[0]["constrain"].as_str()), (Some("json"), Some("auto")));
    assert_eq!((rows[3]["protocol"].as_str(), rows[3]["constrain"].as_str()), (Some("blocks"), Some("off")));

    // Eight trials, each named by its variant, each recording whether the server enforced it.
    let run = summary["run"].as_str().unwrap().to_string();
    let trials = trials_of_run(&run);
    let mut names: Vec<&str> = trials.iter().map(|t| t["trial"].as_str().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "01.m0.blocks.off.s1",
            "01.m0.blocks.off.s2",
            "01.m0.blocks.on.s1",
            "01.m0.blocks.on.s2",
            "01.m0.json.off.s1",
            "01.m0.json.off.s2",
            "01.m0.json.on.s1",
            "01.m0.json.on.s2",
        ]
    );
    for trial in &trials {
        let name = trial["trial"].as_str().unwrap();
        let protocol = if name.contains(".json.") { "json" } else { "blocks" };
        assert_eq!(trial["protocol"], protocol, "{trial:#}");
        assert_eq!(trial["constrained"], name.contains(".on."), "{trial:#}");
        assert_eq!(trial["constrain"], if name.contains(".on.") { "auto" } else { "off" }, "{trial:#}");
    }

    // What the server saw: constrained requests carry the protocol's constraint (llama-server
    // takes a grammar for both: one of JSON calls, one of `@@@` commands), unconstrained ones
    // none; no request offers tools.
    let sent = bodies(&server.requests());
    assert_eq!(sent.len(), 2 * (4 + 5), "{}", text(&out));
    assert!(sent.iter().all(|b| b.get("tools").is_none()), "json and blocks offer no native tools");
    let count = |blocks: bool, constrained: bool| {
        sent.iter().filter(|b| is_blocks(b) == blocks && is_constrained(b) == constrained).count()
    };
    assert_eq!((count(false, true), count(false, false), count(true, true), count(true, false)), (4, 5, 4, 5));
    for body in sent.iter().filter(|b| is_constrained(b)) {
        let grammar = body["grammar"].as_str().unwrap_or_else(|| panic!("{body}"));
        if is_blocks(body) {
            assert!(grammar.starts_with("root ::= write") || grammar.starts_with("root ::= done"), "{body}");
        } else {
            assert!(grammar.starts_with("root ::= call-"), "{body}");
        }
        assert!(body.get("response_format").is_none(), "{body}");
    }

    // The table of every format shows `runnable` after `distinct`; a resumed run keeps its
    // variants and runs nothing.
    let requests = server.requests().len();
    let out = promptgen_openai(&package, &server, &["eval", "--resume", &run, "--format", "md"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.requests().len(), requests, "a finished run has nothing left to run");
    let md = stdout(&out);
    assert!(md.contains("| pass^k | distinct | runnable | calls |"), "{md}");
    assert!(md.contains("| 01 | fake-coder · json · constrained | 2 | 2/2 | - | 100% |"), "{md}");
    assert!(md.contains("| 01 | fake-coder · blocks · unconstrained | 2 | 2/2 | - | 100% |"), "{md}");
    assert!(md.contains("| 1 | 4/4 |") && md.contains("| 1 | 4/5 |"), "one distinct output, then runnable: {md}");
    let out = promptgen_openai(&package, &server, &["eval", "--resume", &run]);
    let table = stdout(&out);
    let header = table.lines().next().unwrap();
    assert!(header.contains("distinct  runnable  calls"), "{table}");
    let line =
        table.lines().find(|l| l.contains("fake-coder · json · unconstrained")).unwrap_or_else(|| panic!("{table}"));
    assert!(line.contains(" 4/5 "), "{table}");
    let out = promptgen_openai(&package, &server, &["eval", "--resume", &run, "--format", "junit"]);
    let junit = stdout(&out);
    assert!(
        junit.contains("<testsuite name=\"step 01 · fake-coder · blocks · constrained\" tests=\"2\" failures=\"0\">"),
        "{junit}"
    );
    assert!(junit.contains("<property name=\"runnable\" value=\"4/5\"/>"), "{junit}");
    assert_eq!(junit.matches("<testcase ").count(), 8, "{junit}");

    // Without the flags: a row per model as before, named by the model, and the trial names of
    // runs made before them. The step's `native` protocol, which llama-server cannot require,
    // is carried in `json` under a grammar: constrained, as its record says.
    let requests = server.requests().len();
    let out = promptgen_openai(&package, &server, &["eval", "--seeds", "1", "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let plain = json_of(&out);
    assert!(stderr(&out).contains("  01 · fake-coder · seed 1: passed (2 calls,"), "{}", text(&out));
    let rows = plain["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{plain:#}");
    assert_eq!((rows[0]["model"].as_str(), rows[0]["variant"].as_str()), (Some("fake-coder"), Some("fake-coder")));
    assert!(rows[0].get("protocol").is_none() && rows[0].get("constrain").is_none(), "{plain:#}");
    assert_eq!((rows[0]["runnable_replies"].as_u64(), rows[0]["replies"].as_u64()), (Some(2), Some(2)));
    let trials = trials_of_run(plain["run"].as_str().unwrap());
    assert_eq!(trials.len(), 1);
    assert_eq!(trials[0]["trial"], "01.m0.s1");
    assert_eq!((trials[0]["protocol"].as_str(), trials[0]["constrained"].as_bool()), (Some("native"), Some(true)));
    let sent = bodies(&server.requests()[requests..]);
    assert!(sent.iter().all(|b| b["grammar"].as_str().is_some_and(|g| g.starts_with("root ::= call-"))), "{sent:?}");
    let out = promptgen_openai(&package, &server, &["eval", "--resume", plain["run"].as_str().unwrap()]);
    let table = stdout(&out);
    assert!(table.lines().nth(1).is_some_and(|l| l.starts_with("01    fake-coder  1 ")), "{table}");
}

#[test]
fn unknown_protocols_constraint_and_regenerate_values_are_usage_errors_naming_the_allowed_ones() {
    let server = server();
    let package = package(METADATA);
    for (args, says) in [
        (&["--protocol", "nope"][..], &["nope", "native", "json", "blocks"][..]),
        (&["--protocol", "json,nope"][..], &["nope", "native", "json", "blocks"][..]),
        (&["--constrain", "maybe"][..], &["maybe", "on", "off"][..]),
        (&["--resume", "--protocol", "json"][..], &["--protocol"][..]),
        (&["--replay", "some-run", "--constrain", "off"][..], &["--constrain"][..]),
        (&["--regenerate", "rewrite"][..], &["rewrite", "edit", "fresh"][..]),
        (&["--resume", "--regenerate", "edit"][..], &["--regenerate"][..]),
        (&["--replay", "some-run", "--regenerate", "fresh"][..], &["--regenerate"][..]),
    ] {
        let out = promptgen_offline(&package, &server, &[&["eval"][..], args].concat());
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        let err = stderr(&out);
        for word in says {
            assert!(err.contains(word), "{args:?}: expected `{word}` in {err}");
        }
    }
    assert_eq!(server.requests().len(), 0);
}

/// One step writing `a.rs` on Ollama, with no check: the trials below are about how a step
/// starts and what it changes, not about the code.
const REGENERATE_ONE_STEP: &str = r#"
[package.metadata.promptgen]
backend = "ollama"
model = "fake-coder"
seed = 1
temperature = 0.7
max_model_calls = 4

[[package.metadata.promptgen.steps]]
id = "01"
prompt = "prompts/01.md"
outputs = ["a.rs"]
check = "none"
"#;

/// `a.rs` as the first prompt has it written, and recorded.
const A_RECORDED: &str = "pub fn a() -> &'static str {\n    \"a\"\n}\n";
/// `a.rs` as a trial from nothing writes it after the prompt asks for `a1`: three lines from
/// [`A_RECORDED`] (a doc comment added, the value's line replaced).
const A_REWRITTEN: &str = "/// The first letter.\npub fn a() -> &'static str {\n    \"a1\"\n}\n";
/// `a.rs` as a trial by edit leaves it after the same change: one line replaced.
const A_EDITED: &str = "pub fn a() -> &'static str {\n    \"a1\"\n}\n";
/// The prompt after the change.
const PROMPT_A1: &str = "Write a.rs with fn a returning \"a1\".\n";

/// The system message of a request: where a trial by edit is told what it starts from.
fn system_of(body: &Value) -> &str {
    body["messages"][0]["content"].as_str().unwrap_or_default()
}

/// A model that revises what is in place and writes whole what is not. Told that its files are
/// in place and nothing changed, it finishes at once; told the prompt changed, it replaces
/// the one line the change needs with `edit_file`; from nothing it writes the file whole, as
/// the prompt of the moment asks. Each call reports the tokens it generated.
fn regenerate_answer(body: &Value) -> Option<Reply> {
    let messages = body["messages"].as_array()?;
    let first = !messages.iter().any(|m| m["role"] == "assistant");
    let system = system_of(body);
    let by_edit = system.contains("This task was done before");
    let finish = Turn::call("finish", json!({"summary": "done"})).tokens(100, 3);
    let turn = match (first, by_edit) {
        (false, _) => finish,
        (true, true) if system.contains("nothing it depends on changed") => finish,
        (true, true) => {
            Turn::call("edit_file", json!({"path": "a.rs", "old": "\"a\"", "new": "\"a1\""})).tokens(100, 12)
        }
        (true, false) => {
            let content = if body.to_string().contains("returning \\\"a1\\\"") { A_REWRITTEN } else { A_RECORDED };
            Turn::call("write_file", json!({"path": "a.rs", "content": content})).tokens(100, 80)
        }
    };
    Some(Reply::turn(turn))
}

/// The chat requests' bodies, whatever else a backend asks its server.
fn chats(requests: &[RecordedRequest]) -> Vec<Value> {
    requests.iter().filter(|r| r.path.ends_with("/chat")).map(RecordedRequest::json).collect()
}

fn sha256(text: &str) -> String {
    cargo_promptgen::__private::sha256_hex(text.as_bytes())
}

#[test]
fn trials_by_edit_and_fresh_are_rows_of_their_own_with_their_diff_from_the_recorded_file_and_their_tokens() {
    let server = FakeLlm::start(Vec::new());
    server.respond_with(regenerate_answer);
    let package = Package::lettered(REGENERATE_ONE_STEP, 1);
    let trials_by_name = |run: &str| -> Vec<(String, Value)> {
        let mut trials: Vec<(String, Value)> =
            trials_of_run(run).into_iter().map(|t| (t["trial"].as_str().unwrap().to_string(), t)).collect();
        trials.sort_by(|a, b| a.0.cmp(&b.0));
        trials
    };

    // 1. Nothing recorded: a trial by edit starts from nothing, its record and the run say so,
    //    and its diff is against an empty tree (the three lines it wrote).
    let out =
        promptgen_offline(&package, &server, &["eval", "--regenerate", "edit", "--seeds", "1", "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let said = stderr(&out);
    assert!(said.contains("  01 · fake-coder · by edit (nothing recorded: from nothing) · seed 1: passed"), "{said}");
    assert!(
        said.contains("warning: step 01 has no recorded outputs: its trials by edit started from nothing"),
        "{said}"
    );
    let summary = json_of(&out);
    let edit = &summary["rows"][0];
    assert_eq!((edit["variant"].as_str(), edit["regenerate"].as_str()), (Some("fake-coder · by edit"), Some("edit")));
    assert_eq!(edit["mean_diff_lines"], 3.0, "{edit:#}");
    let trials = trials_by_name(summary["run"].as_str().unwrap());
    assert_eq!(trials.len(), 1);
    assert_eq!(trials[0].0, "01.m0.edit.s1");
    assert_eq!((&trials[0].1["regenerate"], &trials[0].1["made_from"]), (&json!("edit"), &json!([])));
    assert!(!system_of(&chats(&server.requests())[0]).contains("This task was done before"));

    // 2. Recorded, and nothing changed since: a trial by edit starts from the recorded file,
    //    is told nothing changed, and finishes without an edit: no diff, three tokens.
    let out = promptgen_offline(&package, &server, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(package.read("promptgen/01/a.rs"), A_RECORDED);
    let before = snapshot(package.dir.path());
    let requests = server.requests().len();
    let out =
        promptgen_offline(&package, &server, &["eval", "--regenerate", "edit", "--seeds", "1", "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!stderr(&out).contains("no recorded outputs"), "{}", text(&out));
    let sent = chats(&server.requests()[requests..]);
    assert_eq!(sent.len(), 1, "a finish and nothing else: {sent:?}");
    let told = system_of(&sent[0]);
    assert!(
        told.contains(
            "This task was done before: its files are in place as that run made them: a.rs (3 lines). Since \
                       then, nothing it depends on changed."
        ),
        "{told}"
    );
    let summary = json_of(&out);
    let edit = &summary["rows"][0];
    assert_eq!((edit["passed"].as_u64(), edit["mean_diff_lines"].as_f64()), (Some(1), Some(0.0)), "{edit:#}");
    assert_eq!(edit["mean_generated_tokens"], 3.0, "{edit:#}");
    let trials = trials_by_name(summary["run"].as_str().unwrap());
    assert_eq!(trials[0].1["made_from"], json!([{"path": "a.rs", "sha256": sha256(A_RECORDED)}]));
    assert_eq!(trials[0].1["diff_lines"], 0);

    // 3. The prompt changed: two rows, by edit and fresh, two seeds each. Trials by edit are
    //    told why and replace one line (diff 2); fresh ones write the file whole (diff 3).
    package.write("prompts/01.md", PROMPT_A1);
    let before_prompt_change = before;
    let before = snapshot(package.dir.path());
    let requests = server.requests().len();
    let out = promptgen_offline(
        &package,
        &server,
        &["eval", "--regenerate", "edit,fresh", "--seeds", "2", "--format", "json"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let said = stderr(&out);
    assert!(said.contains("  01 · fake-coder · by edit · seed 2: passed (2 calls, 215 tokens,"), "{said}");
    assert!(said.contains(", diff 2 lines)") && said.contains(", diff 3 lines)"), "{said}");
    let summary = json_of(&out);
    let rows = summary["rows"].as_array().unwrap();
    let shown: Vec<(&str, &str, u64, u64, f64, f64)> = rows
        .iter()
        .map(|r| {
            (
                r["variant"].as_str().unwrap(),
                r["regenerate"].as_str().unwrap(),
                r["trials"].as_u64().unwrap(),
                r["passed"].as_u64().unwrap(),
                r["mean_diff_lines"].as_f64().unwrap(),
                r["mean_generated_tokens"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [("fake-coder · by edit", "edit", 2, 2, 2.0, 15.0), ("fake-coder · fresh", "fresh", 2, 2, 3.0, 83.0)],
        "{summary:#}"
    );
    assert!(rows.iter().all(|r| r.get("protocol").is_none() && r.get("constrain").is_none()), "{summary:#}");

    // Each trial's first request: by edit, told the files are in place and the prompt's diff;
    // fresh, told nothing of them. One of each per seed.
    let firsts: Vec<Value> = chats(&server.requests()[requests..])
        .into_iter()
        .filter(|b| b["messages"].as_array().is_some_and(|m| m.iter().all(|m| m["role"] != "assistant")))
        .collect();
    assert_eq!(firsts.len(), 4);
    for seed in [1, 2] {
        let of_seed: Vec<&Value> = firsts.iter().filter(|b| b["options"]["seed"] == seed).collect();
        let (edit, fresh): (Vec<&Value>, Vec<&Value>) =
            of_seed.iter().partition(|b| system_of(b).contains("This task was done before"));
        assert_eq!((edit.len(), fresh.len()), (1, 1), "seed {seed}: {of_seed:?}");
        let told = system_of(edit[0]);
        assert!(told.contains("Since then, prompt `prompts/01.md` changed."), "{told}");
        assert!(told.contains("-Write a.rs with fn a.\n+Write a.rs with fn a returning \"a1\".\n"), "{told}");
    }

    // The records: each trial by its variant, what it started from, its diff, its tree.
    let run = summary["run"].as_str().unwrap().to_string();
    let trials = trials_by_name(&run);
    let names: Vec<&str> = trials.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["01.m0.edit.s1", "01.m0.edit.s2", "01.m0.fresh.s1", "01.m0.fresh.s2"]);
    for (name, trial) in &trials {
        let by_edit = name.contains(".edit.");
        let (regenerate, diff, made_from, ended) = if by_edit {
            ("edit", 2, json!([{"path": "a.rs", "sha256": sha256(A_RECORDED)}]), A_EDITED)
        } else {
            ("fresh", 3, json!([]), A_REWRITTEN)
        };
        assert_eq!(
            (&trial["regenerate"], &trial["diff_lines"], &trial["made_from"], &trial["completion_tokens"]),
            (&json!(regenerate), &json!(diff), &made_from, &json!(if by_edit { 15 } else { 83 })),
            "{trial:#}"
        );
        assert_eq!(trial["files"], json!([{"path": "a.rs", "sha256": sha256(ended)}]), "{trial:#}");
        let tree = support::shared_target().join("promptgen/eval").join(&run).join("trees").join(name);
        assert_eq!(std::fs::read_to_string(tree.join("a.rs")).unwrap(), ended);
    }

    // The tables: `generated` and `diff lines` after `tokens`; a resumed run keeps its variants.
    let requests = server.requests().len();
    let out = promptgen_offline(&package, &server, &["eval", "--resume", &run, "--format", "md"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.requests().len(), requests, "a finished run has nothing left to run");
    let md = stdout(&out);
    assert!(md.contains("| calls | tokens | generated | diff lines | wall p50/p95 |"), "{md}");
    let line = |label: &str| {
        md.lines().find(|l| l.starts_with(&format!("| 01 | {label} |"))).unwrap_or_else(|| panic!("{md}"))
    };
    assert!(line("fake-coder · by edit").contains("| 2 | 215 | 15 | 2 |"), "{md}");
    assert!(line("fake-coder · fresh").contains("| 2 | 283 | 83 | 3 |"), "{md}");
    let out = promptgen_offline(&package, &server, &["eval", "--resume", &run, "--format", "junit"]);
    let junit = stdout(&out);
    assert!(
        junit.contains("<testsuite name=\"step 01 · fake-coder · by edit\" tests=\"2\" failures=\"0\">"),
        "{junit}"
    );
    assert!(junit.contains("<property name=\"diff lines\" value=\"3\"/>"), "{junit}");

    // eval recorded nothing: the lock and the store are as the run left them.
    assert_eq!(changes(&before, &snapshot(package.dir.path())), Vec::<String>::new());
    assert_eq!(
        changes(&before_prompt_change, &snapshot(package.dir.path())),
        ["changed prompts/01.md".to_string()],
        "only the prompt changed since the chain was recorded"
    );
}
