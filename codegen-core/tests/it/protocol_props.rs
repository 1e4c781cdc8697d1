//! Properties of the text protocols: they never panic on what a model says, and what we
//! render (or a JSON serialiser writes) reads back exactly.

use codegen_core::__private::protocol::blocks::{BlockCommand, parse_blocks, render_refusal, render_result};
use codegen_core::__private::protocol::text::{TextCall, TextCalls, calls_in_text};
use codegen_core::chat::Arguments;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// Pieces that exercise the parsers' special cases.
fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "{", "}", "[", "]", "\"", "\\", ":", ",", "\n", "\r\n", " ", "`", "```", "```json", "```json\n",
            "```rust\n", "\n```\n", "````", "<tool_call>", "</tool_call>", "<TOOL_CALL>", "@@@", "@@@write_begin(",
            "@@@write_end", "@@@read(", "@@@list(", "@@@done", ")", "(", "\"name\"", "\"tool\"", "\"arguments\"",
            "\"parameters\"", "\"tool_calls\"", "\"tool_call\"", "\"function\"", "\"write_file\"", "\"finish\"",
            "\"response\"", "null", "1", "é", "🦀", "\u{0}", "\u{2028}", "\t",
        ])
        .prop_map(str::to_owned),
        1 => any::<String>(),
        1 => "[a-z_ ]{0,8}",
    ]
}

fn fragments() -> impl Strategy<Value = String> {
    prop::collection::vec(fragment(), 0..60).prop_map(|parts| parts.concat())
}

/// A relative path made of safe characters.
fn path() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9_][a-zA-Z0-9_./-]{0,30}"
}

/// A line of file content that the blocks protocol carries verbatim: anything without a line
/// break that does not start (after indentation) with `@@@` and is not a ``` fence line.
fn content_line() -> impl Strategy<Value = String> {
    prop_oneof![any::<String>(), "[ \t]{0,4}[a-z{}();\"\\\\@`]{0,20}", Just(String::new())]
        .prop_map(|line| line.replace(['\n', '\r'], " "))
        .prop_filter("commands and fences are not plain content", |line| {
            !line.trim_start().starts_with("@@@") && !line.trim().starts_with("```")
        })
}

fn arguments() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map("[a-z_]{1,10}", prop_oneof![any::<String>(), fragments()], 0..5)
        .prop_map(|map| map.into_iter().map(|(k, v)| (k, Value::String(v))).collect())
}

fn tool_name() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec!["read_file", "write_file", "list_files", "finish"]).prop_map(str::to_owned),
        "[a-z][a-z_]{0,19}",
    ]
}

/// Prose that holds no brace, bracket, backtick, tag or `@@@`.
fn prose() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 .,!?\n]{0,60}"
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn nothing_panics_on_arbitrary_strings(text in any::<String>()) {
        let _ = calls_in_text(&text);
        let _ = parse_blocks(&text);
        let _ = render_result(&text, &text);
        let _ = render_refusal(&text, &text, &text);
    }

    #[test]
    fn nothing_panics_on_fragments(text in fragments()) {
        let _ = calls_in_text(&text);
        let reply = parse_blocks(&text);
        for command in &reply.commands {
            let _ = command.label();
        }
    }

    #[test]
    fn a_write_block_reads_back(path in path(), lines in prop::collection::vec(content_line(), 0..20),
                                before in prose(), after in prose()) {
        let rendered = format!(
            "{before}\n@@@write_begin({path})\n{}@@@write_end\n{after}",
            lines.iter().map(|line| format!("{line}\n")).collect::<String>()
        );
        let reply = parse_blocks(&rendered);
        let content: String = lines.iter().map(|line| format!("{line}\n")).collect();
        prop_assert_eq!(reply.problems, Vec::<String>::new());
        prop_assert_eq!(reply.commands, vec![BlockCommand::Write { path, content }]);
    }

    #[test]
    fn other_commands_read_back(path in path(), summary in "[a-zA-Z0-9 .,()]{0,40}") {
        let reply = parse_blocks(&format!("@@@read({path})\n@@@list({path})\n@@@list()\n@@@done({summary})"));
        prop_assert_eq!(reply.problems, Vec::<String>::new());
        prop_assert_eq!(reply.commands, vec![
            BlockCommand::Read { path: path.clone() },
            BlockCommand::List { dir: Some(path) },
            BlockCommand::List { dir: None },
            BlockCommand::Done { summary: summary.trim().to_owned() },
        ]);
    }

    #[test]
    fn a_serialised_call_reads_back(name in tool_name(), args in arguments(), key in prop::sample::select(vec!["name", "tool"]),
                                    before in prose(), after in prose()) {
        let mut object = Map::new();
        object.insert(key.to_owned(), Value::String(name.clone()));
        object.insert("arguments".to_owned(), Value::Object(args.clone()));
        let json = serde_json::to_string(&Value::Object(object)).expect("a map serialises");
        let pretty = serde_json::to_string_pretty(&json!({"name": name, "arguments": args})).expect("serialises");
        let expected = TextCalls::Found(vec![TextCall { name: name.clone(), arguments: Arguments::Object(args.clone()) }]);

        for text in [
            json.clone(),
            format!("{before}\n{json}\n{after}"),
            format!("```json\n{json}\n```"),
            format!("{before}\n```json\n{pretty}\n```\n{after}"),
            format!("```\n{json}\n```"),
            format!("<tool_call>\n{json}\n</tool_call>"),
            format!("{before}<tool_call>{pretty}</tool_call>{after}"),
        ] {
            prop_assert_eq!(calls_in_text(&text), expected.clone(), "{}", text);
        }
    }

    #[test]
    fn arguments_as_json_text_read_back(name in tool_name(), args in arguments()) {
        let inner = serde_json::to_string(&args).expect("serialises");
        let text = serde_json::to_string(&json!({"function": {"name": name, "arguments": inner}})).expect("serialises");
        prop_assert_eq!(
            calls_in_text(&text),
            TextCalls::Found(vec![TextCall { name, arguments: Arguments::Object(args) }])
        );
    }

    #[test]
    fn several_calls_keep_their_order(calls in prop::collection::vec((tool_name(), arguments()), 1..5)) {
        let values: Vec<Value> = calls.iter().map(|(name, args)| json!({"tool": name, "arguments": args})).collect();
        let expected = TextCalls::Found(
            calls.iter().map(|(name, args)| TextCall { name: name.clone(), arguments: Arguments::Object(args.clone()) }).collect(),
        );
        let array = serde_json::to_string(&values).expect("serialises");
        prop_assert_eq!(calls_in_text(&array), expected.clone());
        let tags: String = values.iter().map(|v| format!("<tool_call>\n{v}\n</tool_call>\n")).collect();
        prop_assert_eq!(calls_in_text(&tags), expected.clone());
        let fences: String = values.iter().map(|v| format!("Next:\n```json\n{v}\n```\n")).collect();
        prop_assert_eq!(calls_in_text(&fences), expected.clone());
        let wrapped = json!({"tool_calls": calls.iter().map(|(name, args)| json!({"type": "function", "function": {"name": name, "arguments": args.clone()}})).collect::<Vec<_>>()});
        prop_assert_eq!(calls_in_text(&wrapped.to_string()), expected);
    }

    #[test]
    fn prose_is_not_a_call(text in prose()) {
        prop_assert_eq!(calls_in_text(&text), TextCalls::None);
        let reply = parse_blocks(&text);
        prop_assert!(reply.commands.is_empty() && reply.problems.is_empty());
        prop_assert_eq!(reply.text, text.trim());
    }
}
