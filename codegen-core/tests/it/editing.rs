//! `edit_file`: exact, unique replacements in a step's files, in every protocol, through the
//! real backends and the fake server; what is refused and what the model is told; repairs by
//! edit after a failed check; and the constraint that admits an edit once its file exists.

use std::path::Path;

use codegen_core::backend::{Backend, BackendKind};
use codegen_core::check::{Check, CheckError, CheckOutcome, Diagnostics, Finding, Findings};
use codegen_core::sandbox::Sandbox;
use codegen_core::transcript::{Event, Transcript};
use codegen_core::{Step, StepOutput, ToolProtocol};
use promptgen_tests::{FakeLlm, Identity, Reply, Turn};
use serde_json::{Value, json};

use crate::support::fake_server_config;

/// A recorded `a.rs` of 300 lines: the file a re-run by edit starts from.
fn recorded() -> String {
    let mut text = String::from("pub fn greet(name: &str) -> String {\n    format!(\"Hello, {name}!\")\n}\n");
    for i in 0..297 {
        text.push_str(&format!("pub const LINE_{i}: u32 = {i};\n"));
    }
    text
}

struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    /// An output root holding `a.rs` as recorded, and an input `spec.md` beside it.
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("out")).unwrap();
        std::fs::write(dir.path().join("out/a.rs"), recorded()).unwrap();
        std::fs::write(dir.path().join("spec.md"), "Greet by name.\n").unwrap();
        Setup { dir }
    }

    fn sandbox(&self) -> Sandbox {
        Sandbox::builder(self.dir.path().join("out")).input("spec.md", self.dir.path().join("spec.md")).build().unwrap()
    }

    fn read(&self, path: &str) -> String {
        std::fs::read_to_string(self.dir.path().join("out").join(path)).unwrap()
    }
}

fn backend(kind: BackendKind, server: &FakeLlm) -> Box<dyn Backend> {
    fake_server_config(kind, server).open().unwrap()
}

fn step(protocol: ToolProtocol) -> Step {
    let mut step = Step::new("m", "Greet with a comma.");
    step.protocol(protocol).expect_output("a.rs").max_model_calls(6);
    step
}

fn run(server: &FakeLlm, setup: &Setup, step: &Step) -> StepOutput {
    step.run(backend(BackendKind::OpenAi, server).as_mut(), &mut setup.sandbox()).unwrap()
}

fn edit(path: &str, old: &str, new: &str) -> Reply {
    Reply::turn(Turn::call("edit_file", json!({"path": path, "old": old, "new": new})))
}

fn finish() -> Reply {
    Reply::turn(Turn::call("finish", json!({"summary": "Changed the greeting."})))
}

/// The tool result sent back for the call of reply `n` (1-based), in the next request.
fn answer(server: &FakeLlm, n: usize) -> String {
    let messages = server.requests()[n].json()["messages"].as_array().unwrap().clone();
    messages.last().unwrap()["content"].as_str().unwrap().to_owned()
}

/// Which tool runs succeeded, in order.
fn runs(output: &StepOutput) -> Vec<(String, bool)> {
    runs_in(&output.transcript)
}

fn runs_in(transcript: &Transcript) -> Vec<(String, bool)> {
    transcript
        .events
        .iter()
        .filter_map(|e| match e {
            Event::ToolRun { tool, ok, .. } => Some((tool.clone(), *ok)),
            _ => None,
        })
        .collect()
}

const OLD: &str = "    format!(\"Hello, {name}!\")";
const NEW: &str = "    format!(\"Hello, {name}, welcome!\")";

#[test]
fn a_unique_match_changes_those_lines_and_keeps_every_other_byte() {
    let setup = Setup::new();
    let server = FakeLlm::start(vec![edit("a.rs", OLD, NEW), finish()]);
    let output = run(&server, &setup, &step(ToolProtocol::Native));
    assert_eq!(output.written, ["a.rs"]);
    assert_eq!(setup.read("a.rs"), recorded().replace(OLD, NEW));
    assert_eq!(answer(&server, 1), format!("a.rs: edited at line 2, now {} bytes.", recorded().len() + 9));
    // The edit goes back to the model without its text, which it has just sent.
    let call = &server.requests()[1].json()["messages"][2]["tool_calls"][0]["function"]["arguments"];
    assert!(call.as_str().unwrap().contains("welcome"), "the call itself is kept: {call}");
    assert_eq!(runs(&output), [("edit_file".to_owned(), true), ("finish".to_owned(), true)]);
}

#[test]
fn several_matches_are_refused_with_the_line_of_each_and_nothing_changes() {
    let setup = Setup::new();
    let server = FakeLlm::start(vec![
        edit("a.rs", "u32 = 1", "u32 = 100"),
        edit("a.rs", "LINE_1: u32 = 1;", "LINE_1: u32 = 100;"),
        finish(),
    ]);
    let output = run(&server, &setup, &step(ToolProtocol::Native));
    let refused = answer(&server, 1);
    // `u32 = 1` starts `LINE_1`, `LINE_10`..`LINE_19`, `LINE_100`..: lines 5, 14.., 104...
    assert!(refused.starts_with("`a.rs`: `old` matches 111 places (lines 5, 14, 15, 16,"), "{refused}");
    assert!(refused.contains("and 91 more") && refused.contains("The file was not changed."), "{refused}");
    assert_eq!(setup.read("a.rs"), recorded().replace("LINE_1: u32 = 1;", "LINE_1: u32 = 100;"));
    assert_eq!(runs(&output)[0], ("edit_file".to_owned(), false));
    assert_eq!(output.transcript.repairs().count(), 1);
}

#[test]
fn no_match_names_the_nearest_lines_and_a_whitespace_only_difference_is_accepted_and_said() {
    let setup = Setup::new();
    let server = FakeLlm::start(vec![
        edit("a.rs", "    format!(\"Hallo, {name}!\")\n}", NEW),
        // Trailing spaces and CRLF the file does not have.
        edit(
            "a.rs",
            "pub fn greet(name: &str) -> String {   \r\n    format!(\"Hello, {name}!\")",
            &format!("pub fn greet(name: &str) -> String {{\n{NEW}"),
        ),
        finish(),
    ]);
    let output = run(&server, &setup, &step(ToolProtocol::Native));
    let missing = answer(&server, 1);
    assert!(
        missing.contains("matches nothing in the file; the lines nearest to its first line `format!(\"Hallo, {name}!\")` are line 2: `format!(\"Hello, {name}!\")`"),
        "{missing}"
    );
    let loose = answer(&server, 2);
    assert!(
        loose.starts_with("a.rs: edited at line 1") && loose.contains("matched only once trailing whitespace"),
        "{loose}"
    );
    assert_eq!(setup.read("a.rs"), recorded().replace(OLD, NEW));
    assert_eq!(output.written, ["a.rs"]);
}

#[test]
fn an_undeclared_file_an_input_a_missing_file_and_an_escape_are_refused() {
    let setup = Setup::new();
    std::fs::write(setup.dir.path().join("out/other.rs"), "fn other() {}\n").unwrap();
    let server = FakeLlm::start(vec![
        edit("other.rs", "fn other", "fn changed"),
        edit("spec.md", "Greet", "Shout"),
        edit("../a.rs", OLD, NEW),
        edit("b.rs", "x", "y"),
        finish(),
    ]);
    let mut step = step(ToolProtocol::Native);
    step.expect_output("b.rs").max_model_calls(5);
    let failure = step.run(backend(BackendKind::OpenAi, &server).as_mut(), &mut setup.sandbox()).unwrap_err();
    assert!(failure.to_string().contains("still missing: b.rs"), "{failure}");
    assert!(answer(&server, 1).contains("`other.rs` is not one of the files this step writes, and was not changed"));
    assert!(answer(&server, 2).contains("`spec.md` is not one of the files"), "{}", answer(&server, 2));
    assert!(answer(&server, 3).contains(".."), "{}", answer(&server, 3));
    assert!(
        answer(&server, 4).contains("`b.rs`: does not exist yet, so it cannot be edited; write it whole"),
        "{}",
        answer(&server, 4)
    );
    assert_eq!(std::fs::read_to_string(setup.dir.path().join("out/other.rs")).unwrap(), "fn other() {}\n");
    assert_eq!(std::fs::read_to_string(setup.dir.path().join("spec.md")).unwrap(), "Greet by name.\n");
    assert_eq!(setup.read("a.rs"), recorded());
    assert!(runs_in(&failure.transcript).iter().take(4).all(|(tool, ok)| tool == "edit_file" && !ok));

    // A step that declares nothing still may not edit an input.
    let server = FakeLlm::start(vec![edit("spec.md", "Greet", "Shout"), finish()]);
    let mut open = Step::new("m", "Edit.");
    open.max_model_calls(3);
    open.run(backend(BackendKind::OpenAi, &server).as_mut(), &mut setup.sandbox()).unwrap();
    assert!(answer(&server, 1).contains("`spec.md`: is a read-only input"), "{}", answer(&server, 1));
}

#[test]
fn the_json_protocol_edits_through_a_call_in_text() {
    let setup = Setup::new();
    let call = json!({"tool": "edit_file", "arguments": {"path": "a.rs", "old": OLD, "new": NEW}}).to_string();
    let server = FakeLlm::start(vec![
        Reply::turn(Turn::text(&call)),
        Reply::turn(Turn::text(r#"{"tool": "finish", "arguments": {"summary": "Done."}}"#)),
    ]);
    let output = run(&server, &setup, &step(ToolProtocol::Json));
    assert_eq!(setup.read("a.rs"), recorded().replace(OLD, NEW));
    let system = server.requests()[0].json()["messages"][0]["content"].as_str().unwrap().to_owned();
    assert!(system.contains("- edit_file {\"path\", \"old\", \"new\"}: replace old"), "{system}");
    // The result line names the call without the text it carried.
    assert!(
        answer(&server, 1).starts_with("Result of edit_file {\"path\":\"a.rs\"}:\na.rs: edited at line 2"),
        "{}",
        answer(&server, 1)
    );
    assert_eq!(runs(&output)[0], ("edit_file".to_owned(), true));
}

#[test]
fn the_blocks_protocol_edits_with_search_replace_pairs_all_or_none() {
    let setup = Setup::new();
    let two = "@@@edit_begin(a.rs)\n<<<<<<< SEARCH\npub const LINE_0: u32 = 0;\n=======\npub const LINE_0: u32 = 1000;\n>>>>>>> REPLACE\n\n<<<<<<< SEARCH\n    format!(\"Hello, {name}!\")\n=======\n    format!(\"Hello, {name}, welcome!\")\n>>>>>>> REPLACE\n@@@edit_end";
    let broken = "@@@edit_begin(a.rs)\n<<<<<<< SEARCH\npub const LINE_1: u32 = 1;\n=======\npub const LINE_1: u32 = 1001;\n>>>>>>> REPLACE\n<<<<<<< SEARCH\nnot in the file\n=======\nx\n>>>>>>> REPLACE\n@@@edit_end";
    let server = FakeLlm::start(vec![
        Reply::turn(Turn::text(broken)),
        Reply::turn(Turn::text(two)),
        Reply::turn(Turn::text("@@@done(Changed the greeting.)")),
    ]);
    let output = run(&server, &setup, &step(ToolProtocol::Blocks));
    let refused = answer(&server, 1);
    assert!(refused.starts_with("@@@result edit_begin(a.rs)\n"), "{refused}");
    assert!(
        refused.contains("the `old` of edit 2 of 2 matches nothing")
            && refused.contains("No edit of this call was applied"),
        "{refused}"
    );
    let expected = recorded().replace(OLD, NEW).replace("LINE_0: u32 = 0;", "LINE_0: u32 = 1000;");
    assert_eq!(setup.read("a.rs"), expected, "the first, failed call changed nothing");
    assert!(answer(&server, 2).contains("a.rs: edited at lines 4, 2"), "{}", answer(&server, 2));
    assert_eq!(runs(&output).iter().map(|(_, ok)| *ok).collect::<Vec<_>>(), [false, true, true]);
    let system = server.requests()[0].json()["messages"][0]["content"].as_str().unwrap().to_owned();
    assert!(system.contains("@@@edit_begin(path)") && system.contains(">>>>>>> REPLACE"), "{system}");
}

/// Fails until `a.rs` says "welcome", with a finding at a.rs line 2, as the crate check would.
struct Welcome;

impl Check for Welcome {
    fn name(&self) -> String {
        "cargo test".into()
    }

    fn run(&mut self, output_root: &Path) -> Result<CheckOutcome, CheckError> {
        let text = std::fs::read_to_string(output_root.join("a.rs")).unwrap_or_default();
        if text.contains("welcome") {
            return Ok(CheckOutcome::Passed);
        }
        let finding = Finding {
            code: None,
            message: "test greets_with_a_welcome failed".into(),
            file: Some("a.rs".into()),
            line: Some(2),
            column: Some(5),
            withheld: false,
        };
        Ok(CheckOutcome::Failed(Diagnostics {
            text: "test greets_with_a_welcome ... FAILED\n --> a.rs:2:5".into(),
            findings: Findings { errors: vec![finding], failed_tests: vec!["greets_with_a_welcome".into()] },
        }))
    }
}

#[test]
fn a_write_and_a_failed_check_in_one_step_are_repaired_by_an_edit_at_the_line_the_check_names() {
    let dir = tempfile::tempdir().unwrap();
    let first = recorded();
    let server = FakeLlm::start(vec![
        Reply::turn(Turn::call("write_file", json!({"path": "a.rs", "content": first}))),
        finish(),
        edit("a.rs", OLD, NEW),
        finish(),
    ]);
    let mut sandbox = Sandbox::builder(dir.path().join("out")).build().unwrap();
    let mut step = Step::new("m", "Write a.rs.");
    step.expect_output("a.rs");
    let output = step
        .run_checked(backend(BackendKind::OpenAi, &server).as_mut(), &mut sandbox, &mut Welcome, &mut |_| {})
        .unwrap();
    let repair = answer(&server, 2);
    assert!(repair.contains("The first error is at a.rs line 2: change the lines there with edit_file"), "{repair}");
    assert_eq!(std::fs::read_to_string(dir.path().join("out/a.rs")).unwrap(), first.replace(OLD, NEW));
    assert_eq!(output.transcript.totals().check_rounds, 1);
    // The repair generated the edit, not the file again.
    let sent: usize =
        server.requests()[3].json()["messages"][4]["tool_calls"][0]["function"]["arguments"].as_str().unwrap().len();
    assert!(sent * 20 < first.len(), "the edit call is {sent} bytes, the file {}", first.len());
}

/// The names a `json` grammar's root admits.
fn root_calls(grammar: &str) -> Vec<String> {
    grammar.lines().next().unwrap().trim_start_matches("root ::= ").split(" | ").map(str::to_owned).collect()
}

#[test]
fn the_constraint_admits_an_edit_once_its_file_exists_and_only_to_declared_outputs() {
    // llama-server takes a grammar: `json` is constrained by one.
    let dir = tempfile::tempdir().unwrap();
    let server = FakeLlm::start(vec![
        Reply::turn(Turn::text(
            &json!({"tool": "write_file", "arguments": {"path": "a.rs", "content": "fn a() {}\n"}}).to_string(),
        )),
        Reply::turn(Turn::text(&json!({"tool": "finish", "arguments": {"summary": "Done."}}).to_string())),
    ]);
    server.identify_as(Identity::LlamaServer);
    let mut sandbox = Sandbox::builder(dir.path().join("out")).build().unwrap();
    let mut fresh = step(ToolProtocol::Json);
    fresh.expect_output("b.rs");
    let _ = fresh.run(backend(BackendKind::OpenAi, &server).as_mut(), &mut sandbox);
    let grammar = |n: usize| server.requests()[n].json()["grammar"].as_str().unwrap().to_owned();
    assert_eq!(root_calls(&grammar(0)), ["call-write-file"], "nothing to edit yet");
    assert_eq!(root_calls(&grammar(1)), ["call-write-file", "call-edit-file", "call-read-file", "call-list-files"]);
    assert!(grammar(1).contains("editable ::= \"\\\"a.rs\\\"\"\n"), "only the output that exists: {}", grammar(1));

    // A re-run that starts from the recorded file may edit it from its first reply, in blocks too.
    let setup = Setup::new();
    let reply = "@@@edit_begin(a.rs)\n<<<<<<< SEARCH\n    format!(\"Hello, {name}!\")\n=======\n    format!(\"Hello, {name}, welcome!\")\n>>>>>>> REPLACE\n@@@edit_end";
    let server = FakeLlm::start(vec![Reply::turn(Turn::text(reply)), Reply::turn(Turn::text("@@@done(Done.)"))]);
    server.identify_as(Identity::LlamaServer);
    let output = run(&server, &setup, &step(ToolProtocol::Blocks));
    let first = server.requests()[0].json()["grammar"].as_str().unwrap().to_owned();
    assert!(first.starts_with("root ::= write | edit | read | list | done\n"), "{first}");
    assert!(first.contains("edit ::= \"@@@edit_begin(\" editable \")\\n<<<<<<< SEARCH\\n\" old"), "{first}");
    assert_eq!(setup.read("a.rs"), recorded().replace(OLD, NEW));
    assert_eq!(runs(&output)[0], ("edit_file".to_owned(), true));
    // An edit is not a whole write: the step may go on editing (only `finish` is not forced).
    assert!(server.requests()[1].json()["grammar"].as_str().unwrap().starts_with("root ::= write | edit |"));
}

#[test]
fn native_tools_offer_edit_file_with_its_schema() {
    let setup = Setup::new();
    let server = FakeLlm::start(vec![edit("a.rs", OLD, NEW), finish()]);
    run(&server, &setup, &step(ToolProtocol::Native));
    let tools: Vec<Value> = server.requests()[0].json()["tools"].as_array().unwrap().clone();
    let edit = tools.iter().find(|t| t["function"]["name"] == "edit_file").unwrap();
    assert_eq!(edit["function"]["parameters"]["required"], json!(["path", "old", "new"]));
}
