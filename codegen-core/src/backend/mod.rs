//! The servers a step can talk to, behind one trait.
//!
//! - [`ollama`]: Ollama's native `POST /api/chat`.
//! - [`openai`]: `POST {base}/chat/completions`, served by OpenAI, llama.cpp's servers, vLLM,
//!   LM Studio and Ollama's `/v1`.
//! - [`scripted`]: canned turns from a file, for tests and reproducible demos. It is not a
//!   model and never says it is one.
//!
//! Each backend speaks its protocol with serde types of its own and hands the loop the
//! protocol-neutral [`Message`]s of [`crate::chat`].
//!
//! The HTTP backends ask for streamed replies ([`BackendConfig::stream`]) and put each one
//! together from its pieces (`stream.rs`), so that [`Backend::chat_observed`] can show it as it
//! arrives and a stalled server is noticed within [`HttpConfig::idle_timeout`]. The
//! [`ChatResponse`] is the one the same reply asked for whole gives, so nothing recorded
//! depends on whether it streamed. A server that cannot stream a request is asked again
//! without streaming (see [`Delivery`]), and is not asked to stream such requests again.

pub(crate) mod http;
pub mod ollama;
pub mod openai;
pub mod scripted;
pub(crate) mod stream;

use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cancel::Cancel;
use crate::chat::{Message, ToolCall, ToolSpec};
pub use http::{HttpConfig, RetryPolicy, RetryRecord};
use stream::{AssembledReply, StreamError};

/// Which kind of server a backend talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Ollama's native API.
    Ollama,
    /// Any OpenAI-compatible chat-completions server.
    #[serde(rename = "openai")]
    OpenAi,
    /// Canned turns from a file.
    Scripted,
}

impl BackendKind {
    /// The name used in configuration: `ollama`, `openai` or `scripted`.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Ollama => "ollama",
            BackendKind::OpenAi => "openai",
            BackendKind::Scripted => "scripted",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for BackendKind {
    type Err = String;

    fn from_str(s: &str) -> Result<BackendKind, String> {
        match s {
            "ollama" => Ok(BackendKind::Ollama),
            "openai" => Ok(BackendKind::OpenAi),
            "scripted" => Ok(BackendKind::Scripted),
            other => Err(format!("unknown backend `{other}`: expected \"ollama\", \"openai\" or \"scripted\"")),
        }
    }
}

/// One request to the model: the whole history so far.
#[derive(Debug, Clone, Copy)]
pub struct ChatRequest<'a> {
    /// The model's name as the server knows it.
    pub model: &'a str,
    /// The conversation so far.
    pub messages: &'a [Message],
    /// Tools offered natively; empty for the text protocols (then no `tools` field is sent).
    pub tools: &'a [ToolSpec],
    /// Sampling seed, for servers that honour one.
    pub seed: Option<u64>,
    /// Sampling temperature.
    pub temperature: Option<f64>,
}

/// The model's reply to a [`ChatRequest`].
#[derive(Debug, Clone, PartialEq)]
pub struct ChatResponse {
    /// The assistant turn; every native tool call has an id (minted when the server sent none).
    pub message: Message,
    /// Tokens the server reports, when it does.
    pub usage: Usage,
    /// Why the model stopped, as the server says it (`stop`, `tool_calls`, `length`).
    pub finish_reason: Option<String>,
    /// Retries that were needed to get this reply.
    pub retries: Vec<RetryRecord>,
    /// Whether it streamed: the same reply may arrive either way, so this is run-dependent
    /// (a transcript keeps it with the other volatile data).
    pub delivery: Delivery,
}

/// How a reply arrived.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Delivery {
    /// Streamed, piece by piece.
    Streamed,
    /// Whole: streaming is off, this backend has nothing to stream, or the server showed
    /// earlier that it cannot stream this kind of request.
    Whole,
    /// Whole, after the server failed to stream it: why. Such requests are not streamed to
    /// this server again.
    Fallback(String),
}

/// A streamed reply so far, shown after each piece that added to it (see
/// [`Backend::chat_observed`]). For progress displays only: never recorded, since the same
/// reply may arrive in other pieces another time.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Progress<'a> {
    /// Pieces of the reply received so far: server-sent events or NDJSON lines that carried
    /// some of it. Servers send about one token per piece, except that Ollama sends each tool
    /// call whole, in one piece, once the model has written all of it.
    pub pieces: u64,
    /// Characters of the reply's text received so far.
    pub text_chars: u64,
    /// Characters of tool-call arguments received so far.
    pub argument_chars: u64,
    /// The tool the model is calling, as soon as the call's name has arrived (the latest call
    /// of the reply).
    pub tool: Option<&'a str>,
    /// The arguments of that call so far, as text (Ollama sends each call whole, with its
    /// arguments as an object: empty then).
    pub tool_arguments: &'a str,
    /// The text that arrived since the last report.
    pub text: &'a str,
    /// Time since the request was sent, retries included.
    pub elapsed: Duration,
}

/// Token counts of one model call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens of the prompt (`prompt_eval_count` or `usage.prompt_tokens`).
    pub prompt_tokens: Option<u64>,
    /// Tokens generated (`eval_count` or `usage.completion_tokens`).
    pub completion_tokens: Option<u64>,
}

/// A server that answers chat requests.
pub trait Backend {
    /// Which kind of server this is.
    fn kind(&self) -> BackendKind;
    /// Where it is, for messages: a URL, or the script's path.
    fn location(&self) -> String;
    /// Sends the request and waits for the whole reply.
    fn chat(&mut self, request: &ChatRequest<'_>) -> Result<ChatResponse, BackendError>;
    /// Sends the request and shows `progress` the reply as it streams in, then returns the
    /// same response [`Backend::chat`] would. Backends that do not stream show nothing (the
    /// default calls [`Backend::chat`]).
    fn chat_observed(
        &mut self,
        request: &ChatRequest<'_>,
        progress: &mut dyn FnMut(&Progress<'_>),
    ) -> Result<ChatResponse, BackendError> {
        let _ = progress;
        self.chat(request)
    }
}

/// Everything needed to open any backend, e.g. from a configuration file.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BackendConfig {
    /// Which backend.
    pub kind: BackendKind,
    /// Server URL. `None`: the backend's environment variable, then its default.
    pub base_url: Option<String>,
    /// API key for `openai`. `None`: `OPENAI_API_KEY` when set.
    pub api_key: Option<String>,
    /// Ollama's context window in tokens, sent as `options.num_ctx` on every request.
    pub num_ctx: u32,
    /// The most tokens one reply may have: `options.num_predict` for Ollama, `max_tokens`
    /// (`max_completion_tokens` for api.openai.com) for OpenAI-compatible servers.
    pub max_output_tokens: u32,
    /// The file of canned turns, for `scripted`.
    pub script: Option<PathBuf>,
    /// Whether the HTTP backends ask for streamed replies (the default): a step can then show
    /// a reply as it arrives, and a stalled server is noticed within
    /// [`HttpConfig::idle_timeout`] instead of at the end of [`HttpConfig::request_timeout`].
    /// What is recorded is the same either way.
    pub stream: bool,
    /// Timeouts and retries of the HTTP backends.
    pub http: HttpConfig,
    /// When set, the HTTP backends abandon the request in flight at once (between two pieces
    /// of a streamed reply, while a whole reply or the first byte is awaited, or before a
    /// retry) with [`BackendError::Cancelled`]. Never set by default.
    pub cancel: Cancel,
}

impl BackendConfig {
    /// Ollama's default context window is as small as 2048 tokens and overflows silently by
    /// dropping the front of the history (the tools and the system prompt first); this is
    /// enough for a few source files and fits every current code model.
    pub const DEFAULT_NUM_CTX: u32 = 16_384;

    /// Without a cap, a model that babbles generates until the server's context is full
    /// (seen: 4096 tokens and 106 s from a small model on llama-server), and the next request
    /// then overflows it. 4096 tokens is about 16 KB of code: more than one file a call needs.
    pub const DEFAULT_MAX_OUTPUT_TOKENS: u32 = 4_096;

    /// A configuration of `kind` with every other field at its default.
    pub fn new(kind: BackendKind) -> BackendConfig {
        BackendConfig {
            kind,
            base_url: None,
            api_key: None,
            num_ctx: BackendConfig::DEFAULT_NUM_CTX,
            max_output_tokens: BackendConfig::DEFAULT_MAX_OUTPUT_TOKENS,
            script: None,
            stream: true,
            http: HttpConfig::default(),
            cancel: Cancel::new(),
        }
    }

    /// Opens the backend, reading the environment for what the configuration leaves open.
    pub fn open(&self) -> Result<Box<dyn Backend>, BackendError> {
        Ok(match self.kind {
            BackendKind::Ollama => Box::new(ollama::Ollama::from_config(self)?),
            BackendKind::OpenAi => Box::new(openai::OpenAi::from_config(self)?),
            BackendKind::Scripted => {
                let path = self.script.clone().ok_or_else(|| BackendError::Script {
                    path: PathBuf::new(),
                    detail: "the scripted backend needs a script file and none was configured".into(),
                })?;
                Box::new(scripted::Scripted::from_file(&path)?)
            }
        })
    }
}

/// Why a model call failed, with what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// Nothing answered at the URL.
    #[error("could not connect to {backend} at {url} ({attempts} attempts): {detail}\n{}", unreachable_hint(*backend, url))]
    Unreachable {
        /// Which backend.
        backend: BackendKind,
        /// The URL that was tried.
        url: String,
        /// The transport's error.
        detail: String,
        /// How many attempts were made.
        attempts: u32,
    },
    /// The server took longer than the request timeout.
    #[error("{backend} at {url} did not answer within {}s: {detail}\nA local model can be slow, above all on its first request while it loads; raise the request timeout, or use a smaller model.", timeout.as_secs())]
    Timeout {
        /// Which backend.
        backend: BackendKind,
        /// The URL.
        url: String,
        /// The timeout that ran out.
        timeout: Duration,
        /// The transport's error.
        detail: String,
    },
    /// A streamed reply did not begin, or stopped coming, within its silence limit.
    #[error("{backend} at {url} {}\n{}", stalled_what(*silent, *pieces, *began), stalled_hint(*backend, limit))]
    Stalled {
        /// Which backend.
        backend: BackendKind,
        /// The URL.
        url: String,
        /// How long it sent nothing before we gave up.
        silent: Duration,
        /// Pieces of the reply that had arrived.
        pieces: u64,
        /// Whether any byte of the reply's body had arrived.
        began: bool,
        /// The [`HttpConfig`] field whose limit ran out: `first_byte_timeout`, `idle_timeout`,
        /// or `request_timeout` (a request that offers Ollama tools, see [`HttpConfig`]).
        limit: &'static str,
    },
    /// The connection broke before the whole reply arrived, even after retries.
    #[error(
        "{backend} at {url} broke off its reply ({attempts} attempts): {detail}\nCheck the server's log; it may have crashed or run out of memory."
    )]
    Interrupted {
        /// Which backend.
        backend: BackendKind,
        /// The URL.
        url: String,
        /// The transport's error.
        detail: String,
        /// How many attempts were made.
        attempts: u32,
    },
    /// The server does not have the model.
    #[error("{backend} at {url} has no model `{model}`: {server_message}\n{}", model_hint(*backend, model))]
    ModelNotFound {
        /// Which backend.
        backend: BackendKind,
        /// The URL.
        url: String,
        /// The model asked for.
        model: String,
        /// What the server said.
        server_message: String,
    },
    /// The model cannot take a `tools` field.
    #[error(
        "model `{model}` on {backend} does not support native tool calls: {server_message}\nSet `protocol = \"json\"` (or \"blocks\" for small models) for this step; the tools are then described in the prompt."
    )]
    ToolsUnsupported {
        /// Which backend.
        backend: BackendKind,
        /// The model asked for.
        model: String,
        /// What the server said.
        server_message: String,
    },
    /// The conversation no longer fits the server's context window.
    #[error(
        "{backend} at {url} says the conversation no longer fits the model's context window: {server_message}\nGive the server a larger context (llama-server `-c`/`--ctx-size`, llama-cpp-python `--n_ctx`, Ollama `num_ctx`), give the step fewer or smaller inputs, or lower `max_output_tokens` and the step's budget of model calls so that its history stays shorter."
    )]
    ContextOverflow {
        /// Which backend.
        backend: BackendKind,
        /// The URL.
        url: String,
        /// What the server said.
        server_message: String,
    },
    /// The API key is missing, wrong, or lacks access.
    #[error(
        "{backend} at {url} refused the request with HTTP {status}: {server_message}\nCheck the API key: set OPENAI_API_KEY in the environment to a valid key for this server."
    )]
    Unauthorized {
        /// Which backend.
        backend: BackendKind,
        /// The URL.
        url: String,
        /// 401 or 403.
        status: u16,
        /// What the server said.
        server_message: String,
    },
    /// The account has no credit left; retrying does not help.
    #[error(
        "{backend} at {url} says the account's quota is used up: {server_message}\nAdd credit or use another key; this is not retried."
    )]
    QuotaExceeded {
        /// Which backend.
        backend: BackendKind,
        /// The URL.
        url: String,
        /// What the server said.
        server_message: String,
    },
    /// Any other error status.
    #[error("{backend} at {url} answered HTTP {status} ({attempts} attempts): {server_message}{}", status_hint(*backend, *status))]
    Status {
        /// Which backend.
        backend: BackendKind,
        /// The URL.
        url: String,
        /// The final status.
        status: u16,
        /// What the server said.
        server_message: String,
        /// How many attempts were made.
        attempts: u32,
    },
    /// A 2xx reply that is not what the protocol promises.
    #[error(
        "{backend} at {url} sent a reply that is not a valid {backend} chat response: {detail}\nReply began with: {body_start}"
    )]
    BadResponse {
        /// Which backend.
        backend: BackendKind,
        /// The URL.
        url: String,
        /// What is wrong with it.
        detail: String,
        /// The first characters of the body.
        body_start: String,
    },
    /// The URL or client settings are unusable.
    #[error("cannot use {backend} at `{url}`: {detail}")]
    Config {
        /// Which backend.
        backend: BackendKind,
        /// The URL as configured.
        url: String,
        /// What is wrong.
        detail: String,
    },
    /// The request was abandoned because [`BackendConfig::cancel`] was set.
    #[error("the request to {backend} at {url} was abandoned: the step was cancelled")]
    Cancelled {
        /// Which backend.
        backend: BackendKind,
        /// The URL.
        url: String,
    },
    /// The scripted backend's file is unusable.
    #[error("script `{}`: {detail}", path.display())]
    Script {
        /// The script file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The scripted backend ran out of turns.
    #[error("script `{}` has {turns} turns and the step asked for another: the step did not end where the script expected.\nAdd turns to the script, or check the transcript for the turn that went differently.", path.display())]
    ScriptExhausted {
        /// The script file.
        path: PathBuf,
        /// Turns it has.
        turns: usize,
    },
}

fn unreachable_hint(backend: BackendKind, url: &str) -> String {
    // The variables take the server's base URL, not the endpoint this request went to: a
    // user who pastes `.../api/chat` into OLLAMA_HOST gets `.../api/chat/api/chat`.
    let base = url.strip_suffix("/api/chat").or_else(|| url.strip_suffix("/chat/completions")).unwrap_or(url);
    match backend {
        BackendKind::Ollama => format!(
            "Is Ollama running? Start it with `ollama serve` (or the Ollama app), or set OLLAMA_HOST \
             (or `base_url`) to the base URL where it listens instead of {base}."
        ),
        _ => format!(
            "Is the server running? Start it, or set OPENAI_BASE_URL (or `base_url`) to the base URL where it \
             listens instead of {base} (usually ending in /v1); a llama.cpp server, vLLM and LM Studio each print \
             their URL when they start."
        ),
    }
}

fn stalled_what(silent: Duration, pieces: u64, began: bool) -> String {
    let seconds = silent.as_secs_f64();
    match (began, pieces) {
        (false, _) => format!("sent nothing for {seconds} s after the request: its streamed reply never began."),
        (true, 0) => format!("went silent for {seconds} s before the first piece of its streamed reply."),
        (true, pieces) => {
            format!("went silent for {seconds} s in the middle of its streamed reply, after {pieces} pieces of it.")
        }
    }
}

fn stalled_hint(backend: BackendKind, limit: &str) -> String {
    let look = match backend {
        BackendKind::Ollama => "Check that the server is still working (`ollama ps`, its log, its CPU use)",
        _ => "Check that the server is still working (its log, its CPU use)",
    };
    let why = match limit {
        "first_byte_timeout" => {
            "a local server loads the model and reads the whole prompt before its first token, which can take minutes \
             on a CPU"
        }
        "request_timeout" => {
            "Ollama sends nothing while the model writes a tool call, so this request was allowed the whole-request \
             timeout of silence, and a long file written slowly can take longer"
        }
        _ => "a server that stops sending in the middle of a reply has usually stalled or crashed",
    };
    format!("{look}: {why}. If it is only slow, raise `{limit}` (in `HttpConfig`).")
}

fn status_hint(backend: BackendKind, status: u16) -> &'static str {
    match (backend, status) {
        (BackendKind::OpenAi, 404) => {
            "\nCheck the base URL: it must end where `/chat/completions` begins, usually in `/v1` (e.g. http://127.0.0.1:8080/v1)."
        }
        (BackendKind::Ollama, 404) => {
            "\nCheck the URL: Ollama serves `/api/chat` at its root (e.g. http://127.0.0.1:11434), without `/v1`."
        }
        _ => "",
    }
}

fn model_hint(backend: BackendKind, model: &str) -> String {
    match backend {
        BackendKind::Ollama => {
            format!("Download it with `ollama pull {model}`, or choose a model that `ollama list` shows.")
        }
        _ => "Choose a model the server serves (`GET /v1/models` lists them).".to_string(),
    }
}

/// At most `max` characters of `text`, on a char boundary, with an ellipsis when cut.
pub(crate) fn excerpt(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// What an error body says, in either protocol's shape (`{"error": "..."}`,
/// `{"error": {"message": ..., "type": ..., "code": ...}}`); the raw body as the message when
/// it is neither.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ServerError {
    pub message: String,
    /// `error.code`, as text (llama-server sends the HTTP status there as a number).
    pub code: Option<String>,
    /// `error.type`.
    pub kind: Option<String>,
}

pub(crate) fn server_error(body: &str) -> ServerError {
    let raw = || ServerError { message: excerpt(body.trim(), 500), ..ServerError::default() };
    let Ok(value) = serde_json::from_str::<serde_json::Value>(body) else { return raw() };
    let text = |v: Option<&serde_json::Value>| match v {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(serde_json::Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    match value.get("error") {
        Some(serde_json::Value::String(message)) => ServerError { message: message.clone(), ..ServerError::default() },
        Some(serde_json::Value::Object(error)) => ServerError {
            message: error.get("message").and_then(|m| m.as_str()).unwrap_or("(no message)").to_string(),
            code: text(error.get("code")),
            kind: text(error.get("type")),
        },
        _ => raw(),
    }
}

/// Whether an error says the prompt does not fit the context window: OpenAI's and
/// llama-cpp-python's `context_length_exceeded`, llama-server's `exceed_context_size_error`.
fn is_context_overflow(error: &ServerError) -> bool {
    let lower = error.message.to_lowercase();
    error.code.as_deref() == Some("context_length_exceeded")
        || error.kind.as_deref() == Some("exceed_context_size_error")
        || lower.contains("maximum context length")
        || (lower.contains("context") && lower.contains("exceed"))
}

/// Turns a final non-2xx reply into the error that tells the user what to do. Both HTTP
/// backends share it: Ollama's `/v1` speaks the OpenAI shape with Ollama's messages.
pub(crate) fn classify_status(
    backend: BackendKind,
    url: &str,
    model: &str,
    status: u16,
    body: &str,
    attempts: u32,
) -> BackendError {
    let error = server_error(body);
    let lower = error.message.to_lowercase();
    let code = error.code.clone().unwrap_or_default();
    let (url, model) = (url.to_string(), model.to_string());
    if lower.contains("does not support tools") {
        return BackendError::ToolsUnsupported { backend, model, server_message: error.message };
    }
    if (400..500).contains(&status) && is_context_overflow(&error) {
        return BackendError::ContextOverflow { backend, url, server_message: error.message };
    }
    let server_message = error.message;
    let model_missing = status == 404 && lower.contains("model") && lower.contains("not found");
    if model_missing || code == "model_not_found" {
        return BackendError::ModelNotFound { backend, url, model, server_message };
    }
    if status == 401 || status == 403 {
        return BackendError::Unauthorized { backend, url, status, server_message };
    }
    if status == 429 && (code == "insufficient_quota" || body.contains("insufficient_quota")) {
        return BackendError::QuotaExceeded { backend, url, server_message };
    }
    BackendError::Status { backend, url, status, server_message, attempts }
}

/// Turns a final transport failure into its error.
pub(crate) fn classify_transport(
    backend: BackendKind,
    url: &str,
    timeout: Duration,
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
    /// One message of the history as the server takes it.
    fn encode(message: &Message) -> serde_json::Result<String>;
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
    messages: MessageCache,
    ids: IdMinter,
    cannot: CannotStream,
}

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
            messages: MessageCache::default(),
            ids: IdMinter::default(),
            cannot: CannotStream::default(),
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
            .post_json(&self.url, self.bearer.as_deref(), body)
            .map_err(|err| classify_transport(self.kind, &self.url, timeout, err))?;
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
        self.messages.body(&head, request.messages, W::encode).map_err(encoding)
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
                .post_stream(&self.url, self.bearer.as_deref(), body, first_byte, idle)
                .map_err(|err| classify_transport(self.kind, &self.url, config.request_timeout, err))?;
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
            .map(|call| ToolCall { id: self.ids.keep_or_mint(call.id), name: call.name, arguments: call.arguments })
            .collect();
        ChatResponse {
            message: Message::assistant(reply.content, tool_calls),
            usage: reply.usage.unwrap_or_default(),
            finish_reason: reply.finish_reason,
            retries,
            delivery,
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

/// Deserialises a list that a server may send as `null` or leave out.
pub(crate) fn null_as_empty<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(deserializer)?.unwrap_or_default())
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

/// Mints ids for tool calls that arrived without one, unique within one backend's life.
#[derive(Debug, Default)]
pub(crate) struct IdMinter {
    next: u64,
}

impl IdMinter {
    /// The id a server (or script) gave a call, or a new one when it gave none or an empty one.
    pub fn keep_or_mint(&mut self, id: Option<String>) -> String {
        match id {
            Some(id) if !id.is_empty() => id,
            _ => {
                self.next += 1;
                format!("call_pg{}", self.next)
            }
        }
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

    #[test]
    fn excerpt_cuts_on_char_boundaries() {
        assert_eq!(excerpt("héllo", 2), "hé…");
        assert_eq!(excerpt("héllo", 5), "héllo");
        assert_eq!(excerpt("", 3), "");
    }

    #[test]
    fn server_errors_are_read_in_every_shape() {
        let error = |message: &str, code: Option<&str>, kind: Option<&str>| ServerError {
            message: message.into(),
            code: code.map(Into::into),
            kind: kind.map(Into::into),
        };
        assert_eq!(server_error(r#"{"error":"model 'x' not found"}"#), error("model 'x' not found", None, None));
        assert_eq!(
            server_error(r#"{"error":{"message":"bad key","type":"invalid_request_error","code":"invalid_api_key"}}"#),
            error("bad key", Some("invalid_api_key"), Some("invalid_request_error"))
        );
        assert_eq!(
            server_error(r#"{"error":{"code":500,"message":"boom","type":"server_error"}}"#),
            error("boom", Some("500"), Some("server_error"))
        );
        assert_eq!(server_error("<html>bad gateway</html>"), error("<html>bad gateway</html>", None, None));
    }

    #[test]
    fn a_context_overflow_says_what_to_change_in_each_servers_shape() {
        // llama-server (seen on this team's machine), llama-cpp-python, OpenAI.
        let bodies = [
            r#"{"error":{"code":400,"message":"request (4155 tokens) exceeds the available context size (4096 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":4155,"n_ctx":4096}}"#,
            r#"{"error":{"message":"This model's maximum context length is 2048 tokens. However, you requested 2100 tokens (2100 in the messages, None in the completion). Please reduce the length of the messages or completion.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
            r#"{"error":{"message":"This model's maximum context length is 128000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
        ];
        for body in bodies {
            let err = classify_status(BackendKind::OpenAi, "http://h/v1/chat/completions", "m", 400, body, 1);
            assert!(matches!(err, BackendError::ContextOverflow { .. }), "{err:?}");
            let text = err.to_string();
            assert!(text.contains("context") && text.contains("-c") && text.contains("max_output_tokens"), "{text}");
        }
        // A 5xx that mentions the context is the server's trouble, not an overflow.
        let err = classify_status(BackendKind::OpenAi, "u", "m", 500, r#"{"error":"context exceeded in kv cache"}"#, 1);
        assert!(matches!(err, BackendError::Status { status: 500, .. }), "{err:?}");
    }

    #[test]
    fn the_server_down_hint_names_the_base_url_not_the_endpoint() {
        let err = BackendError::Unreachable {
            backend: BackendKind::Ollama,
            url: "http://127.0.0.1:11434/api/chat".into(),
            detail: "refused".into(),
            attempts: 3,
        };
        let text = err.to_string();
        assert!(text.contains("instead of http://127.0.0.1:11434."), "{text}");
        let err = BackendError::Unreachable {
            backend: BackendKind::OpenAi,
            url: "http://127.0.0.1:8080/v1/chat/completions".into(),
            detail: "refused".into(),
            attempts: 3,
        };
        let text = err.to_string();
        assert!(text.contains("instead of http://127.0.0.1:8080/v1 "), "{text}");
    }

    #[test]
    fn classification_tells_the_user_what_to_do() {
        let err = classify_status(
            BackendKind::Ollama,
            "http://h/api/chat",
            "qwen",
            404,
            r#"{"error":"model 'qwen' not found, try pulling it first"}"#,
            1,
        );
        assert!(matches!(err, BackendError::ModelNotFound { .. }));
        assert!(err.to_string().contains("ollama pull qwen"), "{err}");

        let err = classify_status(
            BackendKind::Ollama,
            "u",
            "gemma",
            400,
            r#"{"error":"registry.ollama.ai/library/gemma:latest does not support tools"}"#,
            1,
        );
        assert!(matches!(err, BackendError::ToolsUnsupported { .. }));
        assert!(err.to_string().contains("protocol = \"json\""), "{err}");

        let err = classify_status(
            BackendKind::OpenAi,
            "u",
            "m",
            401,
            r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}"#,
            1,
        );
        assert!(matches!(err, BackendError::Unauthorized { status: 401, .. }));
        assert!(err.to_string().contains("OPENAI_API_KEY"), "{err}");

        let err = classify_status(
            BackendKind::OpenAi,
            "u",
            "m",
            429,
            r#"{"error":{"message":"quota","type":"insufficient_quota","code":"insufficient_quota"}}"#,
            1,
        );
        assert!(matches!(err, BackendError::QuotaExceeded { .. }));

        let err = classify_status(
            BackendKind::OpenAi,
            "u",
            "m",
            404,
            r#"{"error":{"message":"The model `m` does not exist","type":"invalid_request_error","code":"model_not_found"}}"#,
            1,
        );
        assert!(matches!(err, BackendError::ModelNotFound { .. }));

        let err = classify_status(BackendKind::OpenAi, "u", "m", 404, "404 page not found", 1);
        assert!(matches!(err, BackendError::Status { status: 404, .. }), "{err:?}");
    }
}
