//! What the loop sends back to the model: a file the model wrote is not echoed back to it.

use codegen_core::backend::scripted::Scripted;
use codegen_core::chat::{Message, Role};
use codegen_core::sandbox::Sandbox;
use codegen_core::transcript::Event;
use codegen_core::{Step, ToolProtocol};

const CONTENT: &str =
    "pub fn long_enough_to_notice() -> &'static str {\n    \"a file the model has just written\"\n}\n";

fn user_turns_after_a_text_write(protocol: ToolProtocol) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let write = serde_json::json!({"tool": "write_file", "arguments": {"path": "a.rs", "content": CONTENT}});
    let finish = serde_json::json!({"tool": "finish", "arguments": {"summary": "Wrote a.rs."}});
    let mut backend = Scripted::from_turns(
        "in-memory",
        vec![Message::assistant(write.to_string(), Vec::new()), Message::assistant(finish.to_string(), Vec::new())],
    );
    let mut sandbox = Sandbox::builder(dir.path().join("out")).build().unwrap();
    let mut step = Step::new("scripted", "Write a.rs.");
    step.protocol(protocol);
    let output = step.run(&mut backend, &mut sandbox).unwrap();
    assert_eq!(std::fs::read_to_string(dir.path().join("out/a.rs")).unwrap(), CONTENT);
    output
        .transcript
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Message { index, message } if *index > 1 && message.role == Role::User => {
                Some(message.content.clone())
            }
            _ => None,
        })
        .collect()
}

#[test]
fn the_result_of_a_write_names_the_file_without_sending_it_back() {
    // The `json` protocol, and a `native` step whose model writes its calls as text.
    for protocol in [ToolProtocol::Json, ToolProtocol::Native] {
        let turns = user_turns_after_a_text_write(protocol);
        let result =
            turns.iter().find(|t| t.starts_with("Result of write_file")).unwrap_or_else(|| panic!("{turns:?}"));
        assert!(result.contains(r#"{"path":"a.rs"}"#), "{result}");
        assert!(result.contains("a.rs: written"), "{result}");
        assert!(!result.contains("long_enough_to_notice"), "the written file came back: {result}");
    }
}
