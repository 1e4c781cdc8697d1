//! A scriptable fake LLM server for tests.
//!
//! [`FakeLlm`] is a tiny hand-written HTTP/1.1 server on a loopback port. It answers each
//! request with the next [`Reply`] of its script, so tests can drive the real HTTP clients
//! (reqwest) through both wire protocols the backends speak:
//!
//! * Ollama native, `POST …/api/chat`;
//! * OpenAI-compatible, `POST …/chat/completions`.
//!
//! Replies built from a protocol-neutral [`Turn`] (and [`Reply::error`]) are rendered in the
//! shape of the protocol the *request* used, so one script serves either backend. A turn goes
//! whole to a request that asks for a whole reply, and as a stream to one that asks for a
//! stream (`"stream": true`): NDJSON lines for Ollama, server-sent events ending in
//! `data: [DONE]` for OpenAI, each in a chunk of its own, in pieces of a few characters (a
//! tool call's arguments too, for OpenAI). [`Streaming`] says how: pieces, delays, a stall, a
//! stream cut before its final event, an error in the middle. Other replies simulate
//! misbehaving servers: stalls, truncated bodies, hang-ups, an empty stream.
//!
//! ```no_run
//! use promptgen_tests::{FakeLlm, Reply, Turn};
//! use serde_json::json;
//!
//! let server = FakeLlm::start(vec![
//!     Reply::turn(Turn::call("write_file", json!({"path": "a.rs", "content": "fn main() {}"}))),
//!     Reply::turn(Turn::text("done")),
//! ]);
//! // point the client under test at server.url(), run it, then inspect what it sent:
//! for request in server.requests() {
//!     assert_eq!(request.json()["messages"][0]["role"], "system");
//! }
//! ```
//!
//! The server depends on std and serde_json only: no async runtime, no HTTP crate.
#![deny(missing_docs)]

pub mod modules;

use std::collections::{HashMap, VecDeque};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use serde_json::{Value, json};

/// Upper bound on the request line plus headers; a client sending more is malformed.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Upper bound on a request body; protects the test process from runaway clients.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

// ---------------------------------------------------------------------------------------------
// Public data types
// ---------------------------------------------------------------------------------------------

/// One HTTP request as the fake server received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    /// Request method, e.g. `POST`.
    pub method: String,
    /// Request target as sent, query string included, e.g. `/v1/chat/completions`.
    pub path: String,
    /// Headers in the order received; names are lowercased, values trimmed.
    pub headers: Vec<(String, String)>,
    /// The body, decoded from `Content-Length` or chunked framing (lossy UTF-8).
    pub body: String,
}

impl RecordedRequest {
    /// The body parsed as JSON.
    ///
    /// # Panics
    /// If the body is not valid JSON (this is test support: a clear panic is the useful outcome).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| {
            panic!("fake LLM server: body of {} {} is not JSON ({e}): {:?}", self.method, self.path, self.body)
        })
    }

    /// The value of the first header called `name` (case-insensitive), if any.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// How a tool call's `arguments` are put on the wire.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum ArgsShape {
    /// What the protocol specifies: a JSON object for Ollama, JSON text in a string for OpenAI.
    #[default]
    Default,
    /// The arguments value itself, in both protocols (llama.cpp has sent objects to OpenAI clients).
    Object,
    /// The arguments serialised to JSON text in a string, in both protocols.
    String,
    /// This exact string as the arguments, e.g. `""` or invalid JSON text; the call's
    /// `arguments` value is ignored.
    RawString(String),
}

/// One tool call in a scripted [`Turn`].
#[derive(Debug, Clone, PartialEq)]
pub struct FakeCall {
    /// Tool (function) name.
    pub name: String,
    /// The arguments, rendered according to `arguments_as`.
    pub arguments: Value,
    /// Call id. Ollama replies carry an id only when this is set; OpenAI replies always carry
    /// one, generated as `call_<n>` (unique per server) when this is `None`.
    pub id: Option<String>,
    /// How `arguments` is put on the wire.
    pub arguments_as: ArgsShape,
}

impl FakeCall {
    /// A call of tool `name` with `arguments`, no explicit id, default argument shape.
    pub fn new(name: &str, arguments: Value) -> FakeCall {
        FakeCall { name: name.to_owned(), arguments, id: None, arguments_as: ArgsShape::Default }
    }

    /// Sets the call id.
    pub fn id(mut self, id: &str) -> Self {
        self.id = Some(id.to_owned());
        self
    }

    /// Sets how the arguments are put on the wire.
    pub fn shape(mut self, shape: ArgsShape) -> Self {
        self.arguments_as = shape;
        self
    }
}

/// A protocol-neutral assistant turn, rendered per request protocol by [`Reply::turn`].
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    /// Text content. Ollama renders `None` as `""`, OpenAI as `null`.
    pub content: Option<String>,
    /// Tool calls, in order; none means a plain text turn.
    pub tool_calls: Vec<FakeCall>,
    /// Reported prompt tokens (Ollama `prompt_eval_count`, OpenAI `usage.prompt_tokens`).
    pub prompt_tokens: u64,
    /// Reported completion tokens (Ollama `eval_count`, OpenAI `usage.completion_tokens`).
    pub completion_tokens: u64,
}

impl Turn {
    /// A text-only turn.
    pub fn text(content: &str) -> Turn {
        Turn { content: Some(content.to_owned()), ..Turn::calls(Vec::new()) }
    }

    /// A turn with exactly one tool call and no content.
    pub fn call(name: &str, arguments: Value) -> Turn {
        Turn::calls(vec![FakeCall::new(name, arguments)])
    }

    /// A turn with these tool calls and no content.
    pub fn calls(calls: Vec<FakeCall>) -> Turn {
        Turn { content: None, tool_calls: calls, prompt_tokens: 10, completion_tokens: 5 }
    }

    /// Sets the text content (e.g. to send text alongside tool calls).
    pub fn with_content(mut self, content: &str) -> Turn {
        self.content = Some(content.to_owned());
        self
    }

    /// Sets the reported token counts (default 10 prompt, 5 completion).
    pub fn tokens(mut self, prompt: u64, completion: u64) -> Turn {
        self.prompt_tokens = prompt;
        self.completion_tokens = completion;
        self
    }
}

/// How a [`Turn`] is streamed to a request that asks for a stream. Each event (OpenAI) or
/// line (Ollama) is one HTTP chunk of a chunked body, written and flushed on its own.
///
/// OpenAI: a first chunk with the role (as llama-server sends it), the text in pieces, each
/// tool call as a first fragment with its `index`, `id`, `name` and empty `arguments`, then
/// the arguments text in pieces; a chunk with the finish reason; the token counts in a chunk
/// with no choices when the request asks for them (`stream_options.include_usage`); then
/// `data: [DONE]`. Ollama: the text in pieces, each tool call whole in a line of its own, then
/// the `done: true` line with the token counts.
#[derive(Debug, Clone, PartialEq)]
pub struct Streaming {
    /// Characters of text, and of a tool call's arguments text, per chunk (at least 1).
    pub piece_chars: usize,
    /// Wait before each chunk after the first.
    pub delay: Duration,
    /// After this many chunks, send nothing for this long (or until the server is dropped),
    /// then close the connection without ending the body.
    pub stall: Option<(usize, Duration)>,
    /// How the stream ends.
    pub end: StreamEnd,
    /// OpenAI: whether the token counts are sent when asked for (llama-cpp-python's streams
    /// never carry them).
    pub usage: bool,
    /// OpenAI: the `system_fingerprint` of every chunk (Ollama's `/v1` sends `fp_ollama`).
    pub fingerprint: Option<String>,
}

impl Default for Streaming {
    fn default() -> Streaming {
        Streaming {
            piece_chars: 4,
            delay: Duration::ZERO,
            stall: None,
            end: StreamEnd::Complete,
            usage: true,
            fingerprint: None,
        }
    }
}

/// How a stream ends.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum StreamEnd {
    /// With the protocol's final event, then the end of the body.
    #[default]
    Complete,
    /// After this many chunks the body ends properly, but without the final event.
    Cut(usize),
    /// After this many chunks the connection closes in the middle of the body.
    HangUp(usize),
    /// After this many chunks, an error: Ollama's `{"error": message}` line, or an OpenAI
    /// `data: {"error": {...}}` event; then the body ends.
    Error(usize, String),
}

/// One scripted answer. Build it with the associated functions ([`Reply::json`],
/// [`Reply::turn`], [`Reply::stall`], …) rather than the variants.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// A response with this status and JSON body, verbatim.
    Json {
        /// HTTP status.
        status: u16,
        /// Body, sent verbatim.
        body: Value,
        /// Extra response headers.
        headers: Vec<(String, String)>,
    },
    /// A 200 assistant turn, rendered per request protocol, whole or streamed as the request
    /// asks.
    Turn {
        /// The turn.
        turn: Turn,
        /// How it is streamed, when the request asks for a stream.
        stream: Streaming,
        /// Extra response headers.
        headers: Vec<(String, String)>,
    },
    /// A 200 with a streamed body given verbatim, whatever the request asked: each piece is
    /// one chunk (empty pieces are skipped). `stream` gives the delay, a stall, and (with
    /// [`StreamEnd::HangUp`]) a hang-up; its other fields do not apply.
    RawStream {
        /// The body's pieces, e.g. `"data: {...}\n\n"`.
        pieces: Vec<String>,
        /// Timing and ending.
        stream: Streaming,
        /// Extra response headers.
        headers: Vec<(String, String)>,
    },
    /// An error body rendered per request protocol.
    Error {
        /// HTTP status.
        status: u16,
        /// The error message.
        message: String,
        /// OpenAI `error.type`.
        kind: String,
        /// OpenAI `error.code`.
        code: Option<String>,
        /// Extra response headers.
        headers: Vec<(String, String)>,
    },
    /// Read the request, send nothing for this long (or until the server is dropped), close.
    Stall(Duration),
    /// A 200 declaring this body's full length but carrying only its first half, then close.
    Truncated {
        /// The full body.
        body: Value,
        /// Extra response headers.
        headers: Vec<(String, String)>,
    },
    /// Close the connection right after reading the request.
    HangUp,
    /// `reply`, answered only once a request whose body contains `key` has arrived (this one
    /// included), or after [`WAIT_CAP`], or when the server is dropped.
    WaitFor {
        /// What a request's body must contain.
        key: String,
        /// The answer.
        reply: Box<Reply>,
    },
}

/// The longest a [`Reply::once_seen`] waits for its request: a client that never sends it
/// gets its answer then, and the [`FakeLlm::timeline`] shows it came late.
pub const WAIT_CAP: Duration = Duration::from_secs(60);

impl Reply {
    /// 200 with this JSON body, verbatim.
    pub fn json(body: Value) -> Reply {
        Reply::status(200, body)
    }

    /// Any status with this JSON body, verbatim.
    pub fn status(status: u16, body: Value) -> Reply {
        Reply::Json { status, body, headers: Vec::new() }
    }

    /// Adds a response header (e.g. `Retry-After`). A `Content-Type` given here replaces the
    /// default `application/json`. No effect on [`Reply::stall`] and [`Reply::hang_up`], which
    /// send no response.
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        match &mut self {
            Reply::Json { headers, .. }
            | Reply::Turn { headers, .. }
            | Reply::RawStream { headers, .. }
            | Reply::Error { headers, .. }
            | Reply::Truncated { headers, .. } => headers.push((name.to_owned(), value.to_owned())),
            Reply::Stall(_) | Reply::HangUp => {}
            Reply::WaitFor { reply, .. } => **reply = reply.as_ref().clone().header(name, value),
        }
        self
    }

    /// This reply, held back until a request whose body contains `key` has arrived (this one
    /// included; at most [`WAIT_CAP`]). Two requests held for each other prove that a client
    /// sent them at the same time, without a clock: a client that sends one after the other's
    /// answer makes the first wait the whole cap, and [`FakeLlm::timeline`] shows the order.
    pub fn once_seen(self, key: &str) -> Reply {
        Reply::WaitFor { key: key.to_owned(), reply: Box::new(self) }
    }

    /// A 200 assistant turn rendered in the shape of the protocol the request used: a path
    /// ending in `/api/chat` gets the Ollama shape, one ending in `/chat/completions` the
    /// OpenAI shape. On any other path (a client calling the wrong endpoint) the reply is
    /// consumed and answered with a 404 error, as a real server would. A request with
    /// `"stream": true` gets it streamed as [`Streaming`] says (by default in pieces of 4
    /// characters, at once); any other, whole.
    pub fn turn(turn: Turn) -> Reply {
        Reply::Turn { turn, stream: Streaming::default(), headers: Vec::new() }
    }

    /// A 200 whose streamed body is these pieces verbatim, one chunk each, whatever the
    /// request asked (`Content-Type: application/x-ndjson` on `/api/…` paths,
    /// `text/event-stream` on others).
    pub fn raw_stream(pieces: &[&str]) -> Reply {
        let pieces = pieces.iter().map(|piece| piece.to_string()).collect();
        Reply::RawStream { pieces, stream: Streaming::default(), headers: Vec::new() }
    }

    /// A 200 with a streamed body that ends at once, empty: what llama-cpp-python sends to a
    /// streamed request that offers tools (its log: "Automatic streaming tool choice is not
    /// supported").
    pub fn empty_stream() -> Reply {
        Reply::raw_stream(&[])
    }

    /// Streams the turn in pieces of `chars` characters.
    pub fn in_pieces(self, chars: usize) -> Reply {
        self.streaming(|stream| stream.piece_chars = chars.max(1))
    }

    /// Waits `delay` before each chunk of the stream after the first.
    pub fn every(self, delay: Duration) -> Reply {
        self.streaming(|stream| stream.delay = delay)
    }

    /// After `chunks` chunks of the stream, sends nothing for `d` (or until the server is
    /// dropped), then closes the connection.
    pub fn stall_after(self, chunks: usize, d: Duration) -> Reply {
        self.streaming(|stream| stream.stall = Some((chunks, d)))
    }

    /// Ends the stream properly after `chunks` chunks, without the final event.
    pub fn cut_after(self, chunks: usize) -> Reply {
        self.streaming(|stream| stream.end = StreamEnd::Cut(chunks))
    }

    /// Closes the connection after `chunks` chunks of the stream, in the middle of the body.
    pub fn hang_up_after(self, chunks: usize) -> Reply {
        self.streaming(|stream| stream.end = StreamEnd::HangUp(chunks))
    }

    /// After `chunks` chunks of the stream, sends an error in the protocol's shape and ends.
    pub fn error_after(self, chunks: usize, message: &str) -> Reply {
        self.streaming(|stream| stream.end = StreamEnd::Error(chunks, message.to_owned()))
    }

    /// OpenAI: no token counts in the stream even when asked (as llama-cpp-python).
    pub fn without_stream_usage(self) -> Reply {
        self.streaming(|stream| stream.usage = false)
    }

    /// OpenAI: every chunk of the stream says `"system_fingerprint": fingerprint`.
    pub fn fingerprint(self, fingerprint: &str) -> Reply {
        self.streaming(|stream| stream.fingerprint = Some(fingerprint.to_owned()))
    }

    fn streaming(mut self, change: impl FnOnce(&mut Streaming)) -> Reply {
        match &mut self {
            Reply::Turn { stream, .. } | Reply::RawStream { stream, .. } => change(stream),
            Reply::WaitFor { reply, .. } => **reply = reply.as_ref().clone().streaming(change),
            other => panic!("fake LLM server: only a turn or a raw stream is streamed, not {other:?}"),
        }
        self
    }

    /// Reads the request, then sends nothing for `d` and closes the connection (a stall past
    /// the client's timeout). Dropping the [`FakeLlm`] ends the stall early.
    pub fn stall(d: Duration) -> Reply {
        Reply::Stall(d)
    }

    /// Sends a 200 whose headers declare the full JSON body's length, then only the first half
    /// of the body, then closes.
    pub fn truncated(body: Value) -> Reply {
        Reply::Truncated { body, headers: Vec::new() }
    }

    /// Closes the connection right after reading the request, without any response.
    pub fn hang_up() -> Reply {
        Reply::HangUp
    }

    /// A protocol-shaped error: Ollama `{"error": message}`, OpenAI
    /// `{"error":{"message","type","param":null,"code":null}}` with type `server_error` for
    /// statuses >= 500 and `invalid_request_error` otherwise.
    ///
    /// The protocol is chosen from the request path like [`Reply::turn`]; on other paths,
    /// those containing `/api/` get the Ollama shape and the rest the OpenAI shape.
    pub fn error(status: u16, message: &str) -> Reply {
        let kind = if status >= 500 { "server_error" } else { "invalid_request_error" };
        Reply::openai_error(status, message, kind, None)
    }

    /// A protocol-shaped error with explicit OpenAI `type` and `code` (e.g. 429
    /// `insufficient_quota`). Requests in the Ollama protocol still get `{"error": message}`.
    pub fn openai_error(status: u16, message: &str, kind: &str, code: Option<&str>) -> Reply {
        Reply::Error {
            status,
            message: message.to_owned(),
            kind: kind.to_owned(),
            code: code.map(str::to_owned),
            headers: Vec::new(),
        }
    }
}

impl From<Turn> for Reply {
    fn from(turn: Turn) -> Reply {
        Reply::turn(turn)
    }
}

/// A loopback URL (`http://127.0.0.1:PORT`) on which nothing listens: connecting is refused.
///
/// The port was free a moment ago; another process could grab it in between, which is
/// unlikely enough for tests.
pub fn refused_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("fake LLM server: bind 127.0.0.1:0");
    let port = listener.local_addr().expect("fake LLM server: local_addr").port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

// ---------------------------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------------------------

/// Something that happened to a request ([`FakeLlm::timeline`]): its index in
/// [`FakeLlm::requests`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    /// The request was read (and recorded).
    Arrived(usize),
    /// Its answer is being written.
    Answered(usize),
}

/// The context a [`FakeLlm`] identified as llama-server says it has (`GET /props`); its
/// `/tokenize` counts one token per word.
pub const LLAMA_SERVER_CONTEXT: u64 = 8192;

/// Which server a [`FakeLlm`] says it is, to the questions a client asks before chatting
/// ([`FakeLlm::identify_as`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Identity {
    /// Says nothing: `GET …/models` is 404, `GET …/api/version` is `0.0.0-fake`.
    #[default]
    Anonymous,
    /// llama.cpp's llama-server: its models are `owned_by: "llamacpp"`, and it answers
    /// `/props`, `/apply-template` and `/tokenize` (see [`LLAMA_SERVER_CONTEXT`]).
    LlamaServer,
    /// llama-cpp-python: `owned_by: "me"`.
    LlamaCppPython,
    /// vLLM: `owned_by: "vllm"`.
    Vllm,
    /// Ollama of this version (`GET /api/version`; `/v1/models` is `owned_by: "library"`).
    Ollama(String),
}

/// A scripted fake LLM server on `127.0.0.1` with an ephemeral port.
///
/// Every request (on any path) consumes the next scripted [`Reply`], except the discovery
/// endpoints, which are answered without touching the script as the server's [`Identity`]
/// says: `GET …/api/version` (`{"version":"0.0.0-fake"}` unless it is Ollama), `GET …/models`
/// (404 unless it is identified) and `GET …/health` (`{"status":"ok"}`). When the script is
/// exhausted the server answers 500 with a protocol-shaped error saying
/// `fake LLM server: script exhausted after N replies`.
///
/// Every request, including ones answered with errors or misbehaviour, is recorded *before*
/// it is answered: chat requests in [`FakeLlm::requests`], discovery ones in
/// [`FakeLlm::discovery`]. Malformed requests (which have no method or path to
/// record) are answered 400 and not recorded.
///
/// Replies can also be routed by what a request carries ([`FakeLlm::route`]), so that clients
/// running several conversations at once each get their own script; [`FakeLlm::timeline`]
/// tells when each request arrived and was answered, relative to the others.
///
/// Dropping the server stops accepting, ends stalls and closes every open connection.
pub struct FakeLlm {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
}

/// See [`FakeLlm::respond_with`].
type Responder = Box<dyn Fn(&Value) -> Option<Reply> + Send>;

/// State shared by the accept loop, the connection threads and the [`FakeLlm`] handle.
struct Shared {
    state: Mutex<State>,
    /// Signalled when `State::stopped` becomes true, to end stalls early, and when a request
    /// arrives, for replies waiting for one ([`Reply::once_seen`]).
    stop_signal: Condvar,
    /// Mirror of `State::stopped` readable without the lock, for the accept loop.
    stopping: AtomicBool,
}

struct State {
    script: VecDeque<Reply>,
    /// Replies for requests whose body contains the key, tried in order before `script`.
    routes: Vec<(String, VecDeque<Reply>)>,
    /// Computes the reply to a chat request from its JSON body, tried after the routes and
    /// before `script`.
    responder: Option<Responder>,
    /// Waited before every scripted answer.
    latency: Duration,
    /// Arrivals and answers, in order.
    timeline: Vec<Moment>,
    /// Scripted replies handed out so far.
    served: usize,
    requests: Vec<RecordedRequest>,
    discovery: Vec<RecordedRequest>,
    identity: Identity,
    /// Counter for generated OpenAI tool call ids.
    next_call_id: u64,
    /// TCP connections accepted so far.
    connections: usize,
    /// Clones of the open connections, so `Drop` can shut them down and wake blocked reads.
    open: HashMap<usize, TcpStream>,
    stopped: bool,
}

impl Shared {
    /// Locks the state, ignoring poisoning: a panicking connection thread must not take the
    /// whole fake server (and every later assertion) down with it.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl FakeLlm {
    /// Starts on 127.0.0.1 with an ephemeral port, serving `script` in order (one reply per
    /// request, any path except the discovery paths).
    ///
    /// # Panics
    /// If the loopback listener cannot be bound.
    pub fn start(script: Vec<Reply>) -> FakeLlm {
        let listener = TcpListener::bind("127.0.0.1:0").expect("fake LLM server: bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("fake LLM server: local_addr");
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                script: script.into(),
                routes: Vec::new(),
                responder: None,
                latency: Duration::ZERO,
                timeline: Vec::new(),
                served: 0,
                requests: Vec::new(),
                discovery: Vec::new(),
                identity: Identity::default(),
                next_call_id: 1,
                connections: 0,
                open: HashMap::new(),
                stopped: false,
            }),
            stop_signal: Condvar::new(),
            stopping: AtomicBool::new(false),
        });
        let accept_shared = Arc::clone(&shared);
        let accept_thread = thread::Builder::new()
            .name(format!("fake-llm-accept-{}", addr.port()))
            .spawn(move || accept_loop(listener, accept_shared))
            .expect("fake LLM server: spawn accept thread");
        FakeLlm { addr, shared, accept_thread: Some(accept_thread) }
    }

    /// `http://127.0.0.1:PORT` (no trailing slash).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Appends a reply to the script.
    pub fn push(&self, reply: Reply) {
        self.shared.lock().script.push_back(reply);
    }

    /// Appends `replies` to the route of `key`: a request whose body contains `key` takes its
    /// answer from there instead of the script (the first route whose key it contains, in the
    /// order routes were made). An exhausted route answers 500, like the script.
    pub fn route(&self, key: &str, replies: Vec<Reply>) {
        let mut state = self.shared.lock();
        match state.routes.iter_mut().find(|(k, _)| k == key) {
            Some((_, queue)) => queue.extend(replies),
            None => state.routes.push((key.to_owned(), replies.into())),
        }
    }

    /// Answers every chat request that no route takes with `responder(body)`, computed from
    /// the request's JSON body (its model, seed, messages...), before the script; a `None`
    /// leaves the request to the script. For clients whose conversations depend on what they
    /// send, e.g. a reply per seed.
    pub fn respond_with(&self, responder: impl Fn(&Value) -> Option<Reply> + Send + 'static) {
        self.shared.lock().responder = Some(Box::new(responder));
    }

    /// Waits `latency` before every scripted answer (each connection on its own, so requests
    /// that arrive together are answered together), as a model's time to reply.
    pub fn set_latency(&self, latency: Duration) {
        self.shared.lock().latency = latency;
    }

    /// When each request arrived and was answered, in the order it happened (indices into
    /// [`FakeLlm::requests`]). A request counts as answered just before the first byte of its
    /// answer is written (after its wait and the latency): whatever the client sends because
    /// of that answer comes after it. A stall or a hang-up is an answer too.
    pub fn timeline(&self) -> Vec<Moment> {
        self.shared.lock().timeline.clone()
    }

    /// Every request received so far, in order (including ones answered with errors or
    /// misbehaviour), except discovery requests.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.lock().requests.clone()
    }

    /// The discovery requests received so far (`GET …/models`, `…/api/version`, `…/health`),
    /// in order.
    pub fn discovery(&self) -> Vec<RecordedRequest> {
        self.shared.lock().discovery.clone()
    }

    /// Answers the discovery requests as `identity` would.
    pub fn identify_as(&self, identity: Identity) {
        self.shared.lock().identity = identity;
    }

    /// Replies not yet served.
    pub fn remaining(&self) -> usize {
        self.shared.lock().script.len()
    }

    /// TCP connections accepted so far; lets tests check that a client reuses connections.
    pub fn connections(&self) -> usize {
        self.shared.lock().connections
    }
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        let open: Vec<TcpStream> = {
            let mut state = self.shared.lock();
            state.stopped = true;
            state.open.drain().map(|(_, stream)| stream).collect()
        };
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.shared.stop_signal.notify_all();
        // Wake connection threads blocked reading (idle keep-alive) or writing.
        for stream in open {
            let _ = stream.shutdown(Shutdown::Both);
        }
        // `accept` has no timeout: a throwaway connection makes it return and see the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(handle) = self.accept_thread.take() {
            let _ = handle.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for (id, stream) in listener.incoming().enumerate() {
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let Ok(stream) = stream else { continue };
        // Real servers send each piece of a stream at once; without this, Nagle's algorithm
        // holds a small chunk back until the client's delayed ACK (40 ms on Linux).
        let _ = stream.set_nodelay(true);
        {
            let mut state = shared.lock();
            // Checked under the lock: `Drop` shuts down every stream registered before it set
            // `stopped`, and none may be registered after.
            if state.stopped {
                break;
            }
            state.connections += 1;
            if let Ok(clone) = stream.try_clone() {
                state.open.insert(id, clone);
            }
        }
        let conn_shared = Arc::clone(&shared);
        let spawned = thread::Builder::new().name(format!("fake-llm-conn-{id}")).spawn(move || {
            serve_connection(&stream, &conn_shared);
            // Shut down explicitly: the clone kept in `open` would keep the socket alive.
            let _ = stream.shutdown(Shutdown::Both);
            conn_shared.lock().open.remove(&id);
        });
        if spawned.is_err() {
            shared.lock().open.remove(&id);
        }
    }
}

/// Serves requests on one connection until the client closes it, a reply ends it, or the
/// server stops.
fn serve_connection(stream: &TcpStream, shared: &Shared) {
    let mut reader = BufReader::new(stream);
    let mut writer = stream;
    loop {
        let request = match read_request(&mut reader, &mut writer) {
            Ok(Some(request)) => request,
            // Clean close between requests, or the socket died: nothing to answer.
            Ok(None) | Err(ReadError::Io) => return,
            Err(ReadError::Malformed(why)) => {
                let body = json!({ "error": format!("fake LLM server: malformed request: {why}") });
                let _ = write_response(&mut writer, 400, &[], &body.to_string(), true);
                return;
            }
        };
        let close_after = request.close_after;
        let Answer { index, wait_for, scripted, action } = answer(shared, request.recorded);
        for key in &wait_for {
            if !wait_until_seen(shared, key) {
                return;
            }
        }
        let latency = shared.lock().latency;
        if scripted && !latency.is_zero() && !pause(shared, latency) {
            return;
        }
        {
            let mut state = shared.lock();
            if state.stopped {
                return;
            }
            // Before the first byte: what the client does because of the answer comes after.
            if let Some(index) = index {
                state.timeline.push(Moment::Answered(index));
            }
        }
        let keep_going = match action {
            Action::Respond { status, headers, body } => {
                write_response(&mut writer, status, &headers, &body, close_after).is_ok()
            }
            Action::Truncated { headers, body } => {
                let _ = write_truncated(&mut writer, &headers, &body);
                false
            }
            Action::Stall(d) => {
                pause(shared, d);
                false
            }
            Action::Stream { headers, chunks, stream } => {
                let ended = write_stream(&mut writer, shared, &headers, &chunks, &stream);
                ended.unwrap_or(false)
            }
            Action::HangUp => false,
        };
        if !keep_going || close_after {
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Choosing and rendering the answer
// ---------------------------------------------------------------------------------------------

/// Waits `d`, or less if the server is dropped meanwhile; whether it is still running.
fn pause(shared: &Shared, d: Duration) -> bool {
    let state = shared.lock();
    // Returns early when `Drop` sets `stopped` and signals.
    let (state, _) = shared.stop_signal.wait_timeout_while(state, d, |s| !s.stopped).unwrap_or_else(|e| e.into_inner());
    !state.stopped
}

/// Waits until a request whose body contains `key` has arrived, at most [`WAIT_CAP`]; whether
/// the server is still running.
fn wait_until_seen(shared: &Shared, key: &str) -> bool {
    let state = shared.lock();
    let unseen = |s: &mut State| !s.stopped && !s.requests.iter().any(|r| r.body.contains(key));
    let (state, _) = shared.stop_signal.wait_timeout_while(state, WAIT_CAP, unseen).unwrap_or_else(|e| e.into_inner());
    !state.stopped
}

/// A request's answer, decided under the lock.
struct Answer {
    /// The request's index in the record; `None` for a discovery request, which is not in
    /// the timeline.
    index: Option<usize>,
    /// Keys of requests to wait for first ([`Reply::once_seen`]).
    wait_for: Vec<String>,
    /// Whether it comes from the script or a route (so it waits the latency).
    scripted: bool,
    action: Action,
}

/// What a connection thread does with a request, decided under the lock.
enum Action {
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    Truncated {
        headers: Vec<(String, String)>,
        body: String,
    },
    Stall(Duration),
    /// A 200 with a chunked body: these chunks, timed and ended as `stream` says (its `end`
    /// is already applied to `chunks`, except for a hang-up).
    Stream {
        headers: Vec<(String, String)>,
        chunks: Vec<String>,
        stream: Streaming,
    },
    HangUp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Ollama,
    OpenAi,
}

/// The chat protocol a path addresses, if it is a chat endpoint.
fn chat_protocol(path: &str) -> Option<Protocol> {
    if path.ends_with("/api/chat") {
        Some(Protocol::Ollama)
    } else if path.ends_with("/chat/completions") {
        Some(Protocol::OpenAi)
    } else {
        None
    }
}

/// The protocol whose error shape a path gets: its chat protocol, else Ollama for `/api/…`
/// paths (Ollama's native API lives there) and OpenAI for the rest.
fn error_protocol(path: &str) -> Protocol {
    chat_protocol(path).unwrap_or(if path.contains("/api/") { Protocol::Ollama } else { Protocol::OpenAi })
}

/// Records the request, then picks and renders its answer, all under one lock so the record
/// order is the answer order.
fn answer(shared: &Shared, request: RecordedRequest) -> Answer {
    let mut state = shared.lock();
    let index = (!is_discovery(&request)).then_some(state.requests.len());
    if let Some(index) = index {
        state.timeline.push(Moment::Arrived(index));
    }
    // Replies waiting for this request may go now.
    shared.stop_signal.notify_all();
    let route = state.routes.iter().position(|(key, _)| request.body.contains(key.as_str()));
    let mut wait_for = Vec::new();
    let action = respond(&mut state, request, route, &mut wait_for);
    Answer { index, scripted: action.1, wait_for, action: action.0 }
}

/// Whether `request` asks what the server is (`GET …/models`, `…/api/version`, `…/health`),
/// which is answered from its [`Identity`] without the script.
fn is_discovery(request: &RecordedRequest) -> bool {
    let path = request.path.split('?').next().unwrap_or_default();
    let get = request.method.eq_ignore_ascii_case("GET");
    (get && ["/api/version", "/health", "/models", "/props"].iter().any(|end| path.ends_with(end)))
        || (!get && ["/apply-template", "/tokenize"].iter().any(|end| path.ends_with(end)))
}

/// The answer to `request` (recorded here): the next reply of route `route`, else of the
/// script; and whether it was scripted.
fn respond(
    state: &mut State,
    request: RecordedRequest,
    route: Option<usize>,
    wait_for: &mut Vec<String>,
) -> (Action, bool) {
    let path = request.path.split('?').next().unwrap_or_default().to_owned();
    // The model echoed in replies: the request's, like real servers.
    let model = serde_json::from_str::<Value>(&request.body)
        .ok()
        .and_then(|v| v.get("model").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| "fake-model".to_owned());
    let ok = |body: Value| Action::Respond { status: 200, headers: Vec::new(), body: body.to_string() };
    if is_discovery(&request) {
        state.discovery.push(request);
        let owner = match &state.identity {
            Identity::Anonymous => None,
            Identity::LlamaServer => Some("llamacpp"),
            Identity::LlamaCppPython => Some("me"),
            Identity::Vllm => Some("vllm"),
            Identity::Ollama(_) => Some("library"),
        };
        let action = if path.ends_with("/api/version") {
            let version = match &state.identity {
                Identity::Ollama(version) => version.clone(),
                _ => "0.0.0-fake".to_owned(),
            };
            ok(json!({ "version": version }))
        } else if path.ends_with("/health") {
            ok(json!({ "status": "ok" }))
        } else if !matches!(state.identity, Identity::LlamaServer) && !path.ends_with("/models") {
            error_action(&path, 404, "fake LLM server: not llama-server", "not_found_error", None, Vec::new())
        } else if path.ends_with("/props") {
            ok(json!({ "default_generation_settings": { "n_ctx": LLAMA_SERVER_CONTEXT } }))
        } else if path.ends_with("/apply-template") {
            // The prompt as the messages' contents, one after the other.
            let body: Value = serde_json::from_str(&state.discovery.last().map(|r| r.body.clone()).unwrap_or_default())
                .unwrap_or(Value::Null);
            let prompt: Vec<&str> =
                body["messages"].as_array().into_iter().flatten().filter_map(|m| m["content"].as_str()).collect();
            ok(json!({ "prompt": prompt.join("\n") }))
        } else if path.ends_with("/tokenize") {
            // One token per word: enough to tell a prompt that fits from one that does not.
            let body: Value = serde_json::from_str(&state.discovery.last().map(|r| r.body.clone()).unwrap_or_default())
                .unwrap_or(Value::Null);
            let words = body["content"].as_str().unwrap_or_default().split_whitespace().count();
            ok(json!({ "tokens": (0..words).collect::<Vec<_>>() }))
        } else if let Some(owner) = owner {
            ok(json!({ "object": "list", "data": [{ "id": model, "object": "model", "owned_by": owner }] }))
        } else {
            error_action(&path, 404, "fake LLM server: no model list", "not_found_error", None, Vec::new())
        };
        return (action, false);
    }
    state.requests.push(request);

    let computed = match (&state.responder, route, chat_protocol(&path)) {
        (Some(responder), None, Some(_)) => {
            let body =
                serde_json::from_str::<Value>(&state.requests.last().map(|r| r.body.clone()).unwrap_or_default())
                    .unwrap_or(Value::Null);
            responder(&body)
        }
        _ => None,
    };
    let next = match (computed, route) {
        (Some(reply), _) => Ok(reply),
        (None, Some(route)) => state.routes[route].1.pop_front().ok_or_else(|| {
            format!("fake LLM server: route `{}` exhausted after {} replies", state.routes[route].0, state.served)
        }),
        (None, None) => state
            .script
            .pop_front()
            .ok_or_else(|| format!("fake LLM server: script exhausted after {} replies", state.served)),
    };
    let mut reply = match next {
        Ok(reply) => reply,
        Err(message) => return (error_action(&path, 500, &message, "server_error", None, Vec::new()), false),
    };
    state.served += 1;
    while let Reply::WaitFor { key, reply: inner } = reply {
        wait_for.push(key);
        reply = *inner;
    }
    (render(state, &path, &model, reply), true)
}

/// `reply` to the request last recorded, at `path`, which asked for `model`.
fn render(state: &mut State, path: &str, model: &str, reply: Reply) -> Action {
    let path = path.to_owned();
    let asked = serde_json::from_str::<Value>(&state.requests.last().map(|r| r.body.clone()).unwrap_or_default())
        .unwrap_or(Value::Null);
    let wants_stream = asked["stream"] == json!(true);
    let wants_usage = asked["stream_options"]["include_usage"] == json!(true);
    match reply {
        Reply::Json { status, body, headers } => Action::Respond { status, headers, body: body.to_string() },
        Reply::Turn { turn, stream, headers } => match chat_protocol(&path) {
            Some(Protocol::Ollama) if wants_stream => {
                let chunks = ended(ollama_chunks(&turn, model, &stream), &stream, Protocol::Ollama);
                Action::Stream { headers: with_content_type(headers, Protocol::Ollama), chunks, stream }
            }
            Some(Protocol::Ollama) => {
                Action::Respond { status: 200, headers, body: render_ollama(&turn, model).to_string() }
            }
            Some(Protocol::OpenAi) if wants_stream => {
                let usage = wants_usage && stream.usage;
                let chunks = openai_chunks(&turn, model, &mut state.next_call_id, &stream, usage);
                let chunks = ended(chunks, &stream, Protocol::OpenAi);
                Action::Stream { headers: with_content_type(headers, Protocol::OpenAi), chunks, stream }
            }
            Some(Protocol::OpenAi) => {
                let body = render_openai(&turn, model, &mut state.next_call_id);
                Action::Respond { status: 200, headers, body: body.to_string() }
            }
            None => {
                let message = format!(
                    "fake LLM server: scripted a turn, but {path} is not a chat endpoint \
                     (…/api/chat or …/chat/completions)"
                );
                error_action(&path, 404, &message, "invalid_request_error", None, headers)
            }
        },
        Reply::RawStream { pieces, stream, headers } => {
            let headers = with_content_type(headers, error_protocol(&path));
            Action::Stream { headers, chunks: pieces.into_iter().filter(|p| !p.is_empty()).collect(), stream }
        }
        Reply::Error { status, message, kind, code, headers } => {
            error_action(&path, status, &message, &kind, code.as_deref(), headers)
        }
        Reply::Truncated { body, headers } => Action::Truncated { headers, body: body.to_string() },
        Reply::Stall(d) => Action::Stall(d),
        Reply::HangUp => Action::HangUp,
        Reply::WaitFor { reply, .. } => render(state, &path, model, *reply),
    }
}

/// The headers of a stream in `protocol`, with its content type unless one is given.
fn with_content_type(mut headers: Vec<(String, String)>, protocol: Protocol) -> Vec<(String, String)> {
    if !headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("content-type")) {
        let kind = match protocol {
            Protocol::Ollama => "application/x-ndjson",
            Protocol::OpenAi => "text/event-stream",
        };
        headers.push(("Content-Type".to_owned(), kind.to_owned()));
    }
    headers
}

/// A stream's chunks as its `end` says: all of them, the first `n` (cut, hang-up), or the
/// first `n` and an error.
fn ended(mut chunks: Vec<String>, stream: &Streaming, protocol: Protocol) -> Vec<String> {
    match &stream.end {
        StreamEnd::Complete => {}
        StreamEnd::Cut(n) | StreamEnd::HangUp(n) => chunks.truncate(*n),
        StreamEnd::Error(n, message) => {
            chunks.truncate(*n);
            chunks.push(match protocol {
                Protocol::Ollama => format!("{}\n", json!({ "error": message })),
                Protocol::OpenAi => format!(
                    "data: {}\n\n",
                    json!({ "error": { "message": message, "type": "server_error", "param": null, "code": null } })
                ),
            });
        }
    }
    chunks
}

/// `text` in pieces of `chars` characters (none for an empty text).
fn pieces(text: &str, chars: usize) -> Vec<String> {
    let characters: Vec<char> = text.chars().collect();
    characters.chunks(chars.max(1)).map(|piece| piece.iter().collect()).collect()
}

fn ollama_chunks(turn: &Turn, model: &str, stream: &Streaming) -> Vec<String> {
    let line = |message: Value| {
        let chunk = json!({ "model": model, "created_at": "2026-01-01T00:00:00Z", "message": message, "done": false });
        format!("{chunk}\n")
    };
    let mut chunks: Vec<String> = pieces(turn.content.as_deref().unwrap_or_default(), stream.piece_chars)
        .into_iter()
        .map(|piece| line(json!({ "role": "assistant", "content": piece })))
        .collect();
    let whole = render_ollama(turn, model);
    // Ollama holds a tool call back until it is complete, then sends it whole.
    if let Some(calls) = whole["message"]["tool_calls"].as_array() {
        for call in calls {
            chunks.push(line(json!({ "role": "assistant", "content": "", "tool_calls": [call] })));
        }
    }
    let mut last = whole;
    last["message"] = json!({ "role": "assistant", "content": "" });
    chunks.push(format!("{last}\n"));
    chunks
}

fn openai_chunks(turn: &Turn, model: &str, next_call_id: &mut u64, stream: &Streaming, usage: bool) -> Vec<String> {
    let event = |choices: Value, usage: Option<Value>| {
        let mut chunk = json!({ "id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model, "choices": choices });
        if let Some(fingerprint) = &stream.fingerprint {
            chunk["system_fingerprint"] = json!(fingerprint);
        }
        if let Some(usage) = usage {
            chunk["usage"] = usage;
        }
        format!("data: {chunk}\n\n")
    };
    let delta = |delta: Value, finish_reason: Value| {
        event(json!([{ "index": 0, "delta": delta, "finish_reason": finish_reason }]), None)
    };
    let mut chunks = vec![delta(json!({ "role": "assistant", "content": null }), Value::Null)];
    for piece in pieces(turn.content.as_deref().unwrap_or_default(), stream.piece_chars) {
        chunks.push(delta(json!({ "content": piece }), Value::Null));
    }
    for (index, call) in turn.tool_calls.iter().enumerate() {
        let id = call.id.clone().unwrap_or_else(|| {
            let id = format!("call_{next_call_id}");
            *next_call_id += 1;
            id
        });
        let fragment =
            |function: Value| delta(json!({ "tool_calls": [{ "index": index, "function": function }] }), Value::Null);
        match render_arguments(call, false) {
            Value::String(text) => {
                let first = json!({ "index": index, "id": id, "type": "function", "function": { "name": call.name, "arguments": "" } });
                chunks.push(delta(json!({ "tool_calls": [first] }), Value::Null));
                for piece in pieces(&text, stream.piece_chars) {
                    chunks.push(fragment(json!({ "arguments": piece })));
                }
            }
            other => {
                let first = json!({ "index": index, "id": id, "type": "function", "function": { "name": call.name, "arguments": other } });
                chunks.push(delta(json!({ "tool_calls": [first] }), Value::Null));
            }
        }
    }
    let finish_reason = if turn.tool_calls.is_empty() { "stop" } else { "tool_calls" };
    chunks.push(delta(json!({}), json!(finish_reason)));
    if usage {
        let counts = json!({
            "prompt_tokens": turn.prompt_tokens,
            "completion_tokens": turn.completion_tokens,
            "total_tokens": turn.prompt_tokens + turn.completion_tokens,
        });
        chunks.push(event(json!([]), Some(counts)));
    }
    chunks.push("data: [DONE]\n\n".to_owned());
    chunks
}

fn error_action(
    path: &str,
    status: u16,
    message: &str,
    kind: &str,
    code: Option<&str>,
    headers: Vec<(String, String)>,
) -> Action {
    let body = match error_protocol(path) {
        Protocol::Ollama => json!({ "error": message }),
        Protocol::OpenAi => json!({
            "error": { "message": message, "type": kind, "param": null, "code": code }
        }),
    };
    Action::Respond { status, headers, body: body.to_string() }
}

/// The wire value of a call's arguments; `object_by_default` is the protocol's default shape.
fn render_arguments(call: &FakeCall, object_by_default: bool) -> Value {
    match &call.arguments_as {
        ArgsShape::Default if object_by_default => call.arguments.clone(),
        ArgsShape::Object => call.arguments.clone(),
        ArgsShape::Default | ArgsShape::String => Value::String(call.arguments.to_string()),
        ArgsShape::RawString(raw) => Value::String(raw.clone()),
    }
}

fn render_ollama(turn: &Turn, model: &str) -> Value {
    let mut message = json!({
        "role": "assistant",
        "content": turn.content.clone().unwrap_or_default(),
    });
    if !turn.tool_calls.is_empty() {
        let calls: Vec<Value> = turn
            .tool_calls
            .iter()
            .enumerate()
            .map(|(index, call)| {
                let mut rendered = json!({
                    "function": {
                        "index": index,
                        "name": call.name,
                        "arguments": render_arguments(call, true),
                    }
                });
                if let Some(id) = &call.id {
                    rendered["id"] = json!(id);
                }
                rendered
            })
            .collect();
        message["tool_calls"] = Value::Array(calls);
    }
    json!({
        "model": model,
        "created_at": "2026-01-01T00:00:00Z",
        "message": message,
        "done": true,
        "done_reason": "stop",
        "total_duration": 1000,
        "load_duration": 10,
        "prompt_eval_count": turn.prompt_tokens,
        "eval_count": turn.completion_tokens,
    })
}

fn render_openai(turn: &Turn, model: &str, next_call_id: &mut u64) -> Value {
    let mut message = json!({ "role": "assistant", "content": turn.content });
    if !turn.tool_calls.is_empty() {
        let calls: Vec<Value> = turn
            .tool_calls
            .iter()
            .map(|call| {
                let id = call.id.clone().unwrap_or_else(|| {
                    let id = format!("call_{next_call_id}");
                    *next_call_id += 1;
                    id
                });
                json!({
                    "id": id,
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": render_arguments(call, false),
                    }
                })
            })
            .collect();
        message["tool_calls"] = Value::Array(calls);
    }
    let finish_reason = if turn.tool_calls.is_empty() { "stop" } else { "tool_calls" };
    json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{ "index": 0, "message": message, "finish_reason": finish_reason }],
        "usage": {
            "prompt_tokens": turn.prompt_tokens,
            "completion_tokens": turn.completion_tokens,
            "total_tokens": turn.prompt_tokens + turn.completion_tokens,
        }
    })
}

// ---------------------------------------------------------------------------------------------
// HTTP/1.1 framing
// ---------------------------------------------------------------------------------------------

struct ParsedRequest {
    recorded: RecordedRequest,
    /// The client asked to close after this exchange (`Connection: close`, or HTTP/1.0
    /// without keep-alive).
    close_after: bool,
}

enum ReadError {
    /// The socket failed or closed mid-request: no one to answer.
    Io,
    /// The bytes are not an HTTP request we understand: answer 400 and close.
    Malformed(String),
}

impl From<io::Error> for ReadError {
    fn from(_: io::Error) -> Self {
        ReadError::Io
    }
}

fn malformed<T>(why: impl Into<String>) -> Result<T, ReadError> {
    Err(ReadError::Malformed(why.into()))
}

/// Reads one CRLF- (or LF-) terminated line without its terminator; `None` at a clean EOF.
/// `budget` caps the bytes read across the request head.
fn read_line(reader: &mut impl BufRead, budget: &mut usize) -> Result<Option<String>, ReadError> {
    let mut line = Vec::new();
    // `take` bounds the read so a client streaming an endless line cannot exhaust memory.
    let n = reader.by_ref().take(*budget as u64 + 1).read_until(b'\n', &mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if n > *budget {
        return malformed("request head too large");
    }
    *budget -= n;
    if line.last() != Some(&b'\n') {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
    }
    line.pop();
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    Ok(Some(String::from_utf8_lossy(&line).into_owned()))
}

/// Reads one request; `Ok(None)` when the client closed the connection between requests.
/// `writer` is used only for `100 Continue`.
fn read_request(reader: &mut impl BufRead, writer: &mut impl Write) -> Result<Option<ParsedRequest>, ReadError> {
    let mut budget = MAX_HEAD_BYTES;
    // RFC 9112 §2.2: ignore empty lines before the request line.
    let request_line = loop {
        match read_line(reader, &mut budget)? {
            None => return Ok(None),
            Some(line) if line.is_empty() => continue,
            Some(line) => break line,
        }
    };
    let mut parts = request_line.split_whitespace();
    let (Some(method), Some(path), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return malformed(format!("bad request line {request_line:?}"));
    };
    if !version.starts_with("HTTP/1.") {
        return malformed(format!("unsupported version {version:?}"));
    }

    let mut headers = Vec::new();
    loop {
        let Some(line) = read_line(reader, &mut budget)? else {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
        };
        if line.is_empty() {
            break;
        }
        let Some((name, value)) = line.split_once(':') else {
            return malformed(format!("bad header line {line:?}"));
        };
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let header = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());

    let connection = header("connection").unwrap_or_default().to_ascii_lowercase();
    let close_after = connection.contains("close") || (version == "HTTP/1.0" && !connection.contains("keep-alive"));
    let chunked = header("transfer-encoding").is_some_and(|te| te.to_ascii_lowercase().contains("chunked"));
    let content_length = match header("content-length") {
        None => None,
        Some(v) => match v.parse::<usize>() {
            Ok(n) if n <= MAX_BODY_BYTES => Some(n),
            _ => return malformed(format!("bad content-length {v:?}")),
        },
    };
    if header("expect").is_some_and(|e| e.eq_ignore_ascii_case("100-continue")) {
        writer.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
        writer.flush()?;
    }

    // Chunked framing wins over Content-Length when both are present (RFC 9112 §6.3).
    let body = if chunked {
        read_chunked(reader)?
    } else if let Some(len) = content_length {
        let mut body = vec![0; len];
        reader.read_exact(&mut body)?;
        body
    } else {
        Vec::new()
    };

    Ok(Some(ParsedRequest {
        recorded: RecordedRequest {
            method: method.to_owned(),
            path: path.to_owned(),
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        },
        close_after,
    }))
}

/// Decodes a chunked body: `size[;ext]\r\n data \r\n` … `0\r\n [trailers] \r\n`.
fn read_chunked(reader: &mut impl BufRead) -> Result<Vec<u8>, ReadError> {
    let mut body = Vec::new();
    let mut budget = MAX_HEAD_BYTES;
    loop {
        let Some(line) = read_line(reader, &mut budget)? else {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
        };
        let size_text = line.split(';').next().unwrap_or_default().trim();
        let Ok(size) = usize::from_str_radix(size_text, 16) else {
            return malformed(format!("bad chunk size line {line:?}"));
        };
        if size == 0 {
            break;
        }
        if body.len() + size > MAX_BODY_BYTES {
            return malformed("chunked body too large");
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..])?;
        match read_line(reader, &mut budget)? {
            Some(rest) if rest.is_empty() => {}
            Some(rest) => return malformed(format!("chunk longer than declared: {rest:?}")),
            None => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
        }
    }
    // Trailer fields, if any, end with an empty line; they are not recorded.
    loop {
        match read_line(reader, &mut budget)? {
            Some(line) if line.is_empty() => return Ok(body),
            Some(_) => {}
            None => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
        }
    }
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Payload Too Large",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        499 => "Client Closed Request",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

/// The status line and headers, with `Content-Length` set to `content_length`.
fn response_head(status: u16, headers: &[(String, String)], content_length: usize, close: bool) -> String {
    let mut head = format!("HTTP/1.1 {status} {}\r\n", reason_phrase(status));
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("content-type")) {
        head.push_str("Content-Type: application/json\r\n");
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!("Content-Length: {content_length}\r\n"));
    if close {
        head.push_str("Connection: close\r\n");
    }
    head.push_str("\r\n");
    head
}

fn write_response(
    writer: &mut impl Write,
    status: u16,
    headers: &[(String, String)],
    body: &str,
    close: bool,
) -> io::Result<()> {
    let mut bytes = response_head(status, headers, body.len(), close).into_bytes();
    bytes.extend_from_slice(body.as_bytes());
    writer.write_all(&bytes)?;
    writer.flush()
}

/// Writes a 200 with a chunked body of `chunks`, timed as `stream` says. Whether the
/// connection can serve another request (the body ended properly).
fn write_stream(
    writer: &mut impl Write,
    shared: &Shared,
    headers: &[(String, String)],
    chunks: &[String],
    stream: &Streaming,
) -> io::Result<bool> {
    let mut head = String::from("HTTP/1.1 200 OK\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("Transfer-Encoding: chunked\r\n\r\n");
    writer.write_all(head.as_bytes())?;
    writer.flush()?;
    for (index, chunk) in chunks.iter().enumerate() {
        if let Some((after, d)) = stream.stall
            && index == after
        {
            pause(shared, d);
            return Ok(false);
        }
        if index > 0 && !stream.delay.is_zero() && !pause(shared, stream.delay) {
            return Ok(false);
        }
        writer.write_all(format!("{:x}\r\n{chunk}\r\n", chunk.len()).as_bytes())?;
        writer.flush()?;
    }
    if let Some((after, d)) = stream.stall
        && after >= chunks.len()
    {
        pause(shared, d);
        return Ok(false);
    }
    if matches!(stream.end, StreamEnd::HangUp(_)) {
        return Ok(false);
    }
    writer.write_all(b"0\r\n\r\n")?;
    writer.flush()?;
    Ok(true)
}

fn write_truncated(writer: &mut impl Write, headers: &[(String, String)], body: &str) -> io::Result<()> {
    // No `Connection: close`: this simulates a server dying mid-body, not a planned close.
    let mut bytes = response_head(200, headers, body.len(), false).into_bytes();
    bytes.extend_from_slice(&body.as_bytes()[..body.len() / 2]);
    writer.write_all(&bytes)?;
    writer.flush()
}
