//! One chat exchange over HTTP, the part both HTTP backends share: encode the request, ask
//! for a streamed reply and put it together (or ask for it whole where the server cannot
//! stream, and remember that), send with retries, and turn every failure into the
//! [`BackendError`] that says what to do. Compiled with the `http` feature.

use std::time::{Duration, Instant};

use super::chat::{ChatRequest, ChatResponse, Delivery, Progress};
use super::config::BackendConfig;
use super::error::{BackendError, classify_status, server_error};
use super::http;
use super::http::RetryRecord;
use super::kind::BackendKind;
use super::stream::{self, AssembledReply, StreamError};
use super::wire::IdMinter;
use crate::chat::{Message, ToolCall};
use crate::report::excerpt;

/// Turns a final transport failure into its error.
pub(crate) fn classify_transport(
    backend: BackendKind,
    url: &str,
    timeout: Duration,
    max_output_tokens: u32,
    err: http::TransportError,
) -> BackendError {
    let url = url.to_string();
    let http::TransportError { kind, detail, attempts } = err;
    match kind {
        http::TransportKind::Connect => BackendError::Unreachable { backend, url, detail, attempts },
        http::TransportKind::Timeout => BackendError::Timeout { backend, url, timeout, detail },
        http::TransportKind::Silent(limit) => {
            BackendError::Stalled { backend, url, silent: limit.after, pieces: 0, began: false, limit: limit.name }
        }
        http::TransportKind::Interrupted => BackendError::Interrupted { backend, url, detail, attempts },
        http::TransportKind::Cancelled => BackendError::Cancelled { backend, url },
        http::TransportKind::TooLarge(limit) => BackendError::ReplyTooLarge { backend, url, limit, max_output_tokens },
    }
}

/// How a request asks for its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    /// In one body.
    Whole,
    /// Streamed; `usage`: with token counts in the stream (OpenAI's `stream_options`).
    Stream { usage: bool },
}

/// Why a whole reply could not be read.
pub(crate) enum Unread {
    /// The 2xx body reports an error: the error, as an error body.
    Error(String),
    /// The body is not what the protocol promises: what is wrong.
    Bad(String),
}

/// What an HTTP backend's protocol brings to the [`Exchange`] both share.
pub(crate) trait Wire {
    /// Whether the server sends nothing while the model writes a tool call (Ollama holds each
    /// call back until it is complete), so that a request offering tools may be silent as long
    /// as a whole one.
    const HOLDS_BACK_TOOL_CALLS: bool;
    /// The request without its messages, which go in already encoded (see [`MessageCache`]).
    fn head(&self, request: &ChatRequest<'_>, ask: Ask) -> serde_json::Result<String>;
    /// One message of the history as the server takes it; `sent` holds the argument text of
    /// the calls the server generated, to echo them as they were.
    fn encode(message: &Message, sent: &SentArguments) -> serde_json::Result<String>;
    /// A whole reply's 2xx body, read.
    fn read_whole(body: &str) -> Result<AssembledReply, Unread>;
    /// A decoder of the protocol's streamed replies.
    fn decoder() -> stream::Decoder;
}

/// One chat exchange, the part both HTTP backends share: encodes the request (its history
/// through the cache), asks for a streamed reply and puts it together, or asks for a whole one
/// where the server cannot stream; retries what the policy retries; and turns every failure
/// (transport, error status, a reply that is not valid, an error inside a reply, a stall)
/// into the `BackendError` that says what to do.
pub(crate) struct Exchange {
    kind: BackendKind,
    url: String,
    bearer: Option<String>,
    http: http::HttpClient,
    stream: bool,
    /// The cap the requests send, and the bytes a reply may have for it.
    max_output_tokens: u32,
    reply_limit: u64,
    messages: MessageCache,
    ids: IdMinter,
    cannot: CannotStream,
    sent: SentArguments,
}

/// The arguments of each tool call the server generated, as the text it generated, by call
/// id. Echoing a call re-serialised (keys sorted, spacing changed) would make the history the
/// server sees again differ from what it generated, and llama-server re-reads everything after
/// the first difference instead of reusing its cache.
#[derive(Debug, Default)]
pub(crate) struct SentArguments {
    by_id: std::collections::HashMap<String, (crate::chat::Arguments, String)>,
}

impl SentArguments {
    /// The text to echo for `call`: what the server sent, when it still reads as the same
    /// arguments (a whole JSON object); else `None`, and the caller serialises them.
    pub fn text_of(&self, call: &ToolCall) -> Option<&str> {
        match self.by_id.get(&call.id) {
            Some((arguments, text))
                if *arguments == call.arguments && matches!(call.arguments, crate::chat::Arguments::Object(_)) =>
            {
                Some(text)
            }
            _ => None,
        }
    }
}

/// How long a question about the server may take: it answers from memory, but a local server
/// may be busy loading a model.
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// What the server has shown it cannot stream, remembered for the backend's life so that later
/// calls do not pay for a failed attempt again.
#[derive(Debug, Default)]
struct CannotStream {
    /// Requests that offer tools: why not.
    with_tools: Option<String>,
    /// Any request: why not.
    at_all: Option<String>,
    /// The server refused `stream_options`: streams are asked for without it.
    usage_option: bool,
}

/// What a streamed request came to.
enum Streamed {
    /// The reply, and how it arrived.
    Reply(AssembledReply, Delivery),
    /// The server cannot stream it (why): ask for it whole.
    Unable(String),
}

impl Exchange {
    pub fn new(
        kind: BackendKind,
        url: String,
        bearer: Option<String>,
        config: &BackendConfig,
    ) -> Result<Exchange, BackendError> {
        let http = http::HttpClient::new(config.http.clone(), config.cancel.clone())
            .map_err(|detail| BackendError::Config { backend: kind, url: url.clone(), detail })?;
        Ok(Exchange {
            kind,
            url,
            bearer,
            http,
            stream: config.stream,
            max_output_tokens: config.max_output_tokens,
            reply_limit: config.reply_limit(),
            messages: MessageCache::default(),
            ids: IdMinter::default(),
            cannot: CannotStream::default(),
            sent: SentArguments::default(),
        })
    }

    pub fn chat<W: Wire>(
        &mut self,
        wire: &W,
        request: &ChatRequest<'_>,
        progress: &mut dyn FnMut(&Progress<'_>),
    ) -> Result<ChatResponse, BackendError> {
        let started = Instant::now();
        let tools = !request.tools.is_empty();
        let mut retries = Vec::new();
        let mut fallback = None;
        if self.stream && self.cannot.at_all.is_none() && !(tools && self.cannot.with_tools.is_some()) {
            match self.streamed(wire, request, started, &mut retries, progress)? {
                Streamed::Reply(reply, delivery) => return Ok(self.respond(reply, retries, delivery)),
                Streamed::Unable(reason) => fallback = Some(reason),
            }
        }
        let body = self.body(wire, request, Ask::Whole)?;
        let timeout = self.http.config().request_timeout;
        let reply = self
            .http
            .post_json(&self.url, self.bearer.as_deref(), body, self.reply_limit)
            .map_err(|err| classify_transport(self.kind, &self.url, timeout, self.max_output_tokens, err))?;
        let attempts = reply.retries.len() as u32 + 1;
        retries.extend(reply.retries);
        let whole = self.read_whole::<W>(request.model, reply.status, &reply.body, attempts)?;
        let delivery = fallback.map_or(Delivery::Whole, Delivery::Fallback);
        Ok(self.respond(whole, retries, delivery))
    }

    fn body<W: Wire>(&mut self, wire: &W, request: &ChatRequest<'_>, ask: Ask) -> Result<Vec<u8>, BackendError> {
        let encoding = |e: serde_json::Error| BackendError::Config {
            backend: self.kind,
            url: self.url.clone(),
            detail: format!("could not encode the request: {e}"),
        };
        let head = wire.head(request, ask).map_err(encoding)?;
        let sent = &self.sent;
        self.messages.body(&head, request.messages, |message| W::encode(message, sent)).map_err(encoding)
    }

    /// A whole reply, or the error its status or body says.
    fn read_whole<W: Wire>(
        &self,
        model: &str,
        status: u16,
        body: &str,
        attempts: u32,
    ) -> Result<AssembledReply, BackendError> {
        if !(200..300).contains(&status) {
            return Err(classify_status(self.kind, &self.url, model, status, body, attempts));
        }
        W::read_whole(body).map_err(|unread| match unread {
            Unread::Error(error) => classify_status(self.kind, &self.url, model, 500, &error, attempts),
            Unread::Bad(detail) => BackendError::BadResponse {
                backend: self.kind,
                url: self.url.clone(),
                detail,
                body_start: excerpt(body, 200),
            },
        })
    }

    fn streamed<W: Wire>(
        &mut self,
        wire: &W,
        request: &ChatRequest<'_>,
        started: Instant,
        retries: &mut Vec<RetryRecord>,
        progress: &mut dyn FnMut(&Progress<'_>),
    ) -> Result<Streamed, BackendError> {
        let tools = !request.tools.is_empty();
        let config = self.http.config().clone();
        let limit = |after, name| http::Limit { after, name };
        let whole_request = limit(config.request_timeout, "request_timeout");
        let mut first_byte = limit(config.first_byte_timeout, "first_byte_timeout");
        let mut idle = limit(config.idle_timeout, "idle_timeout");
        if tools && W::HOLDS_BACK_TOOL_CALLS {
            first_byte = first_byte.max_with(whole_request);
            idle = idle.max_with(whole_request);
        }
        let scope = if tools { "requests that offer tools" } else { "requests" };
        loop {
            let body = self.body(wire, request, Ask::Stream { usage: !self.cannot.usage_option })?;
            let (opened, attempt_retries) = self
                .http
                .post_stream(&self.url, self.bearer.as_deref(), body, first_byte, idle, self.reply_limit)
                .map_err(|err| {
                    classify_transport(self.kind, &self.url, config.request_timeout, self.max_output_tokens, err)
                })?;
            let attempts = attempt_retries.len() as u32 + 1;
            retries.extend(attempt_retries);
            let mut bytes = match opened {
                http::Opened::Stream(bytes) => bytes,
                http::Opened::Whole { status, body } if (200..300).contains(&status) => {
                    // A server that ignored `stream` and answered whole.
                    let reply = self.read_whole::<W>(request.model, status, &body, attempts)?;
                    return Ok(Streamed::Reply(reply, Delivery::Whole));
                }
                http::Opened::Whole { status, body } => {
                    let error = classify_status(self.kind, &self.url, request.model, status, &body, attempts);
                    if !matches!(error, BackendError::Status { .. }) {
                        return Err(error);
                    }
                    if !self.cannot.usage_option && body.to_lowercase().contains("stream_options") {
                        // Ask once more without the option; the stream must then bring token
                        // counts of its own, or the reply is asked for whole (below).
                        self.cannot.usage_option = true;
                        continue;
                    }
                    let Some(refusal) = refuses_streaming(status, &body) else { return Err(error) };
                    let reason = format!(
                        "it refused a streamed request with HTTP {status}: {refusal}; {} are asked for whole from now on",
                        if tools && refusal.to_lowercase().contains("tool") { scope } else { "requests" }
                    );
                    self.remember(tools && refusal.to_lowercase().contains("tool"), &reason);
                    return Ok(Streamed::Unable(reason));
                }
            };

            let mut decoder = W::decoder();
            let mut broken = None;
            loop {
                match bytes.next() {
                    Ok(Some(chunk)) => {
                        let pushed = decoder.push(&chunk);
                        if let Err(error) = pushed {
                            return Err(self.stream_error(request.model, error, attempts));
                        }
                        if tools && decoder.holds_back_tool_calls() {
                            bytes.idle = bytes.idle.max_with(whole_request);
                        }
                        if decoder.is_complete() {
                            // Only the end of the body is left: do not wait long for it.
                            bytes.idle.after = bytes.idle.after.min(Duration::from_secs(1));
                        }
                        if let Some(report) = decoder.progress(started.elapsed()) {
                            progress(&report);
                        }
                    }
                    Ok(None) => break,
                    Err(_) if decoder.is_complete() => break,
                    Err(http::ChunkError::Silent(limit)) => {
                        return Err(BackendError::Stalled {
                            backend: self.kind,
                            url: self.url.clone(),
                            silent: limit.after,
                            pieces: decoder.pieces(),
                            began: bytes.begun,
                            limit: limit.name,
                        });
                    }
                    Err(http::ChunkError::Cancelled) => {
                        return Err(BackendError::Cancelled { backend: self.kind, url: self.url.clone() });
                    }
                    Err(http::ChunkError::TooLarge(limit)) => {
                        return Err(BackendError::ReplyTooLarge {
                            backend: self.kind,
                            url: self.url.clone(),
                            limit,
                            max_output_tokens: self.max_output_tokens,
                        });
                    }
                    Err(http::ChunkError::Broken(detail)) => {
                        broken = Some(detail);
                        break;
                    }
                }
            }
            let began = bytes.begun;
            drop(bytes);
            return match decoder.finish() {
                Ok(reply) if reply.usage.is_some() => Ok(Streamed::Reply(reply, Delivery::Streamed)),
                Ok(_) => {
                    let reason = "its streamed reply carried no token counts (llama-cpp-python's never do), which a \
                                  whole reply gives; requests are asked for whole from now on, so that what is \
                                  recorded does not depend on streaming"
                        .to_string();
                    self.remember(false, &reason);
                    Ok(Streamed::Unable(reason))
                }
                Err(StreamError::Unfinished { pieces, expected }) => {
                    let how = match (&broken, began) {
                        (Some(detail), _) => format!("its streamed reply broke off after {pieces} pieces ({detail})"),
                        (None, false) => format!(
                            "it answered a streamed {} with an empty stream (llama-cpp-python does when tools are \
                             offered: \"Automatic streaming tool choice is not supported\")",
                            if tools { "request that offers tools" } else { "request" }
                        ),
                        (None, true) => format!("its streamed reply ended after {pieces} pieces without {expected}"),
                    };
                    let reason = format!("{how}; {scope} are asked for whole from now on");
                    self.remember(tools, &reason);
                    Ok(Streamed::Unable(reason))
                }
                Err(error) => Err(self.stream_error(request.model, error, attempts)),
            };
        }
    }

    fn remember(&mut self, with_tools: bool, reason: &str) {
        let slot = if with_tools { &mut self.cannot.with_tools } else { &mut self.cannot.at_all };
        slot.get_or_insert_with(|| reason.to_string());
    }

    fn stream_error(&self, model: &str, error: StreamError, attempts: u32) -> BackendError {
        match error {
            StreamError::Server { body } => classify_status(self.kind, &self.url, model, 500, &body, attempts),
            StreamError::Malformed { detail, start } => {
                BackendError::BadResponse { backend: self.kind, url: self.url.clone(), detail, body_start: start }
            }
            unfinished @ StreamError::Unfinished { .. } => BackendError::Interrupted {
                backend: self.kind,
                url: self.url.clone(),
                detail: unfinished.to_string(),
                attempts,
            },
        }
    }

    fn respond(&mut self, reply: AssembledReply, retries: Vec<RetryRecord>, delivery: Delivery) -> ChatResponse {
        let tool_calls = reply
            .tool_calls
            .into_iter()
            .map(|call| {
                let id = self.ids.keep_or_mint(call.id);
                if let Some(text) = call.arguments_text {
                    self.sent.by_id.insert(id.clone(), (call.arguments.clone(), text));
                }
                ToolCall { id, name: call.name, arguments: call.arguments }
            })
            .collect();
        ChatResponse {
            message: Message::assistant(reply.content, tool_calls),
            usage: reply.usage.unwrap_or_default(),
            finish_reason: reply.finish_reason,
            retries,
            delivery,
            prompt_cache: reply.prompt_cache,
        }
    }

    /// POSTs `request` as the chat endpoint would take it, but to `url` (a server's endpoint
    /// beside the chat one), once and without retries: the body of a 2xx answer, else `None`.
    pub fn post_beside<W: Wire>(&mut self, wire: &W, request: &ChatRequest<'_>, url: &str) -> Option<String> {
        let body = self.body(wire, request, Ask::Whole).ok()?;
        self.post_text(url, body)
    }

    /// POSTs JSON `body` to `url` once: the body of a 2xx answer, else `None`.
    pub fn post_text(&self, url: &str, body: Vec<u8>) -> Option<String> {
        let (status, body) = self.http.post_once(url, self.bearer.as_deref(), body, 8 << 20).ok()?;
        (200..300).contains(&status).then_some(body)
    }

    /// GETs `url` from the same server (with the same key), to find out what it is: the body
    /// of a 2xx answer, else why there is none.
    pub fn probe(&self, url: &str) -> Result<String, String> {
        match self.http.probe(url, self.bearer.as_deref(), PROBE_TIMEOUT)? {
            (status, body) if (200..300).contains(&status) => Ok(body),
            (status, body) => Err(format!("HTTP {status}: {}", excerpt(&body, 120))),
        }
    }
}

/// What an error status says when it refuses streaming ("streaming is not supported"): its
/// message, else `None`. Only a client error (or 501) counts; "upstream" is not "stream".
fn refuses_streaming(status: u16, body: &str) -> Option<String> {
    if !((400..500).contains(&status) || status == 501) {
        return None;
    }
    let error = server_error(body);
    error.message.to_lowercase().replace("upstream", "").contains("stream").then_some(error.message)
}

/// The wire JSON of each message of a history, kept from one call to the next.
///
/// A history only grows between calls (its first message may be replaced once, by a
/// protocol fallback), yet every call sends all of it: re-encoding a 100 KB history each
/// time was most of the loop's own cost per model call. A message is encoded again only when
/// it differs from the one cached at its index (comparing is a fraction of encoding).
#[derive(Debug, Default)]
pub(crate) struct MessageCache {
    entries: Vec<(Message, String)>,
}

impl MessageCache {
    /// The JSON object `object` (as text) with `"messages": [m0,m1,...]` put first, each
    /// message as `encode` gives it: a request body, in one buffer.
    pub fn body(
        &mut self,
        object: &str,
        messages: &[Message],
        encode: impl Fn(&Message) -> serde_json::Result<String>,
    ) -> serde_json::Result<Vec<u8>> {
        self.entries.truncate(messages.len());
        for (index, message) in messages.iter().enumerate() {
            if self.entries.get(index).is_some_and(|(cached, _)| cached == message) {
                continue;
            }
            self.entries.truncate(index);
            self.entries.push((message.clone(), encode(message)?));
        }
        let rest = object.strip_prefix('{').unwrap_or("}");
        let size = 16 + object.len() + self.entries.iter().map(|(_, json)| json.len() + 1).sum::<usize>();
        let mut out = Vec::with_capacity(size);
        out.extend_from_slice(b"{\"messages\":[");
        for (index, (_, json)) in self.entries.iter().enumerate() {
            if index > 0 {
                out.push(b',');
            }
            out.extend_from_slice(json.as_bytes());
        }
        out.push(b']');
        if rest.trim_start() != "}" {
            out.push(b',');
        }
        out.extend_from_slice(rest.as_bytes());
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_messages_encode_as_a_fresh_encoding_would() {
        let encode = |m: &Message| serde_json::to_string(m);
        let mut cache = MessageCache::default();
        let mut history = vec![Message::system("s"), Message::user("u \"quoted\"\n")];
        let check = |cache: &mut MessageCache, history: &[Message]| {
            let body = cache.body(r#"{"model":"m","stream":false}"#, history, encode).unwrap();
            let fresh = serde_json::json!({"messages": history, "model": "m", "stream": false});
            assert_eq!(serde_json::from_slice::<serde_json::Value>(&body).unwrap(), fresh);
            assert!(body.starts_with(br#"{"messages":["#), "{}", String::from_utf8_lossy(&body));
        };
        check(&mut cache, &history);
        history.push(Message::assistant("a", Vec::new()));
        check(&mut cache, &history);
        // A fallback replaces the first message; a shorter history is a new conversation.
        history[0] = Message::system("s2");
        check(&mut cache, &history);
        check(&mut cache, &history[..1]);
        check(&mut cache, &[]);
        assert_eq!(cache.body("{}", &[], encode).unwrap(), br#"{"messages":[]}"#);
    }
}
