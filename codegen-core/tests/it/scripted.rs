//! The scripted backend: canned turns from TOML or JSON files, honest about what it is.

use codegen_core::backend::scripted::{ScriptPart, Scripted};
use codegen_core::backend::{BackendConfig, BackendError, BackendKind};
use codegen_core::sandbox::Sandbox;
use codegen_core::transcript::Event;
use codegen_core::{Error, Step};

const TOML_SCRIPT: &str = r#"
[[turn]]
content = "Reading the view first."
[[turn.call]]
name = "read_file"
arguments = { path = "view.rs" }

[[turn]]
[[turn.call]]
name = "write_file"
[turn.call.arguments]
path = "presenter.rs"
content = '''
pub struct Presenter;
'''

[[turn]]
[[turn.call]]
id = "call_done"
name = "finish"
arguments = { summary = "Wrote presenter.rs." }
"#;

#[test]
fn a_toml_script_drives_a_step_and_says_it_is_a_script() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("step.toml");
    std::fs::write(&script, TOML_SCRIPT).unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("view.rs"), "pub trait View {}\n").unwrap();

    let mut config = BackendConfig::new(BackendKind::Scripted);
    config.script = Some(script.clone());
    let mut backend = config.open().unwrap();
    assert_eq!(backend.kind(), BackendKind::Scripted);
    assert!(backend.location().contains("script") && backend.location().contains("step.toml"));

    let mut sandbox = Sandbox::builder(&out).build().unwrap();
    let output = Step::new("scripted", "Write presenter.rs.").run(backend.as_mut(), &mut sandbox).unwrap();
    assert_eq!(std::fs::read_to_string(out.join("presenter.rs")).unwrap(), "pub struct Presenter;\n");
    assert_eq!(output.summary.as_deref(), Some("Wrote presenter.rs."));
    let totals = output.transcript.totals();
    assert_eq!(
        (totals.model_calls, totals.prompt_tokens, totals.completion_tokens),
        (3, 0, 0),
        "a script reports no tokens"
    );
    assert!(matches!(&output.transcript.events[0], Event::Start { backend: BackendKind::Scripted, .. }));
    // The read went through the sandbox: its result is the file's real content.
    let read_result = output.transcript.messages().find(|m| m.tool_name.as_deref() == Some("read_file")).unwrap();
    assert_eq!(read_result.content, "pub trait View {}\n");
}

#[test]
fn a_json_script_is_read_too() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("s.json");
    std::fs::write(&script, r#"{"turn": [{"content": "@@@done(nothing to do)"}]}"#).unwrap();
    let mut backend = Scripted::from_file(&script).unwrap();
    assert_eq!(backend.remaining(), 1);
    let mut sandbox = Sandbox::builder(dir.path().join("out")).build().unwrap();
    let mut step = Step::new("scripted", "Nothing.");
    step.protocol(codegen_core::ToolProtocol::Blocks);
    let output = step.run(&mut backend, &mut sandbox).unwrap();
    assert_eq!(output.summary.as_deref(), Some("nothing to do"));
}

#[test]
fn running_out_of_turns_says_where_the_step_went_off_script() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("short.toml");
    std::fs::write(&script, "[[turn]]\n[[turn.call]]\nname = \"list_files\"\n").unwrap();
    let mut backend = Scripted::from_file(&script).unwrap();
    let mut sandbox = Sandbox::builder(dir.path().join("out")).build().unwrap();
    let failure = Step::new("scripted", "x").run(&mut backend, &mut sandbox).unwrap_err();
    assert!(
        matches!(failure.error, Error::Backend(BackendError::ScriptExhausted { turns: 1, .. })),
        "{:?}",
        failure.error
    );
    let text = failure.to_string();
    assert!(text.contains("short.toml") && text.contains("has 1 turns"), "{text}");
}

#[test]
fn broken_scripts_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("typo.toml", "[[turn]]\ncontnet = \"x\"\n", "unknown field `contnet`"),
        ("empty.toml", "", "no turns"),
        ("bad.json", "{\"turn\": [", "not a valid script"),
        ("no-edit-turns.toml", "[[turn]]\ncontent = \"x\"\n[edit]\n", "`edit` table has no turns"),
    ];
    for (name, text, expected) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let err = Scripted::from_file(&path).unwrap_err();
        assert!(err.to_string().contains(expected) && err.to_string().contains(name), "{name}: {err}");
    }
    let err = Scripted::from_file(&dir.path().join("missing.toml")).unwrap_err();
    assert!(err.to_string().contains("missing.toml") && err.to_string().contains("failed to read file"), "{err}");

    let err = BackendConfig::new(BackendKind::Scripted).open().err().unwrap();
    assert!(err.to_string().contains("needs a script file"), "{err}");
}

#[test]
fn a_re_run_by_edit_is_answered_from_the_edit_turns_and_a_script_without_them_serves_its_turns() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("step.toml");
    let edit_turns = r#"
[[edit.turn]]
[[edit.turn.call]]
name = "edit_file"
arguments = { path = "presenter.rs", old = "Presenter;", new = "Presenter(u8);" }

[[edit.turn]]
[[edit.turn.call]]
name = "finish"
arguments = { summary = "Edited presenter.rs." }
"#;
    std::fs::write(&script, format!("{TOML_SCRIPT}{edit_turns}")).unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("presenter.rs"), "pub struct Presenter;\n").unwrap();

    let mut config = BackendConfig::new(BackendKind::Scripted);
    config.script = Some(script.clone());
    assert_eq!(Scripted::from_file(&script).unwrap().remaining(), 3, "a run from nothing gets the turns");
    let mut backend = config.open_for_edit().unwrap();
    let mut sandbox = Sandbox::builder(&out).build().unwrap();
    let mut step = Step::new("scripted", "Change presenter.rs.");
    step.expect_output("presenter.rs");
    let output = step.run(backend.as_mut(), &mut sandbox).unwrap();
    assert_eq!(std::fs::read_to_string(out.join("presenter.rs")).unwrap(), "pub struct Presenter(u8);\n");
    assert_eq!(output.summary.as_deref(), Some("Edited presenter.rs."));

    // Without edit turns, a re-run by edit gets the script's turns.
    std::fs::write(&script, TOML_SCRIPT).unwrap();
    assert_eq!(Scripted::from_file_part(&script, ScriptPart::Edit).unwrap().remaining(), 3);
}
