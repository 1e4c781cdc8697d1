//! Streamed replies: both protocols' framing, and the assembly of a reply from its pieces.
//!
//! - Ollama streams NDJSON: one JSON object per line, each with a piece of `message.content`
//!   (or whole tool calls, which Ollama holds back until they are complete), the last with
//!   `done: true`, `done_reason` and the token counts. An error after the stream began is an
//!   `{"error": "..."}` line.
//! - OpenAI-compatible servers stream server-sent events: `data: {chunk}` events whose
//!   `choices[0].delta` holds a piece of the text or fragments of tool calls (keyed by
//!   `index`; `id` and `name` in the first fragment of a call, the `arguments` text spread
//!   over many), then `data: [DONE]`. Token counts come in a last chunk with no choices when
//!   the request asks for them (`stream_options.include_usage`). An error after the stream
//!   began is an `{"error": {...}}` chunk, or (llama-server) an `error: {...}` event.
//!
//! A [`Decoder`] takes a body's bytes in pieces of any size, as they arrive, and gives the same
//! result however they are split. The server is untrusted: nothing it sends makes the decoder
//! panic, and a line may not grow past a bound. A stream that ends before its final event is
//! [`StreamError::Unfinished`], never a reply: the backends then ask again without streaming.

use serde_json::Value;

use super::chat::{Progress, PromptCache, Usage};
use crate::chat::Arguments;
use crate::report::excerpt;

/// The longest line either framing accepts. A streamed line holds one piece of a reply; even a
/// whole reply sent as one line (a server that ignored `stream`) is far smaller.
const MAX_LINE: usize = 32 * 1024 * 1024;

/// A reply put together from its pieces (or read whole): the text, the tool calls with the ids
/// the server gave them (if any), the token counts and the finish reason.
#[derive(Debug, Clone, PartialEq)]
pub struct AssembledReply {
    /// The text, every piece joined.
    pub content: String,
    /// The native tool calls, in the server's order.
    pub tool_calls: Vec<AssembledCall>,
    /// Token counts, when the reply carried them: an OpenAI-compatible stream carries them
    /// only when asked to, and some servers' streams never do.
    pub usage: Option<Usage>,
    /// Why the model stopped, as the server says it.
    pub finish_reason: Option<String>,
    /// What the server says it read of the prompt and took from its cache.
    pub prompt_cache: Option<PromptCache>,
}

/// One tool call of an [`AssembledReply`].
#[derive(Debug, Clone, PartialEq)]
pub struct AssembledCall {
    /// The server's id for the call, if it sent one.
    pub id: Option<String>,
    /// The tool's name.
    pub name: String,
    /// Its arguments.
    pub arguments: Arguments,
    /// The arguments exactly as the server sent them, when it sent them as text: what is
    /// echoed back to it, so that the history it sees again is the one it generated and its
    /// prompt cache still matches (see `exchange::SentArguments`).
    pub arguments_text: Option<String>,
}

/// Why a stream gave no reply.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The server reported an error in the stream.
    #[error("the server reported an error in its streamed reply: {body}")]
    Server {
        /// The error as an error body, `{"error": ...}`, in the protocol's own shape.
        body: String,
    },
    /// A piece of the stream is not what the protocol promises.
    #[error("a piece of the streamed reply is not valid: {detail}; it began with: {start}")]
    Malformed {
        /// What is wrong with it.
        detail: String,
        /// Its first characters.
        start: String,
    },
    /// The stream ended before its final event.
    #[error("the stream ended after {pieces} pieces of the reply, without its final event ({expected})")]
    Unfinished {
        /// Pieces of the reply that had arrived.
        pieces: u64,
        /// The final event the protocol promises.
        expected: &'static str,
    },
}

/// Which framing and chunk shape a stream has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// Ollama's NDJSON.
    Ndjson,
    /// Server-sent events of OpenAI-compatible servers.
    Sse,
}

/// Turns a streamed body, fed in pieces of any size, into the reply it carries.
///
/// ```
/// use codegen_core::__private::stream::Decoder;
///
/// let mut decoder = Decoder::openai();
/// for piece in ["data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\nda", "ta: {\"choices\":[{\"delta\":{\"content\":\"lo\"},",
///               "\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"] {
///     decoder.push(piece.as_bytes()).unwrap();
/// }
/// let reply = decoder.finish().unwrap();
/// assert_eq!((reply.content.as_str(), reply.finish_reason.as_deref()), ("Hello", Some("stop")));
/// ```
#[derive(Debug, Clone)]
pub struct Decoder {
    framing: Framing,
    /// The protocol's reader of one chunk.
    apply: ApplyChunk,
    /// The line being received.
    line: Vec<u8>,
    /// The last byte ended a line with a CR (SSE): a LF right after it ends nothing more.
    after_cr: bool,
    /// SSE: the `data` of the event being received, and whether it has any.
    data: String,
    has_data: bool,
    /// SSE: the event's type (`event:`; llama-server's `error:` lines make it "error").
    event: String,
    failed: Option<StreamError>,
    assembly: Assembly,
}

/// A protocol's reader of one chunk (an NDJSON line, an event's data) into the reply; each
/// protocol module has its own and makes its decoder with it (`Decoder::ollama`,
/// `Decoder::openai`), so this module knows the framings and neither protocol.
pub(crate) type ApplyChunk = fn(&mut Assembly, &str) -> Result<(), StreamError>;

impl Decoder {
    /// A decoder of `framing` whose chunks `apply` reads.
    pub(crate) fn new(framing: Framing, apply: ApplyChunk) -> Decoder {
        Decoder {
            framing,
            apply,
            line: Vec::new(),
            after_cr: false,
            data: String::new(),
            has_data: false,
            event: String::new(),
            failed: None,
            assembly: Assembly::default(),
        }
    }

    /// Takes the next bytes of the body. The first problem (an error the server reported, a
    /// piece that is not valid) is returned, and again on every later call.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), StreamError> {
        let mut rest = bytes;
        while self.failed.is_none() && !rest.is_empty() {
            if std::mem::take(&mut self.after_cr) && rest[0] == b'\n' {
                rest = &rest[1..];
                continue;
            }
            let sse = self.framing == Framing::Sse;
            match rest.iter().position(|&b| b == b'\n' || (sse && b == b'\r')) {
                None => {
                    self.extend_line(rest);
                    rest = &[];
                }
                Some(at) => {
                    self.extend_line(&rest[..at]);
                    self.after_cr = rest[at] == b'\r';
                    rest = &rest[at + 1..];
                    self.end_line();
                }
            }
        }
        self.status()
    }

    /// Whether the protocol's final event has arrived (`done: true`, `data: [DONE]`).
    pub fn is_complete(&self) -> bool {
        self.assembly.complete
    }

    /// The reply so far, when something was added to it since the last call: its text since
    /// then, and counts since the start.
    pub fn progress(&mut self, elapsed: std::time::Duration) -> Option<Progress<'_>> {
        self.assembly.progress(elapsed)
    }

    /// The reply, once the body has ended: an error when the stream reported one, held a
    /// piece that is not valid, or ended before its final event.
    pub fn finish(mut self) -> Result<AssembledReply, StreamError> {
        self.status()?;
        if !self.line.is_empty() {
            match self.framing {
                // A last line without its line end: whole if it reads, else cut off.
                Framing::Ndjson => {
                    let mut tried = self.clone();
                    tried.end_line();
                    if tried.failed.is_none() {
                        self = tried;
                    }
                }
                Framing::Sse => self.end_line(),
            }
        }
        // An event the body ended in the middle of, before the blank line that ends it, is
        // dropped (as the SSE standard says), but for a whole `data: [DONE]`.
        if self.framing == Framing::Sse && self.has_data && self.data.trim() == "[DONE]" {
            self.dispatch();
        }
        self.status()?;
        if !self.assembly.complete {
            let expected = match self.framing {
                Framing::Ndjson => "a line with `done: true`",
                Framing::Sse => "`data: [DONE]`",
            };
            return Err(StreamError::Unfinished { pieces: self.assembly.pieces, expected });
        }
        Ok(self.assembly.into_reply())
    }

    /// Pieces of the reply received so far.
    pub(crate) fn pieces(&self) -> u64 {
        self.assembly.pieces
    }

    /// Whether the server is one known to hold a tool call back until it is complete
    /// (Ollama's `/v1` says so with `system_fingerprint: "fp_ollama"`).
    pub(crate) fn holds_back_tool_calls(&self) -> bool {
        self.assembly.holds_back_tool_calls
    }

    fn status(&self) -> Result<(), StreamError> {
        match &self.failed {
            Some(error) => Err(error.clone()),
            None => Ok(()),
        }
    }

    fn fail(&mut self, error: StreamError) {
        if self.failed.is_none() {
            self.failed = Some(error);
        }
    }

    fn extend_line(&mut self, bytes: &[u8]) {
        if self.line.len() + bytes.len() > MAX_LINE {
            // The line's beginning, wherever the overflow was found.
            let mut start = self.line[..self.line.len().min(400)].to_vec();
            start.extend_from_slice(&bytes[..bytes.len().min(400 - start.len())]);
            self.fail(StreamError::Malformed {
                detail: format!("a line is longer than {MAX_LINE} bytes"),
                start: excerpt(&String::from_utf8_lossy(&start), 200),
            });
            return;
        }
        self.line.extend_from_slice(bytes);
    }

    fn end_line(&mut self) {
        if self.failed.is_some() {
            return;
        }
        let line = std::mem::take(&mut self.line);
        match self.framing {
            Framing::Ndjson => self.ndjson_line(&line),
            Framing::Sse => self.sse_line(&line),
        }
        // Keep the buffer's capacity for the next line.
        self.line = line;
        self.line.clear();
    }

    fn ndjson_line(&mut self, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        let text = text.trim();
        if text.is_empty() || self.assembly.complete {
            return;
        }
        if let Err(error) = (self.apply)(&mut self.assembly, text) {
            self.fail(error);
        }
    }

    fn sse_line(&mut self, line: &[u8]) {
        if line.is_empty() {
            return self.dispatch();
        }
        if line[0] == b':' {
            return; // a comment, e.g. a keep-alive
        }
        let text = String::from_utf8_lossy(line);
        let (field, value) = match text.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (text.as_ref(), ""),
        };
        match field {
            "data" => {
                self.data.push_str(value);
                self.data.push('\n');
                self.has_data = true;
            }
            "event" => self.event = value.to_string(),
            // llama-server reports an error after the stream began as `error: {...}`.
            "error" => {
                self.event = "error".to_string();
                self.data.push_str(value);
                self.data.push('\n');
                self.has_data = true;
            }
            _ => {} // `id`, `retry` and anything unknown
        }
    }

    fn dispatch(&mut self) {
        let event = std::mem::take(&mut self.event);
        if !std::mem::take(&mut self.has_data) {
            return;
        }
        let mut data = std::mem::take(&mut self.data);
        data.pop(); // the last line's `\n`
        if self.assembly.complete {
            return;
        }
        let result = if event == "error" {
            Err(StreamError::Server { body: error_body(&data) })
        } else if data.trim() == "[DONE]" {
            self.assembly.complete = true;
            Ok(())
        } else {
            (self.apply)(&mut self.assembly, &data)
        };
        if let Err(error) = result {
            self.fail(error);
        }
    }
}

/// An error event's data as an error body, `{"error": ...}`.
fn error_body(data: &str) -> String {
    match serde_json::from_str::<Value>(data) {
        Ok(Value::Object(object)) if object.contains_key("error") => Value::Object(object).to_string(),
        Ok(value) => serde_json::json!({ "error": value }).to_string(),
        Err(_) => serde_json::json!({ "error": data.trim() }).to_string(),
    }
}

/// A piece that could not be read, as [`StreamError::Malformed`].
pub(crate) fn malformed(detail: impl std::fmt::Display, piece: &str) -> StreamError {
    StreamError::Malformed { detail: detail.to_string(), start: excerpt(piece, 200) }
}

/// A reply being put together, and how far it has come.
#[derive(Debug, Clone, Default)]
pub(crate) struct Assembly {
    content: String,
    calls: Vec<CallParts>,
    usage: Option<Usage>,
    finish_reason: Option<String>,
    prompt_cache: Option<PromptCache>,
    /// The final event has arrived; nothing after it counts.
    pub complete: bool,
    pub holds_back_tool_calls: bool,
    /// Pieces that added to the reply, and how many of them a progress report has shown.
    pieces: u64,
    pieces_shown: u64,
    /// Where the text not yet shown in a progress report begins.
    text_shown: usize,
    text_chars: u64,
    argument_chars: u64,
    /// The call whose name a progress report shows: the latest one with a name.
    current_tool: Option<usize>,
}

#[derive(Debug, Clone, Default)]
struct CallParts {
    index: Option<u64>,
    id: Option<String>,
    name: String,
    /// Argument text, from fragments that are strings.
    text: String,
    /// Arguments that came as a JSON value other than a string (an object, from llama.cpp).
    value: Option<Value>,
}

impl Assembly {
    /// One piece of the stream added to the reply.
    pub fn piece(&mut self) {
        self.pieces += 1;
    }

    pub fn text(&mut self, text: &str) {
        self.content.push_str(text);
        self.text_chars += text.chars().count() as u64;
    }

    pub fn usage(&mut self, usage: Usage) {
        self.usage = Some(usage);
    }

    pub fn finish_reason(&mut self, reason: String) {
        self.finish_reason = Some(reason);
    }

    pub fn prompt_cache(&mut self, cache: PromptCache) {
        self.prompt_cache = Some(cache);
    }

    /// A tool call that arrived whole (Ollama).
    pub fn whole_call(&mut self, id: Option<String>, name: String, arguments: Value) {
        self.calls.push(CallParts { index: None, id, name, text: String::new(), value: None });
        let position = self.calls.len() - 1;
        self.arguments(position, arguments);
        if !self.calls[position].name.is_empty() {
            self.current_tool = Some(position);
        }
    }

    /// A fragment of a tool call (OpenAI): the call is the one with the fragment's `index`;
    /// without one, the one with its `id`, else a new call when it names a tool and the last
    /// call already has a name, else the last call. The first `id` and `name` given stay;
    /// `arguments` text is appended.
    pub fn call_fragment(&mut self, index: Option<u64>, id: Option<String>, name: Option<String>, arguments: Value) {
        let id = id.filter(|id| !id.is_empty());
        let name = name.filter(|name| !name.is_empty());
        let found = match index {
            Some(index) => self.calls.iter().position(|call| call.index == Some(index)),
            None => match &id {
                Some(id) => self.calls.iter().position(|call| call.id.as_ref() == Some(id)),
                None if name.is_some() => None,
                None => self.calls.len().checked_sub(1),
            }
            .or_else(|| match self.calls.last() {
                Some(last) if id.is_none() && (name.is_none() || last.name.is_empty()) => Some(self.calls.len() - 1),
                _ => None,
            }),
        };
        let position = found.unwrap_or_else(|| {
            self.calls.push(CallParts { index, ..CallParts::default() });
            self.calls.len() - 1
        });
        let call = &mut self.calls[position];
        if call.id.is_none() {
            call.id = id;
        }
        if call.name.is_empty()
            && let Some(name) = name
        {
            call.name = name;
            self.current_tool = Some(position);
        }
        self.arguments(position, arguments);
    }

    fn arguments(&mut self, position: usize, arguments: Value) {
        let call = &mut self.calls[position];
        match arguments {
            Value::Null => {}
            Value::String(text) => {
                self.argument_chars += text.chars().count() as u64;
                call.text.push_str(&text);
            }
            other => {
                self.argument_chars += other.to_string().chars().count() as u64;
                call.value = Some(other);
            }
        }
    }

    fn progress(&mut self, elapsed: std::time::Duration) -> Option<Progress<'_>> {
        if self.pieces == self.pieces_shown {
            return None;
        }
        self.pieces_shown = self.pieces;
        let text = &self.content[self.text_shown..];
        self.text_shown = self.content.len();
        Some(Progress {
            pieces: self.pieces,
            text_chars: self.text_chars,
            argument_chars: self.argument_chars,
            tool: self.current_tool.map(|i| self.calls[i].name.as_str()),
            tool_arguments: self.current_tool.map_or("", |i| self.calls[i].text.as_str()),
            text,
            elapsed,
        })
    }

    fn into_reply(mut self) -> AssembledReply {
        // In `index` order, as a whole reply lists them; calls without one keep their place
        // after those with one.
        self.calls.sort_by_key(|call| call.index.unwrap_or(u64::MAX));
        let tool_calls = self
            .calls
            .into_iter()
            .map(|call| {
                let (arguments, arguments_text) = match (call.text.is_empty(), call.value) {
                    (true, Some(Value::String(text))) => (Arguments::from_json_text(&text), Some(text)),
                    (true, value) => (Arguments::from_value(value.unwrap_or(Value::Null)), None),
                    (false, _) => (Arguments::from_json_text(&call.text), Some(call.text)),
                };
                AssembledCall { id: call.id, name: call.name, arguments, arguments_text }
            })
            .collect();
        AssembledReply {
            content: self.content,
            tool_calls,
            usage: self.usage,
            finish_reason: self.finish_reason,
            prompt_cache: self.prompt_cache,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(mut decoder: Decoder, pieces: &[&str]) -> Result<AssembledReply, StreamError> {
        for piece in pieces {
            let _ = decoder.push(piece.as_bytes());
        }
        decoder.finish()
    }

    #[test]
    fn an_overlong_line_is_refused_however_it_arrives() {
        let long = "x".repeat(MAX_LINE + 1);
        let whole = decode(Decoder::ollama(), &[&long]);
        let split = decode(Decoder::ollama(), &[&long[..10], &long[10..]]);
        assert!(matches!(whole, Err(StreamError::Malformed { .. })), "{whole:?}");
        assert_eq!(whole, split);
    }

    #[test]
    fn fragments_without_an_index_are_joined_by_id_and_name() {
        let mut assembly = Assembly::default();
        assembly.call_fragment(None, Some("a".into()), Some("write_file".into()), Value::String("{\"pa".into()));
        assembly.call_fragment(None, None, None, Value::String("th\":\"x\"}".into()));
        assembly.call_fragment(None, Some("b".into()), Some("finish".into()), Value::String("{}".into()));
        assembly.call_fragment(None, Some("a".into()), None, Value::Null);
        assembly.complete = true;
        let reply = assembly.into_reply();
        let calls: Vec<(Option<&str>, &str)> =
            reply.tool_calls.iter().map(|c| (c.id.as_deref(), c.name.as_str())).collect();
        assert_eq!(calls, [(Some("a"), "write_file"), (Some("b"), "finish")]);
        assert_eq!(reply.tool_calls[0].arguments.to_json_text(), r#"{"path":"x"}"#);
    }
}
