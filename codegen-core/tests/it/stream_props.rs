//! Properties of the stream decoders: whatever the server sends, however the bytes are split
//! into network pieces, the decoder does not panic and comes to the same result; and a stream
//! rendered from a reply decodes to that reply.

use codegen_core::__private::stream::{AssembledCall, AssembledReply, Decoder, StreamError};
use codegen_core::backend::{PromptCache, Usage};
use codegen_core::chat::Arguments;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// Feeds `bytes` cut at `cuts` (positions, taken modulo the length) and finishes.
fn decode(mut decoder: Decoder, bytes: &[u8], cuts: &[usize]) -> Result<AssembledReply, StreamError> {
    let mut positions: Vec<usize> = cuts.iter().map(|cut| cut % (bytes.len() + 1)).collect();
    positions.push(0);
    positions.push(bytes.len());
    positions.sort_unstable();
    for pair in positions.windows(2) {
        let _ = decoder.push(&bytes[pair[0]..pair[1]]);
        // Reporting progress between pieces changes nothing.
        let _ = decoder.progress(std::time::Duration::ZERO);
    }
    decoder.finish()
}

fn decoders() -> [fn() -> Decoder; 2] {
    [Decoder::ollama, Decoder::openai]
}

/// Pieces of both framings and their special cases.
fn fragment() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "data: ", "data:", "data: [DONE]", "[DONE]", "event: error", "error: ", ": keep-alive", "id: 1", "\n", "\r\n",
            "\r", "\n\n", "{", "}", "[", "]", "\"", ":", ",", "null", "true", "0", "-1", "1e400", "\"choices\"",
            "\"delta\"", "\"content\"", "\"tool_calls\"", "\"index\"", "\"id\"", "\"function\"", "\"name\"",
            "\"arguments\"", "\"finish_reason\"", "\"usage\"", "\"prompt_tokens\"", "\"message\"", "\"done\"",
            "\"done_reason\"", "\"eval_count\"", "\"error\"", "\"system_fingerprint\"", "é", "🦀", "\u{feff}",
            r#"{"choices":[{"index":0,"delta":{"content":"hi"}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"w","arguments":"{\"a\""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]},"finish_reason":"tool_calls"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
            r#"{"message":{"role":"assistant","content":"hi"},"done":false}"#,
            r#"{"message":{"content":"","tool_calls":[{"function":{"name":"w","arguments":{"a":1}}}]},"done":false}"#,
            r#"{"message":{"content":""},"done":true,"done_reason":"stop","prompt_eval_count":3,"eval_count":4}"#,
            r#"{"error":"boom"}"#,
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 0..12),
        1 => any::<String>().prop_map(String::into_bytes),
    ]
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(fragment(), 0..40).prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_bytes_split_anywhere_decode_alike_and_never_panic(
        bytes in body(),
        cuts in prop::collection::vec(any::<usize>(), 0..24),
    ) {
        for new in decoders() {
            let whole = decode(new(), &bytes, &[]);
            let split = decode(new(), &bytes, &cuts);
            prop_assert_eq!(&whole, &split);
            let byte_by_byte = decode(new(), &bytes, &(0..bytes.len()).collect::<Vec<_>>());
            prop_assert_eq!(&whole, &byte_by_byte);
        }
    }
}

/// A reply the decoders must give back.
#[derive(Debug, Clone)]
struct Expected {
    content: String,
    calls: Vec<(Option<String>, String, Map<String, Value>)>,
    prompt_tokens: u64,
    completion_tokens: u64,
}

impl Expected {
    /// The reply as assembled; `as_text`: the server sent the arguments as JSON text (OpenAI's
    /// streams), which is kept to be echoed verbatim.
    fn reply(&self, finish_reason: &str, as_text: bool) -> AssembledReply {
        AssembledReply {
            content: self.content.clone(),
            tool_calls: self
                .calls
                .iter()
                .map(|(id, name, arguments)| AssembledCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: Arguments::Object(arguments.clone()),
                    arguments_text: as_text.then(|| Value::Object(arguments.clone()).to_string()),
                })
                .collect(),
            usage: Some(Usage {
                prompt_tokens: Some(self.prompt_tokens),
                completion_tokens: Some(self.completion_tokens),
            }),
            finish_reason: Some(finish_reason.to_string()),
            prompt_cache: None,
        }
    }
}

fn expected() -> impl Strategy<Value = Expected> {
    let call = (
        prop::option::of("call_[a-z0-9]{1,8}"),
        "[a-z_]{1,12}",
        prop::collection::btree_map("[a-z_]{1,8}", any::<String>().prop_map(Value::String), 0..4)
            .prop_map(|map| map.into_iter().collect::<Map<String, Value>>()),
    );
    (any::<String>(), prop::collection::vec(call, 0..4), any::<u32>(), any::<u32>()).prop_map(
        |(content, calls, prompt, completion)| Expected {
            content,
            calls,
            prompt_tokens: u64::from(prompt),
            completion_tokens: u64::from(completion),
        },
    )
}

/// `text` in pieces whose sizes (in characters) cycle through `sizes`.
fn pieces(text: &str, sizes: &[usize]) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut at = 0;
    for size in sizes.iter().cycle() {
        if at >= chars.len() {
            break;
        }
        let end = (at + size.max(&1)).min(chars.len());
        out.push(chars[at..end].iter().collect());
        at = end;
    }
    out
}

/// An OpenAI event stream of `reply`, with line ends from `eols`, and keep-alive comments.
fn render_openai(reply: &Expected, sizes: &[usize], eols: &[&str], comments: bool) -> Vec<u8> {
    let mut events = vec![json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": null}}]})];
    for piece in pieces(&reply.content, sizes) {
        events.push(json!({"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": null}]}));
    }
    for (index, (id, name, arguments)) in reply.calls.iter().enumerate() {
        let mut first = json!({"index": index, "type": "function", "function": {"name": name, "arguments": ""}});
        if let Some(id) = id {
            first["id"] = json!(id);
        }
        events.push(json!({"choices": [{"index": 0, "delta": {"tool_calls": [first]}}]}));
        for piece in pieces(&Value::Object(arguments.clone()).to_string(), sizes) {
            let fragment = json!({"index": index, "function": {"arguments": piece}});
            events.push(json!({"choices": [{"index": 0, "delta": {"tool_calls": [fragment]}}]}));
        }
    }
    let finish = if reply.calls.is_empty() { "stop" } else { "tool_calls" };
    events.push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}));
    events.push(json!({"choices": [], "usage": {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens}}));
    let mut out = String::new();
    let eol = |n: usize| eols[n % eols.len()];
    for (n, event) in events.iter().map(Value::to_string).chain(["[DONE]".to_string()]).enumerate() {
        if comments && n % 3 == 0 {
            out.push_str(&format!(": keep-alive{}", eol(n)));
        }
        out.push_str(&format!("data: {event}{}{}", eol(n), eol(n)));
    }
    out.into_bytes()
}

fn render_ollama(reply: &Expected, sizes: &[usize]) -> Vec<u8> {
    let mut lines = Vec::new();
    for piece in pieces(&reply.content, sizes) {
        lines.push(json!({"message": {"role": "assistant", "content": piece}, "done": false}));
    }
    for (id, name, arguments) in &reply.calls {
        let mut call = json!({"function": {"name": name, "arguments": arguments}});
        if let Some(id) = id {
            call["id"] = json!(id);
        }
        lines.push(json!({"message": {"role": "assistant", "content": "", "tool_calls": [call]}, "done": false}));
    }
    lines.push(json!({"message": {"role": "assistant", "content": ""}, "done": true, "done_reason": "stop",
        "prompt_eval_count": reply.prompt_tokens, "eval_count": reply.completion_tokens}));
    lines.iter().map(|line| format!("{line}\n")).collect::<String>().into_bytes()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_rendered_openai_stream_decodes_to_its_reply_however_split(
        reply in expected(),
        sizes in prop::collection::vec(1usize..9, 1..5),
        eols in prop::collection::vec(prop::sample::select(vec!["\n", "\r\n", "\r"]), 1..4),
        comments in any::<bool>(),
        cuts in prop::collection::vec(any::<usize>(), 0..30),
    ) {
        let bytes = render_openai(&reply, &sizes, &eols, comments);
        let finish = if reply.calls.is_empty() { "stop" } else { "tool_calls" };
        prop_assert_eq!(decode(Decoder::openai(), &bytes, &cuts), Ok(reply.reply(finish, true)));
    }

    #[test]
    fn a_rendered_ollama_stream_decodes_to_its_reply_however_split(
        reply in expected(),
        sizes in prop::collection::vec(1usize..9, 1..5),
        cuts in prop::collection::vec(any::<usize>(), 0..30),
    ) {
        let bytes = render_ollama(&reply, &sizes);
        prop_assert_eq!(decode(Decoder::ollama(), &bytes, &cuts), Ok(AssembledReply {
            // Ollama counts the prompt tokens it read, which is what its cache saved it.
            prompt_cache: Some(PromptCache { read: reply.prompt_tokens, reused: None }),
            ..reply.reply("stop", false)
        }));
    }

    #[test]
    fn a_stream_cut_anywhere_before_its_final_event_is_unfinished(
        reply in expected(),
        sizes in prop::collection::vec(1usize..9, 1..5),
        cut in any::<usize>(),
    ) {
        for (new, bytes, last) in [
            (Decoder::openai as fn() -> Decoder, render_openai(&reply, &sizes, &["\n"], false), "data: [DONE]"),
            (Decoder::ollama, render_ollama(&reply, &sizes), "\"done\":true"),
        ] {
            let text = String::from_utf8(bytes.clone()).unwrap();
            let final_event = text.rfind(last).unwrap();
            let line_start = text[..final_event].rfind('\n').map_or(0, |i| i + 1);
            let cut = cut % (line_start + 1);
            let result = decode(new(), &bytes[..cut], &[]);
            prop_assert!(matches!(result, Err(StreamError::Unfinished { .. })), "{:?}", result);
        }
    }
}
