//! Tool calls written as text, as JSON.
//!
//! Two users read these:
//!
//! * the `native` protocol, as a fallback: the reply carries no `tool_calls` but its content is
//!   a tool call written out as text (qwen2.5-coder does this, sometimes in a ```` ```json ````
//!   fence or a `<tool_call>` tag; llama3.1 writes `"parameters"` instead of `"arguments"`);
//! * the `json` protocol, where the system prompt ([`json_protocol_instructions`]) asks the
//!   model to answer with `{"tool": NAME, "arguments": {...}}` and nothing else.
//!
//! # Where calls are looked for
//!
//! The content is scanned once, front to back, for three kinds of places:
//!
//! * **`<tool_call>` tags** (ASCII case-insensitive): the JSON value(s) right after the tag,
//!   up to `</tool_call>`. A missing closing tag is tolerated (the block then ends at the next
//!   `<tool_call>` or at the end of the text), and so is a ```` ``` ```` fence inside the tag.
//! * **Markdown fences** (a line starting with ```` ``` ````, closed by a line of backticks):
//!   a fence tagged `json`, `json5`, `jsonc`, `tool_call`, `tool_calls` or `tool_code` must
//!   hold JSON values only; an untagged fence is read like plain text (below); a fence tagged
//!   with any other language (`rust`, `python`...) is code and is skipped entirely.
//! * **Bare JSON** anywhere else, including inside untagged fences: every top-level `{...}`,
//!   and every `[...]` that starts with an object, found with a brace scan that respects JSON
//!   strings and escapes. Prose around it is ignored. A `{` only starts a span when a key and a
//!   colon follow it (`{"name":`, `{'name':` or `{name:`, the key on one line) or it is `{}`,
//!   so braces and quotes in prose or code (`{x | x > 0}`, `"a { b"`, `fn f() {`) do not
//!   swallow a call written after them. A span that never closes (a call cut off) ends at the
//!   end of the text, or before a fence line or a `<tool_call>` tag; the balanced spans inside
//!   it are read too.
//!
//! Several places give several calls, in order of appearance; a JSON array gives one call per
//! item.
//!
//! # Which JSON is a tool call
//!
//! An object is a call when it names a tool and carries its arguments:
//!
//! * the name is in `"name"`, `"tool"` (the documented form of the `json` protocol) or
//!   `"function"` (when that is a string), looked up in that order;
//! * the arguments are in `"arguments"` or `"parameters"`: a JSON object, or a JSON string
//!   holding one (the OpenAI shape), read by [`Arguments::from_value`]; anything else there
//!   gives a call with [`Arguments::Malformed`] arguments, for the loop to send back;
//! * an object naming one of [`crate::tools::TOOL_NAMES`] with no arguments field is a call
//!   too, its other fields (except `"type"`, `"id"`, `"index"`) being the arguments:
//!   `{"name": "finish"}`, or the flattened `{"tool": "read_file", "path": "a.rs"}`;
//! * wrappers are unwrapped: `{"function": {...}}` and `{"type": "function", "function":
//!   {...}}` (OpenAI), `{"tool_call": {...}}` and `{"tool_calls": [...]}` (the grammar
//!   llama-server imposes on models without native tool support).
//!
//! `{"response": "text"}` (llama-server's third grammar alternative), `{"tool_calls": []}`,
//! objects such as `{"a": 1}` or `{"name": "Alice"}` (an unknown name and no arguments field),
//! and scalars are not calls.
//!
//! # What "clearly tries to be a tool call" means
//!
//! The content reads as [`TextCalls::Malformed`] — a repair turn is due — when any of these
//! holds; the first one found is reported, and no call of the reply is returned, so a reply
//! runs either whole or not at all:
//!
//! * a `<tool_call>` tag whose content is not JSON, is empty, or is JSON that is not a call:
//!   the tag exists for nothing else;
//! * a ```` ```json ```` fence (or the other JSON tags above) whose content is not valid JSON
//!   (valid JSON that is not a call, such as a `package.json` shown to the user, is ignored);
//! * a call-shaped object that cannot be read: it has `"arguments"`/`"parameters"` but no name,
//!   its name is not a non-empty string, or a wrapper (`"tool_call"`, `"tool_calls"`,
//!   `"function": {...}`) holds something that is not a call;
//! * bare text that is not valid JSON but *looks like* a call: it has an `"arguments"`,
//!   `"parameters"`, `"tool_call"` or `"tool_calls"` key, or a `"name"`/`"tool"`/`"function"`
//!   key whose value is one of our tool names. This catches the most common failure of small
//!   models, a file's content with unescaped quotes or raw line breaks, and a call cut off before
//!   its closing brace. Other invalid brace-delimited text (code, prose with braces) is ignored.
//!
//! Messages say where (which tag or fence, or the start of the object), what (serde_json's
//! error with its line and column, counted from the start of that tag's or fence's content),
//! a quote of the offending line and, for the common mistakes, how to fix it.
//!
//! Nothing here panics on any input, and the work is linear in the length of the text.

use serde_json::{Map, Value};

use crate::chat::{Arguments, ToolSpec, json_kind};
use crate::tools::TOOL_NAMES;

/// A tool call read from text.
#[derive(Debug, Clone, PartialEq)]
pub struct TextCall {
    /// The tool's name as the model wrote it (it may name no tool we have).
    pub name: String,
    /// The arguments: an object, or [`Arguments::Malformed`] when `"arguments"` is present but
    /// is neither an object nor a string holding a JSON object.
    pub arguments: Arguments,
}

/// What [`calls_in_text`] found in a reply's content.
#[derive(Debug, Clone, PartialEq)]
pub enum TextCalls {
    /// The content is not an attempt at a tool call (prose, code without a call shape...).
    None,
    /// One or more calls, in order of appearance.
    Found(Vec<TextCall>),
    /// The content clearly tries to be a tool call but cannot be read (see the module docs for
    /// what counts). The message says exactly what is wrong and how to fix it, for a repair
    /// turn sent back to the model.
    Malformed(String),
}

/// The keys that may hold a tool's name, in the order they are looked up.
const NAME_KEYS: [&str; 3] = ["name", "tool", "function"];
/// The keys that may hold a call's arguments, in the order they are looked up.
const ARGS_KEYS: [&str; 2] = ["arguments", "parameters"];
/// Keys of a flattened call that are not arguments.
const NOT_ARGUMENT_KEYS: [&str; 3] = ["type", "id", "index"];
/// Fence tags whose content must be JSON.
const JSON_FENCE_TAGS: [&str; 6] = ["json", "json5", "jsonc", "tool_call", "tool_calls", "tool_code"];
const OPEN_TAG: &str = "<tool_call>";
const CLOSE_TAG: &str = "</tool_call>";
/// The answer shape the messages suggest.
const CALL_EXAMPLE: &str = r#"{"tool": "write_file", "arguments": {"path": "...", "content": "..."}}"#;

/// Finds the tool calls written as text in a reply's content.
///
/// See the module documentation for the shapes recognised and for when the content counts as
/// a failed attempt ([`TextCalls::Malformed`]) rather than as no call at all.
pub fn calls_in_text(content: &str) -> TextCalls {
    let mut places = Vec::new();
    scan(content, 0, content.len(), true, &mut places);

    let tags = places.iter().filter(|p| matches!(p, Place::Tag { .. })).count();
    let fences = places.iter().filter(|p| matches!(p, Place::JsonFence { .. })).count();
    let (mut tag_no, mut fence_no) = (0, 0);
    let mut calls = Vec::new();
    for place in places {
        let outcome = match place {
            Place::Tag { values } => {
                tag_no += 1;
                let loc = located("<tool_call>", tag_no, tags);
                read_block(values, &loc, true)
            }
            Place::JsonFence { values, tag } => {
                fence_no += 1;
                let loc = located(&format!("```{tag}"), fence_no, fences);
                read_block(values, &loc, false)
            }
            Place::Bare { text, closed, inner } => read_bare(content, text, closed, &inner),
        };
        match outcome {
            Outcome::Calls(found) => calls.extend(found),
            Outcome::NotACall => {}
            Outcome::Malformed(message) => return TextCalls::Malformed(message),
        }
    }
    if calls.is_empty() { TextCalls::None } else { TextCalls::Found(calls) }
}

/// A place in the text where a call may be written.
enum Place {
    /// The content of a `<tool_call>` tag.
    Tag { values: Result<Vec<Value>, JsonError> },
    /// The content of a fence whose tag says JSON.
    JsonFence { values: Result<Vec<Value>, JsonError>, tag: String },
    /// A brace-delimited span of plain text (byte range). When it is not closed, `inner` lists
    /// the outermost balanced spans inside it.
    Bare { text: (usize, usize), closed: bool, inner: Vec<(usize, usize)> },
}

/// A JSON syntax error, positioned within the block it was found in.
#[derive(Debug)]
struct JsonError {
    line: usize,
    column: usize,
    /// serde_json's message without its position.
    message: String,
    eof: bool,
    /// The offending line, shortened around the error.
    near: String,
}

enum Outcome {
    Calls(Vec<TextCall>),
    NotACall,
    Malformed(String),
}

/// "your <tool_call> block", or "your 2nd <tool_call> block" when there are several.
fn located(kind: &str, number: usize, count: usize) -> String {
    if count > 1 { format!("your {} {kind} block", ordinal(number)) } else { format!("your {kind} block") }
}

fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

// ---------------------------------------------------------------------------------------------
// Scanning

/// Scans `text[from..to]` for places, appending them to `out`. `fences` is false inside an
/// untagged fence, whose lines are all content.
fn scan(text: &str, from: usize, to: usize, fences: bool, out: &mut Vec<Place>) {
    let bytes = text.as_bytes();
    let mut i = from;
    while i < to {
        let at_line_start = i == 0 || bytes[i - 1] == b'\n';
        if fences
            && at_line_start
            && let Some(fence) = fence_at(text, i, to)
        {
            match fence.tag.as_str() {
                "" => scan(text, fence.body.0, fence.body.1, false, out),
                tag if JSON_FENCE_TAGS.contains(&tag) => {
                    let body = &text[fence.body.0..fence.body.1];
                    let values = read_values(body, 0, |_| false).map(|(values, _)| values);
                    out.push(Place::JsonFence { values, tag: fence.tag });
                }
                _ => {} // code in another language
            }
            i = fence.end;
            continue;
        }
        match bytes[i] {
            b'<' if starts_with_ignore_case(&text[i..to], OPEN_TAG) => {
                let (values, end) = read_tag(text, i + OPEN_TAG.len(), to);
                out.push(Place::Tag { values });
                i = end;
            }
            b'<' if starts_with_ignore_case(&text[i..to], CLOSE_TAG) => i += CLOSE_TAG.len(),
            b'{' | b'[' if may_start_json(bytes, i, to) => i = brace_span(text, i, to, fences, out),
            _ => i += 1,
        }
    }
}

/// Whether the `{` or `[` at `i` may start a call object or an array of them: `{` followed by
/// a key and a colon (the key quoted on one line, or a bare word so that unquoted keys get
/// reported) or by `}`; `[` followed by such a `{`. This keeps braces in prose (`{x | x > 0}`,
/// `"a { b"`, a Rust block) from starting a span that would swallow a real call after it.
fn may_start_json(bytes: &[u8], i: usize, to: usize) -> bool {
    let next = |from: usize| (from..to).find(|&j| !bytes[j].is_ascii_whitespace());
    if bytes[i] == b'[' {
        return next(i + 1).is_some_and(|j| bytes[j] == b'{' && may_start_json(bytes, j, to));
    }
    let Some(j) = next(i + 1) else { return false };
    match bytes[j] {
        b'}' => true,
        // A quoted key: closed on the same line and followed by a colon.
        quote @ (b'"' | b'\'') => {
            let mut k = j + 1;
            while k < to && bytes[k] != quote && bytes[k] != b'\n' {
                k += if bytes[k] == b'\\' { 2 } else { 1 };
            }
            k < to && bytes[k] == quote && next(k + 1).is_some_and(|c| bytes[c] == b':')
        }
        b if b.is_ascii_alphabetic() || b == b'_' => {
            let word_end = (j..to).find(|&k| !(bytes[k].is_ascii_alphanumeric() || bytes[k] == b'_')).unwrap_or(to);
            next(word_end).is_some_and(|k| bytes[k] == b':')
        }
        _ => false,
    }
}

fn starts_with_ignore_case(text: &str, prefix: &str) -> bool {
    text.len() >= prefix.len() && text.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

/// A fence found at a line start.
struct Fence {
    /// The tag, lowercased ("" when untagged).
    tag: String,
    /// The byte range of the content.
    body: (usize, usize),
    /// Where scanning resumes: after the closing line, or `to`.
    end: usize,
}

/// The end of the line starting at `start` (the index of its `\n`, or `to`).
fn line_end(text: &str, start: usize, to: usize) -> usize {
    text.as_bytes()[start..to].iter().position(|&b| b == b'\n').map_or(to, |p| start + p)
}

/// Reads a fence opened on the line starting at `start`, if that line opens one.
///
/// A fence opens with three or more backticks (after optional indentation) and an optional tag
/// (the rest of the line is ignored), and closes at the first later line made of at least as
/// many backticks and nothing else; without one it runs to the end. A JSON fence (or an
/// untagged one whose content starts on the opening line, ```` ```{"name": ...} ````) may also
/// hold content on its opening line and close at the end of a content line: JSON cannot
/// legitimately end a line with backticks.
fn fence_at(text: &str, start: usize, to: usize) -> Option<Fence> {
    let first_end = line_end(text, start, to);
    let line = &text[start..first_end];
    let after_indent = line.trim_start();
    let ticks = after_indent.bytes().take_while(|&b| b == b'`').count();
    if ticks < 3 {
        return None;
    }
    let info_start = start + (line.len() - after_indent.len()) + ticks;
    let info = &text[info_start..first_end];
    let tag_offset = info.len() - info.trim_start().len();
    let tag_len = info[tag_offset..]
        .bytes()
        .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'+' | b'.'))
        .count();
    let tag = info[tag_offset..tag_offset + tag_len].to_ascii_lowercase();
    let json = JSON_FENCE_TAGS.contains(&tag.as_str());
    let after_tag = info_start + tag_offset + tag_len;
    let rest = &text[after_tag..first_end];
    let inline = rest.trim();
    let inline_json = !inline.is_empty() && (json || (tag.is_empty() && inline.starts_with(['{', '['])));
    let next_line = (first_end + 1).min(to);

    let mut body_start = next_line;
    if inline_json {
        let content_start = after_tag + (rest.len() - rest.trim_start().len());
        let content = text[content_start..first_end].trim_end();
        if let Some(body) = content.strip_suffix("```") {
            let body = body.trim_end_matches('`');
            return Some(Fence { tag, body: (content_start, content_start + body.len()), end: next_line });
        }
        body_start = content_start;
    }
    let mut line_start = next_line;
    while line_start < to && first_end < to {
        let end = line_end(text, line_start, to);
        let line = text[line_start..end].trim_end();
        let content = line.trim_start();
        let closing = content.bytes().rev().take_while(|&b| b == b'`').count();
        if closing >= ticks && (closing == content.len() || json || inline_json) {
            let body_end = if closing == content.len() { line_start } else { line_start + line.len() - closing };
            return Some(Fence { tag, body: (body_start, body_end), end: (end + 1).min(to) });
        }
        line_start = end + 1;
    }
    Some(Fence { tag, body: (body_start.min(to), to), end: to })
}

/// The first position of `needle` (which starts with an ASCII byte) in `hay`, ignoring ASCII
/// case.
fn find_ignore_case(hay: &str, needle: &str) -> Option<usize> {
    let first = needle.as_bytes().first().copied()?;
    hay.bytes()
        .enumerate()
        .filter(|&(_, b)| b == first)
        .map(|(i, _)| i)
        .find(|&i| starts_with_ignore_case(&hay[i..], needle))
}

/// Reads the content of a `<tool_call>` tag starting at `start`; returns the values and where
/// scanning resumes (after `</tool_call>` when there is one).
fn read_tag(text: &str, start: usize, to: usize) -> (Result<Vec<Value>, JsonError>, usize) {
    let region = &text[start..to];
    // A fence inside the tag: skip its opening line.
    let lead = region.len() - region.trim_start().len();
    let mut offset = lead;
    if region[lead..].starts_with("```") {
        offset = region[lead..].find('\n').map_or(region.len(), |p| lead + p + 1);
    }
    let stop = |rest: &str| {
        rest.starts_with("```") || starts_with_ignore_case(rest, CLOSE_TAG) || starts_with_ignore_case(rest, OPEN_TAG)
    };
    match read_values(region, offset, stop) {
        Ok((values, used)) => {
            let mut p = start + used;
            if text[p..to].starts_with("```") {
                p += text[p..to].bytes().take_while(|&b| b == b'`').count();
                p += text[p..to].len() - text[p..to].trim_start().len();
            }
            if starts_with_ignore_case(&text[p..to], CLOSE_TAG) {
                p += CLOSE_TAG.len();
            }
            (Ok(values), p)
        }
        Err(mut err) => {
            if let Some(p) = err.near.find(CLOSE_TAG) {
                err.near.truncate(p);
            }
            // Resume after the closing tag, if any, so the rest of the text is not misread.
            let end = find_ignore_case(region, CLOSE_TAG).map_or(to, |p| start + p + CLOSE_TAG.len());
            (Err(err), end)
        }
    }
}

/// Reads JSON values separated by whitespace or commas from `block[from..]`, until its end or
/// until `stop` accepts the rest. Returns the values and the offset where reading stopped
/// (after any whitespace). Errors are positioned within `block`.
fn read_values(block: &str, from: usize, stop: impl Fn(&str) -> bool) -> Result<(Vec<Value>, usize), JsonError> {
    let mut values = Vec::new();
    let mut p = from;
    loop {
        p += block[p..].len() - block[p..].trim_start_matches(|c: char| c.is_whitespace() || c == ',').len();
        if p >= block.len() || stop(&block[p..]) {
            return Ok((values, p));
        }
        let mut stream = serde_json::Deserializer::from_str(&block[p..]).into_iter::<Value>();
        match stream.next() {
            Some(Ok(value)) => {
                values.push(value);
                p += stream.byte_offset().max(1);
            }
            Some(Err(err)) => return Err(json_error(block, p, &err)),
            None => return Ok((values, p)),
        }
    }
}

/// Positions `err` (raised parsing `block[value_start..]`) within `block`: its line, and its
/// column counted in characters, both from 1.
///
/// The work is proportional to the distance from the start of `block` to the error, which the
/// parser has read anyway, never to the length of the rest of `block`.
fn json_error(block: &str, value_start: usize, err: &serde_json::Error) -> JsonError {
    let bytes = block.as_bytes();
    // serde_json counts lines from `value_start`, and columns in bytes; its column is the
    // offending byte's position from 1 (0 when the offending byte is the line break ending
    // the previous line, as for a raw line break inside a string).
    let mut err_line_start = value_start;
    if err.line() > 1 {
        let mut breaks = 0;
        for (i, &b) in bytes[value_start..].iter().enumerate() {
            if b == b'\n' {
                breaks += 1;
                if breaks == err.line() - 1 {
                    err_line_start = value_start + i + 1;
                    break;
                }
            }
        }
    }
    let offset = floor_boundary(block, (err_line_start + err.column()).saturating_sub(1));
    let before = &block[..offset];
    let line = 1 + before.bytes().filter(|&b| b == b'\n').count();
    let line_start = before.rfind('\n').map_or(0, |p| p + 1);
    let column = block[line_start..offset].chars().count() + 1;

    let text = err.to_string();
    let message = match text.rfind(" at line ") {
        Some(p) => text[..p].to_owned(),
        None => text,
    };
    JsonError { line, column, message, eof: err.is_eof(), near: quote_around(block, line_start, offset) }
}

/// A short quote of the line of `text` that starts at `line_start`, around byte `offset`, cut
/// on character boundaries.
fn quote_around(text: &str, line_start: usize, offset: usize) -> String {
    const BEFORE: usize = 40;
    const AFTER: usize = 30;
    let from = floor_boundary(text, offset.saturating_sub(BEFORE).max(line_start));
    let window_end = floor_boundary(text, offset.saturating_add(AFTER));
    let until = text[offset..window_end].find('\n').map_or(window_end, |p| offset + p);
    let mut quote = String::new();
    if from > line_start {
        quote.push('…');
    }
    quote.push_str(text[from..until].trim_end_matches('\r'));
    if until == window_end && until < text.len() && text.as_bytes()[until] != b'\n' {
        quote.push('…');
    }
    quote
}

/// The largest character boundary of `text` at or before `index`.
fn floor_boundary(text: &str, index: usize) -> usize {
    let mut index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

/// Finds the brace-delimited span starting at `start` (a `{`, or a `[` before a `{`), pushes
/// it (and, when it is not closed, the balanced spans inside it) and returns where scanning
/// resumes.
///
/// The span ends where its brackets balance. It is cut short, unclosed, at `to`, at a
/// `<tool_call>`/`</tool_call>` tag outside a string, and (when `fences`) before a line
/// starting with a fence: valid JSON contains none of these.
fn brace_span(text: &str, start: usize, to: usize, fences: bool, out: &mut Vec<Place>) -> usize {
    let bytes = text.as_bytes();
    let mut stack: Vec<usize> = Vec::new();
    let mut pairs: Vec<(usize, usize)> = Vec::new();
    let (mut in_string, mut escaped) = (false, false);
    let mut i = start;
    let mut stop = to;
    while i < to {
        let b = bytes[i];
        if b == b'\n' && fences && i + 1 < to && starts_fence_line(&text[i + 1..to]) {
            stop = i + 1;
            break;
        }
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'{' | b'[' => stack.push(i),
                b'}' | b']' => {
                    if let Some(open) = stack.pop() {
                        if stack.is_empty() {
                            out.push(Place::Bare { text: (start, i + 1), closed: true, inner: Vec::new() });
                            return i + 1;
                        }
                        pairs.push((open, i + 1));
                    }
                }
                b'<' if starts_with_ignore_case(&text[i..to], OPEN_TAG)
                    || starts_with_ignore_case(&text[i..to], CLOSE_TAG) =>
                {
                    stop = i;
                    break;
                }
                _ => {}
            }
        }
        i += 1;
    }
    // Unclosed: keep the outermost balanced spans inside it.
    pairs.sort_unstable();
    let mut inner: Vec<(usize, usize)> = Vec::new();
    for pair in pairs {
        if inner.last().is_none_or(|last| pair.0 >= last.1) {
            inner.push(pair);
        }
    }
    out.push(Place::Bare { text: (start, stop), closed: false, inner });
    stop.max(start + 1)
}

fn starts_fence_line(rest: &str) -> bool {
    rest.trim_start_matches([' ', '\t']).starts_with("```")
}

// ---------------------------------------------------------------------------------------------
// Reading what was found

/// Reads the values of a tag or JSON fence. In a tag, JSON that is not a call is an error.
fn read_block(values: Result<Vec<Value>, JsonError>, loc: &str, must_be_call: bool) -> Outcome {
    let values = match values {
        Ok(values) => values,
        Err(err) => return Outcome::Malformed(describe_json_error(&format!("the JSON in {loc}"), &err)),
    };
    if values.is_empty() {
        return Outcome::Malformed(format!("{loc} is empty; put one tool call in it, e.g. {CALL_EXAMPLE}"));
    }
    let mut calls = Vec::new();
    for value in values {
        let kind = json_kind(&value);
        match classify(value) {
            Shape::Calls(found) => calls.extend(found),
            Shape::NotACall if must_be_call => {
                return Outcome::Malformed(format!(
                    "{loc} holds {kind} that is not a tool call: it names no tool; write {CALL_EXAMPLE}"
                ));
            }
            Shape::NotACall => {}
            Shape::Bad(problem) => return Outcome::Malformed(format!("in {loc}, {problem}")),
        }
    }
    if calls.is_empty() { Outcome::NotACall } else { Outcome::Calls(calls) }
}

/// Reads a bare brace-delimited span.
fn read_bare(content: &str, (start, end): (usize, usize), closed: bool, inner: &[(usize, usize)]) -> Outcome {
    let text = &content[start..end];
    let loc = format!("the JSON starting `{}` in your reply", excerpt(text));
    if closed {
        return match serde_json::from_str::<Value>(text) {
            Ok(value) => match classify(value) {
                Shape::Calls(calls) => Outcome::Calls(calls),
                Shape::NotACall => Outcome::NotACall,
                Shape::Bad(problem) => Outcome::Malformed(format!("in {loc}, {problem}")),
            },
            Err(err) if looks_like_call(text) => {
                Outcome::Malformed(describe_json_error(&loc, &json_error(text, 0, &err)))
            }
            Err(_) => Outcome::NotACall,
        };
    }
    let mut calls = Vec::new();
    for &span in inner {
        match read_bare(content, span, true, &[]) {
            Outcome::Calls(found) => calls.extend(found),
            Outcome::NotACall => {}
            malformed @ Outcome::Malformed(_) => return malformed,
        }
    }
    if !calls.is_empty() {
        return Outcome::Calls(calls);
    }
    if !looks_like_call(text) {
        return Outcome::NotACall;
    }
    match serde_json::from_str::<Value>(text.trim_end()) {
        Err(err) => Outcome::Malformed(describe_json_error(&loc, &json_error(text, 0, &err))),
        // Cannot normally happen (the brackets do not balance), but read it if it does.
        Ok(value) => match classify(value) {
            Shape::Calls(calls) => Outcome::Calls(calls),
            Shape::NotACall => Outcome::NotACall,
            Shape::Bad(problem) => Outcome::Malformed(format!("in {loc}, {problem}")),
        },
    }
}

/// The first characters of `text`, on one line.
fn excerpt(text: &str) -> String {
    const LEN: usize = 40;
    let cut = floor_boundary(text, LEN);
    let mut quote: String =
        text[..cut].chars().map(|c| if c.is_whitespace() { ' ' } else { c }).collect::<String>().replace('`', "'");
    if cut < text.len() {
        quote.push('…');
    }
    quote
}

/// Whether text that is not valid JSON looks like an attempt at a call: it has an arguments
/// or wrapper key, or a name key whose value is one of our tools. Keys and values may be in
/// single quotes (a Python dict is a common mistake) and keys may be unquoted (JavaScript).
fn looks_like_call(text: &str) -> bool {
    // The text after each `"key":`, `'key':` or `key:` (the latter after `{` or `,`).
    let after_key = |key: &'static str| {
        text.match_indices(key).filter_map(move |(p, _)| {
            let before = text[..p].chars().next_back();
            let after = text[p + key.len()..].chars().next();
            let rest = match (before, after) {
                (Some(q @ ('"' | '\'')), Some(a)) if a == q => &text[p + key.len() + 1..],
                _ if before.is_some_and(|c| c.is_alphanumeric() || c == '_') => return None,
                _ if text[..p].trim_end().ends_with(['{', ',']) => &text[p + key.len()..],
                _ => return None,
            };
            rest.trim_start().strip_prefix(':')
        })
    };
    if ["arguments", "parameters", "tool_call", "tool_calls"].into_iter().any(|key| after_key(key).next().is_some()) {
        return true;
    }
    NAME_KEYS.into_iter().any(|key| {
        after_key(key).any(|value| {
            let value = value.trim_start();
            let Some(q) = value.chars().next().filter(|c| matches!(c, '"' | '\'')) else { return false };
            TOOL_NAMES.iter().any(|tool| value[1..].strip_prefix(tool).is_some_and(|r| r.starts_with(q)))
        })
    })
}

/// A model-facing description of a JSON syntax error in `what`, with a hint for the common
/// mistakes.
fn describe_json_error(what: &str, err: &JsonError) -> String {
    let hint = if err.message.contains("control character") {
        " (a line break, tab or other control character inside a string must be escaped: write a line \
         break as \\n and a tab as \\t, so the whole file content is one JSON string)"
    } else if err.message.contains("invalid escape") {
        " (a backslash inside a string must be written as \\\\ unless it starts an escape such as \\n or \\\")"
    } else if err.message.contains("key must be a string") {
        " (every key needs double quotes, e.g. {\"path\": \"a.rs\"})"
    } else if err.message.contains("trailing comma") {
        " (remove the comma before the closing bracket)"
    } else if err.eof {
        " (it ends before every string, object and array is closed: the reply may have been cut off, \
         or a closing brace or quote is missing)"
    } else if err.message.starts_with("expected `,` or") {
        " (if the text there belongs to a string, a double quote inside a string must be escaped as \\\")"
    } else {
        ""
    };
    let mut message = format!("{what} is invalid at line {} column {}: {}{hint}", err.line, err.column, err.message);
    if !err.near.trim().is_empty() {
        message.push_str(&format!("; the line reads `{}`", err.near.replace('`', "'")));
    }
    message
}

/// How a JSON value reads as calls.
enum Shape {
    Calls(Vec<TextCall>),
    NotACall,
    /// Call-shaped but unreadable: why.
    Bad(String),
}

fn classify(value: Value) -> Shape {
    match value {
        Value::Array(items) => classify_items(items, "the JSON array", false),
        Value::Object(map) => classify_object(map, false),
        _ => Shape::NotACall,
    }
}

/// Classifies the items of an array. When `must_be_calls`, an item that is not a call is an
/// error; otherwise it is only one when other items are calls.
fn classify_items(items: Vec<Value>, what: &str, must_be_calls: bool) -> Shape {
    let mut calls = Vec::new();
    let mut not_a_call = None;
    for (i, item) in items.into_iter().enumerate() {
        let kind = json_kind(&item);
        let shape = match item {
            Value::Object(map) => classify_object(map, must_be_calls),
            other => classify(other),
        };
        match shape {
            Shape::Calls(found) => calls.extend(found),
            Shape::NotACall => {
                not_a_call.get_or_insert((i + 1, kind));
            }
            Shape::Bad(problem) => return Shape::Bad(format!("in item {} of {what}, {problem}", i + 1)),
        }
    }
    match not_a_call {
        Some((n, kind)) if must_be_calls || !calls.is_empty() => Shape::Bad(format!(
            "item {n} of {what} is {kind} that is not a tool call; every item must be a call such as {CALL_EXAMPLE}"
        )),
        _ if calls.is_empty() => Shape::NotACall,
        _ => Shape::Calls(calls),
    }
}

/// Reads an object, unwrapping the wrapper shapes. When `required` (an item of a wrapper), an
/// object that is not a call is an error.
fn classify_object(mut map: Map<String, Value>, required: bool) -> Shape {
    if let Some(list) = map.remove("tool_calls") {
        return match list {
            Value::Array(items) if items.is_empty() => Shape::NotACall,
            Value::Array(items) => classify_items(items, "\"tool_calls\"", true),
            Value::Object(call) => classify_object(call, true),
            other => Shape::Bad(format!(
                "\"tool_calls\" is {}; it must be an array of calls such as {CALL_EXAMPLE}",
                json_kind(&other)
            )),
        };
    }
    if let Some(call) = map.remove("tool_call") {
        return match call {
            Value::Object(call) => match classify_object(call, true) {
                Shape::Bad(problem) => Shape::Bad(format!("in \"tool_call\", {problem}")),
                shape => shape,
            },
            Value::Array(items) => classify_items(items, "\"tool_call\"", true),
            other => Shape::Bad(format!(
                "\"tool_call\" is {}; it must be one call such as {CALL_EXAMPLE}",
                json_kind(&other)
            )),
        };
    }
    if let Some(Value::Object(_)) = map.get("function") {
        let Some(Value::Object(mut function)) = map.remove("function") else { return Shape::NotACall };
        // Arguments next to the "function" object rather than inside it.
        if !ARGS_KEYS.iter().any(|k| function.contains_key(*k)) {
            for key in ARGS_KEYS {
                if let Some(args) = map.remove(key) {
                    function.insert(key.to_owned(), args);
                    break;
                }
            }
        }
        return classify_call(function, true, "the \"function\" object");
    }
    classify_call(map, required, "the object")
}

/// Reads an object as one call. When `required` (inside a wrapper), an object that names no
/// tool is an error rather than "not a call".
fn classify_call(mut map: Map<String, Value>, required: bool, what: &str) -> Shape {
    let name_key = NAME_KEYS.iter().copied().find(|k| map.contains_key(*k));
    let args_key = ARGS_KEYS.iter().copied().find(|k| map.contains_key(*k));
    let Some(name_key) = name_key else {
        return match args_key {
            Some(args_key) => Shape::Bad(format!(
                "{what} has \"{args_key}\" but no \"tool\" or \"name\" field saying which tool to call; \
                 write {CALL_EXAMPLE}"
            )),
            None if required => Shape::Bad(format!(
                "{what} has no \"tool\" or \"name\" field saying which tool to call; write {CALL_EXAMPLE}"
            )),
            None => Shape::NotACall,
        };
    };
    let name = match map.remove(name_key) {
        Some(Value::String(name)) => name,
        Some(other) if args_key.is_some() || required => {
            return Shape::Bad(format!(
                "the \"{name_key}\" field is {}; it must be a string naming the tool, e.g. \"write_file\"",
                json_kind(&other)
            ));
        }
        _ => return Shape::NotACall,
    };
    if name.trim().is_empty() {
        return if args_key.is_some() || required {
            Shape::Bad(format!("the \"{name_key}\" field is empty; it must name the tool to call, e.g. \"write_file\""))
        } else {
            Shape::NotACall
        };
    }
    let arguments = match args_key {
        Some(key) => Arguments::from_value(map.remove(key).unwrap_or(Value::Null)),
        None if required || TOOL_NAMES.contains(&name.as_str()) => {
            for key in NAME_KEYS.iter().chain(NOT_ARGUMENT_KEYS.iter()) {
                map.remove(*key);
            }
            Arguments::Object(map)
        }
        None => return Shape::NotACall,
    };
    Shape::Calls(vec![TextCall { name, arguments }])
}

// ---------------------------------------------------------------------------------------------
// The `json` protocol's instructions

/// System-prompt text for the `json` protocol.
///
/// Short on purpose (small models have small context windows, and copy what they are shown):
/// the answer format, `{"tool": NAME, "arguments": {...}}`, one line per tool of `tools` with
/// its arguments, and the rules that matter: one object per reply and nothing around it, the
/// whole file as one properly escaped JSON string, `finish` when done. It shows no file content
/// a model could copy into its own; the example call is read back by [`calls_in_text`].
pub fn json_protocol_instructions(tools: &[ToolSpec]) -> String {
    let mut out = String::from(
        "Every reply is exactly one JSON object that calls one tool, with nothing before or after it \
         (no prose, no ``` fence):\n{\"tool\": \"<tool name>\", \"arguments\": {<the tool's arguments>}}\n\
         The tool's result comes back in the next message.\n\nThe tools:\n",
    );
    for tool in tools {
        let arguments: Vec<String> = parameters(&tool.parameters)
            .iter()
            .map(|p| format!("\"{}\"{}", p.name, if p.required { "" } else { " (optional)" }))
            .collect();
        out.push_str(&format!("- {} {{{}}}: {}\n", tool.name, arguments.join(", "), short_description(tool)));
    }
    out.push_str(
        "\nA file's content is one JSON string holding the whole file: write a double quote as \\\", a \
         backslash as \\\\, a line break as \\n. Example: {\"tool\": \"write_file\", \"arguments\": \
         {\"path\": \"<the file>\", \"content\": \"<line 1>\\n<line 2>\\n\"}}\n\
         When every file the task asks for is written, call finish.\n",
    );
    out
}

/// One line on what a tool does, for [`json_protocol_instructions`].
fn short_description(tool: &ToolSpec) -> &'static str {
    match tool.name {
        crate::tools::WRITE_FILE => "create or replace the file at path with content, the complete file",
        crate::tools::EDIT_FILE => "replace old, text that occurs once in the file at path, by new",
        crate::tools::READ_FILE => "the content of the file at path",
        crate::tools::LIST_FILES => "the files you may read (those under dir, if given)",
        crate::tools::FINISH => "declare the task done, once every file it asks for is written; one sentence",
        crate::tools::CHECK => "run the step's check on the files written so far and get its errors",
        _ => "",
    }
}

/// One parameter of a tool, as the instructions name it.
struct Parameter {
    name: String,
    required: bool,
}

/// The parameters of a JSON schema: the required ones in their order, then the others.
fn parameters(schema: &Value) -> Vec<Parameter> {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else { return Vec::new() };
    let mut out: Vec<Parameter> = required
        .iter()
        .filter(|name| properties.contains_key(**name))
        .map(|name| Parameter { name: name.to_string(), required: true })
        .collect();
    out.extend(
        properties
            .keys()
            .filter(|name| !required.contains(&name.as_str()))
            .map(|name| Parameter { name: name.clone(), required: false }),
    );
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(value: Value) -> Arguments {
        match value {
            Value::Object(map) => Arguments::Object(map),
            other => panic!("not an object: {other}"),
        }
    }

    fn call(name: &str, arguments: Value) -> TextCall {
        TextCall { name: name.to_owned(), arguments: object(arguments) }
    }

    fn found(content: &str) -> Vec<TextCall> {
        match calls_in_text(content) {
            TextCalls::Found(calls) => calls,
            other => panic!("expected calls in {content:?}, got {other:?}"),
        }
    }

    fn malformed(content: &str) -> String {
        match calls_in_text(content) {
            TextCalls::Malformed(message) => message,
            other => panic!("expected Malformed for {content:?}, got {other:?}"),
        }
    }

    fn write_call() -> TextCall {
        call("write_file", json!({"path": "a.rs", "content": "fn main() {}\n"}))
    }

    const WRITE: &str = r#"{"name": "write_file", "arguments": {"path": "a.rs", "content": "fn main() {}\n"}}"#;

    #[test]
    fn bare_object() {
        assert_eq!(found(WRITE), vec![write_call()]);
    }

    #[test]
    fn bare_object_with_whitespace_and_prose() {
        assert_eq!(found(&format!("\n\n  {WRITE}  \n")), vec![write_call()]);
        assert_eq!(found(&format!("I will write the file now.\n{WRITE}\nThat is all.")), vec![write_call()]);
    }

    #[test]
    fn parameters_instead_of_arguments() {
        let text = r#"{"name": "read_file", "parameters": {"path": "src/view.rs"}}"#;
        assert_eq!(found(text), vec![call("read_file", json!({"path": "src/view.rs"}))]);
    }

    #[test]
    fn tool_key_and_function_key() {
        let text = r#"{"tool": "list_files", "arguments": {"dir": "src"}}"#;
        assert_eq!(found(text), vec![call("list_files", json!({"dir": "src"}))]);
        let text = r#"{"function": "finish", "arguments": {"summary": "done"}}"#;
        assert_eq!(found(text), vec![call("finish", json!({"summary": "done"}))]);
    }

    #[test]
    fn openai_function_wrappers() {
        let text = r#"{"function": {"name": "read_file", "arguments": "{\"path\": \"a.rs\"}"}}"#;
        assert_eq!(found(text), vec![call("read_file", json!({"path": "a.rs"}))]);
        let text =
            r#"{"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": {"path": "a.rs"}}}"#;
        assert_eq!(found(text), vec![call("read_file", json!({"path": "a.rs"}))]);
    }

    #[test]
    fn llama_server_grammar_forms() {
        let text = r#"{"tool_call": {"name": "read_file", "arguments": {"path": "a.rs"}}}"#;
        assert_eq!(found(text), vec![call("read_file", json!({"path": "a.rs"}))]);
        let text = r#"{"tool_calls": [{"name": "read_file", "arguments": {"path": "a.rs"}},
            {"type": "function", "function": {"name": "finish", "arguments": "{\"summary\": \"ok\"}"}}]}"#;
        assert_eq!(
            found(text),
            vec![call("read_file", json!({"path": "a.rs"})), call("finish", json!({"summary": "ok"}))]
        );
        assert_eq!(calls_in_text(r#"{"response": "Hello! How can I help?"}"#), TextCalls::None);
        assert_eq!(calls_in_text(r#"{"tool_calls": []}"#), TextCalls::None);
    }

    #[test]
    fn arguments_as_json_string() {
        let text = r#"{"name": "write_file", "arguments": "{\"path\": \"a.rs\", \"content\": \"x\"}"}"#;
        assert_eq!(found(text), vec![call("write_file", json!({"path": "a.rs", "content": "x"}))]);
        let text = r#"{"name": "finish", "arguments": ""}"#;
        assert_eq!(found(text), vec![call("finish", json!({}))]);
    }

    #[test]
    fn malformed_arguments_are_kept_for_the_loop() {
        let text = r#"{"name": "write_file", "arguments": "path=a.rs"}"#;
        let calls = found(text);
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "write_file");
        match &calls[0].arguments {
            Arguments::Malformed { raw, error } => {
                assert_eq!(raw, "path=a.rs");
                assert!(error.starts_with("not valid JSON"), "{error}");
            }
            other => panic!("{other:?}"),
        }
        let calls = found(r#"{"name": "read_file", "arguments": [1, 2]}"#);
        assert_eq!(
            calls[0].arguments,
            Arguments::Malformed {
                raw: "[1,2]".into(),
                error: "expected a JSON object of named arguments, got an array".into()
            }
        );
    }

    #[test]
    fn null_or_missing_arguments() {
        assert_eq!(found(r#"{"name": "list_files", "arguments": null}"#), vec![call("list_files", json!({}))]);
        assert_eq!(found(r#"{"name": "list_files"}"#), vec![call("list_files", json!({}))]);
        assert_eq!(found(r#"{"tool": "read_file", "path": "a.rs"}"#), vec![call("read_file", json!({"path": "a.rs"}))]);
    }

    #[test]
    fn array_of_calls() {
        let text = format!("[{WRITE}, {{\"name\": \"finish\", \"arguments\": {{\"summary\": \"s\"}}}}]");
        assert_eq!(found(&text), vec![write_call(), call("finish", json!({"summary": "s"}))]);
    }

    #[test]
    fn json_fences() {
        assert_eq!(found(&format!("```json\n{WRITE}\n```")), vec![write_call()]);
        assert_eq!(found(&format!("Here it is:\n\n```JSON\n{WRITE}\n```\n\nDone.")), vec![write_call()]);
        let two = format!(
            "First:\n```json\n{WRITE}\n```\nthen:\n```json\n{{\"name\": \"finish\", \"arguments\": {{}}}}\n```\n"
        );
        assert_eq!(found(&two), vec![write_call(), call("finish", json!({}))]);
        // An untagged fence, an unclosed one, and a one-line one.
        assert_eq!(found(&format!("```\n{WRITE}\n```")), vec![write_call()]);
        assert_eq!(found(&format!("```json\n{WRITE}\n")), vec![write_call()]);
        assert_eq!(found(&format!("```json {WRITE}```")), vec![write_call()]);
        assert_eq!(found(&format!("```json\n{WRITE}```")), vec![write_call()]);
    }

    #[test]
    fn tool_call_tags() {
        assert_eq!(found(&format!("<tool_call>\n{WRITE}\n</tool_call>")), vec![write_call()]);
        let two = format!(
            "<tool_call>\n{WRITE}\n</tool_call>\n<tool_call>\n{{\"name\": \"finish\", \"arguments\": {{}}}}\n</tool_call>"
        );
        assert_eq!(found(&two), vec![write_call(), call("finish", json!({}))]);
        // Unclosed, fenced inside, prose around.
        assert_eq!(found(&format!("<tool_call>{WRITE}")), vec![write_call()]);
        assert_eq!(found(&format!("Sure.\n<tool_call>\n```json\n{WRITE}\n```\n</tool_call>\nok")), vec![write_call()]);
        // A tag inside a JSON string is content, not a tag.
        let text = r#"{"name": "write_file", "arguments": {"path": "a.md", "content": "use <tool_call> tags"}}"#;
        assert_eq!(found(text), vec![call("write_file", json!({"path": "a.md", "content": "use <tool_call> tags"}))]);
    }

    #[test]
    fn prose_and_code_are_not_calls() {
        for text in [
            "",
            "   ",
            "I have finished the task.",
            "fn main() {\n    println!(\"{}\", 1);\n}\n",
            "```rust\nfn main() { let x = {\"name\": 1}; }\n```",
            r#"{"a": 1}"#,
            r#"{"name": "Alice", "age": 3}"#,
            "```json\n{\"name\": \"my-app\", \"version\": \"1.0.0\"}\n```",
            "Use { and } for blocks, [1] for arrays.",
            "[1, 2, 3]",
            "{{ template }}",
        ] {
            assert_eq!(calls_in_text(text), TextCalls::None, "{text:?}");
        }
    }

    #[test]
    fn a_call_after_a_stray_brace() {
        let text = "Use { to open a block. {\"name\": \"finish\", \"arguments\": {\"summary\": \"x\"}}";
        assert_eq!(found(text), vec![call("finish", json!({"summary": "x"}))]);
    }

    #[test]
    fn braces_and_quotes_in_prose_do_not_hide_a_call() {
        let text = "The set {x | x > 0} and \"quoted { stuff\" then {\"name\": \"finish\", \"arguments\": {}}";
        assert_eq!(found(text), vec![call("finish", json!({}))]);
        let text = "fn main() {\n    let s = \"{\";\n}\n{\"tool\": \"list_files\"}";
        assert_eq!(found(text), vec![call("list_files", json!({}))]);
    }

    #[test]
    fn unquoted_keys_are_reported() {
        let message = malformed("{tool: \"read_file\", arguments: {path: \"a.rs\"}}");
        assert!(message.contains("invalid at line 1 column 2: key must be a string"), "{message}");
    }

    #[test]
    fn code_fences_are_skipped() {
        let text = format!("```rust\n{WRITE}\n```");
        assert_eq!(calls_in_text(&text), TextCalls::None);
    }

    #[test]
    fn invalid_json_in_a_json_fence() {
        let text =
            "```json\n{\n  \"name\": \"write_file\",\n  \"arguments\": {\"path\": \"a.rs\" \"content\": \"x\"}\n}\n```";
        assert_eq!(
            malformed(text),
            "the JSON in your ```json block is invalid at line 3 column 32: expected `,` or `}` \
             (if the text there belongs to a string, a double quote inside a string must be escaped as \\\"); \
             the line reads `  \"arguments\": {\"path\": \"a.rs\" \"content\": \"x\"}`"
        );
        assert_eq!(
            malformed("```json\n{\"a\": 1} // comment\n```"),
            "the JSON in your ```json block is invalid at line 1 column 10: expected value; the line reads `{\"a\": 1} // comment`"
        );
        assert_eq!(
            malformed("```json\n```"),
            format!("your ```json block is empty; put one tool call in it, e.g. {CALL_EXAMPLE}")
        );
    }

    #[test]
    fn which_fence_is_named() {
        let text = format!("```json\n{WRITE}\n```\n```json\n{{\"name\": \"finish\",}}\n```");
        let message = malformed(&text);
        assert!(
            message.starts_with("the JSON in your 2nd ```json block is invalid at line 1 column 19: trailing comma"),
            "{message}"
        );
    }

    #[test]
    fn raw_line_breaks_in_content() {
        let text = "{\"name\": \"write_file\", \"arguments\": {\"path\": \"a.rs\", \"content\": \"fn main() {\n}\"}}";
        let message = malformed(text);
        assert!(
            message.starts_with(
                "the JSON starting `{\"name\": \"write_file\", \"arguments\": {\"pa…` in your reply is invalid at line 1 column 77: control character"
            ),
            "{message}"
        );
        assert!(message.contains("write a line break as \\n"), "{message}");
    }

    #[test]
    fn unescaped_quotes_in_content() {
        let text = r#"{"name": "write_file", "arguments": {"path": "a.rs", "content": "println!("hi");"}}"#;
        let message = malformed(text);
        assert!(message.contains("is invalid at line 1 column 76: expected `,` or `}`"), "{message}");
        assert!(message.contains("escaped as \\\""), "{message}");
    }

    #[test]
    fn cut_off_call() {
        let text = r#"{"name": "write_file", "arguments": {"path": "a.rs", "content": "x"}"#;
        let message = malformed(text);
        assert!(message.contains("is invalid at line 1 column 68: EOF while parsing an object"), "{message}");
        assert!(message.contains("cut off"), "{message}");
    }

    #[test]
    fn invalid_json_in_a_tag() {
        let message =
            malformed("<tool_call>\n{\"name\": \"read_file\", \"arguments\": {path: \"a.rs\"}}\n</tool_call>");
        assert_eq!(
            message,
            "the JSON in your <tool_call> block is invalid at line 2 column 37: key must be a string \
             (every key needs double quotes, e.g. {\"path\": \"a.rs\"}); the line reads \
             `{\"name\": \"read_file\", \"arguments\": {path: \"a.rs\"}}`"
        );
        assert_eq!(
            malformed("<tool_call>read_file(a.rs)</tool_call>"),
            "the JSON in your <tool_call> block is invalid at line 1 column 1: expected value; the line reads `read_file(a.rs)`"
        );
        assert_eq!(
            malformed("<tool_call></tool_call>"),
            format!("your <tool_call> block is empty; put one tool call in it, e.g. {CALL_EXAMPLE}")
        );
        assert_eq!(
            malformed("<tool_call>{\"a\": 1}</tool_call>"),
            format!(
                "your <tool_call> block holds an object that is not a tool call: it names no tool; write {CALL_EXAMPLE}"
            )
        );
    }

    #[test]
    fn missing_or_bad_name() {
        assert_eq!(
            malformed(r#"{"arguments": {"path": "a.rs"}}"#),
            format!(
                "in the JSON starting `{{\"arguments\": {{\"path\": \"a.rs\"}}}}` in your reply, the object has \
                 \"arguments\" but no \"tool\" or \"name\" field saying which tool to call; write {CALL_EXAMPLE}"
            )
        );
        assert_eq!(
            malformed("```json\n{\"name\": 3, \"arguments\": {}}\n```"),
            "in your ```json block, the \"name\" field is a number; it must be a string naming the tool, e.g. \"write_file\""
        );
        assert_eq!(
            malformed(r#"{"name": "", "arguments": {}}"#),
            "in the JSON starting `{\"name\": \"\", \"arguments\": {}}` in your reply, the \"name\" field is empty; \
             it must name the tool to call, e.g. \"write_file\""
        );
        assert_eq!(
            malformed(r#"{"tool_call": {"arguments": {}}}"#),
            format!(
                "in the JSON starting `{{\"tool_call\": {{\"arguments\": {{}}}}}}` in your reply, in \"tool_call\", \
                 the object has \"arguments\" but no \"tool\" or \"name\" field saying which tool to call; write {CALL_EXAMPLE}"
            )
        );
        assert_eq!(
            malformed(r#"{"tool_calls": "read_file"}"#),
            format!(
                "in the JSON starting `{{\"tool_calls\": \"read_file\"}}` in your reply, \"tool_calls\" is a string; \
                 it must be an array of calls such as {CALL_EXAMPLE}"
            )
        );
    }

    #[test]
    fn mixed_array() {
        let message = malformed(&format!("[{WRITE}, 3]"));
        assert!(message.ends_with(&format!("item 2 of the JSON array is a number that is not a tool call; every item must be a call such as {CALL_EXAMPLE}")), "{message}");
    }

    #[test]
    fn python_dicts_are_failed_attempts() {
        let message = malformed("{'name': 'write_file', 'arguments': {'path': 'a.rs'}}");
        assert!(
            message.contains("is invalid at line 1 column 2: key must be a string (every key needs double quotes"),
            "{message}"
        );
        assert!(message.contains("the line reads `{'name': 'write_file', 'argumen…`"), "{message}");
        assert_eq!(calls_in_text("{'a': 1}"), TextCalls::None);
    }

    #[test]
    fn unknown_tool_names_are_calls_when_arguments_are_given() {
        assert_eq!(
            found(r#"{"name": "run_shell", "arguments": {"cmd": "ls"}}"#),
            vec![call("run_shell", json!({"cmd": "ls"}))]
        );
    }

    #[test]
    fn long_inputs_are_fast_and_safe() {
        for text in [
            "{".repeat(1 << 20),
            "[".repeat(1 << 20),
            "}".repeat(1 << 20),
            "\"".repeat(1 << 20),
            "<tool_call>".repeat(1 << 16),
            "```json\n".repeat(1 << 17),
            "{\"arguments\": \"".repeat(1 << 16),
            format!("{{\"name\": \"write_file\", \"arguments\": {{\"content\": \"{}", "é\\n".repeat(1 << 18)),
        ] {
            let start = std::time::Instant::now();
            let _ = calls_in_text(&text);
            assert!(start.elapsed().as_secs() < 5, "too slow on {:?}…", &text[..20]);
        }
    }

    #[test]
    fn non_ascii_near_errors() {
        let text = "```json\n{\"name\": \"write_file\", \"arguments\": {\"content\": \"ééééééééééééééééééééééééééééééééééééééééééé\" \"x\"}}\n```";
        let message = malformed(text);
        // Columns count characters, and the quote is cut on character boundaries.
        assert!(message.contains("is invalid at line 1 column 95: expected `,` or `}`"), "{message}");
        assert!(message.ends_with("the line reads `…ééééééééééééééééééé\" \"x\"}}`"), "{message}");
    }

    #[test]
    fn instructions_describe_every_tool_in_a_line_and_their_example_reads_as_a_call() {
        let specs = crate::tools::specs_for(true);
        let text = json_protocol_instructions(&specs);
        assert!(text.contains("{\"tool\": \"<tool name>\", \"arguments\": {<the tool's arguments>}}"), "{text}");
        assert!(text.contains("- write_file {\"path\", \"content\"}: create or replace"), "{text}");
        assert!(text.contains("- list_files {\"dir\" (optional)}"), "{text}");
        assert!(text.contains("- check {}: run the step's check"), "{text}");
        assert!(text.contains("call finish") && text.contains("a line break as \\n"), "{text}");
        for spec in &specs {
            assert!(text.contains(&format!("- {} {{", spec.name)), "{}", spec.name);
        }
        // No code a model could copy as its own content.
        assert!(!text.contains("fn ") && !text.contains("view.rs"), "{text}");
        let example = text.lines().find_map(|l| l.split_once("Example: ").map(|(_, e)| e)).expect("an example");
        match calls_in_text(example) {
            TextCalls::Found(calls) => assert_eq!(calls[0].name, "write_file"),
            other => panic!("{example}: {other:?}"),
        }
    }
}
