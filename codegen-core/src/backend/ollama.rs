//! Ollama's native chat API: `POST {host}/api/chat`, streamed as NDJSON (see `stream.rs`)
//! or, where streaming fails, whole.

use serde::Deserialize;
#[cfg(feature = "http")]
use serde::Serialize;
use serde_json::Value;

use super::chat::{PromptCache, Usage};
use super::stream::{self, AssembledCall, AssembledReply, Assembly, StreamError};
use super::wire::null_as_empty;
use crate::chat::Arguments;
#[cfg(feature = "http")]
use {
    super::chat::{Backend, ChatRequest, ChatResponse, Progress},
    super::config::BackendConfig,
    super::error::BackendError,
    super::exchange::{Ask, Exchange, SentArguments, Unread, Wire},
    super::kind::BackendKind,
    crate::chat::{Message, Role, ToolSpec},
    crate::constrain::{Constraint, Enforcement},
    serde_json::value::RawValue,
};

/// Where Ollama listens when nothing says otherwise.
pub const DEFAULT_HOST: &str = "http://127.0.0.1:11434";

#[cfg(feature = "http")]
/// A client of one Ollama server.
pub struct Ollama {
    host: String,
    wire: OllamaWire,
    exchange: Exchange,
}

#[cfg(feature = "http")]
/// What Ollama's requests carry besides the request itself.
struct OllamaWire {
    num_ctx: u32,
    max_output_tokens: u32,
}

#[cfg(feature = "http")]
impl Ollama {
    /// Opens a client: the host is `config.base_url`, else `OLLAMA_HOST`, else
    /// [`DEFAULT_HOST`]; every form `OLLAMA_HOST` accepts is accepted (see [`parse_host`]).
    pub fn from_config(config: &BackendConfig) -> Result<Ollama, BackendError> {
        let configured = config.base_url.clone().or_else(|| std::env::var("OLLAMA_HOST").ok());
        let host = match configured {
            Some(text) => parse_host(&text),
            None => DEFAULT_HOST.to_string(),
        };
        let exchange = Exchange::new(BackendKind::Ollama, format!("{host}/api/chat"), None, config)?;
        Ok(Ollama {
            host,
            wire: OllamaWire { num_ctx: config.num_ctx, max_output_tokens: config.max_output_tokens },
            exchange,
        })
    }

    /// The server's base URL, as resolved.
    pub fn host(&self) -> &str {
        &self.host
    }
}

/// Turns any legal `OLLAMA_HOST` value into a base URL, the way Ollama's own client does:
/// a bare `host` gets port 11434; `host:port`; `http://host` means port 80 and
/// `https://host` port 443; a path suffix is kept; `0.0.0.0`, `::` and an empty host (all
/// "every interface" to a server) mean loopback to a client; surrounding quotes and
/// whitespace are dropped; an unusable port falls back to the scheme's default.
pub fn parse_host(value: &str) -> String {
    let value = value.trim().trim_matches(|c| c == '"' || c == '\'').trim();
    let (scheme, rest, default_port) = match value.split_once("://") {
        None => ("http", value, "11434"),
        Some(("http", rest)) => ("http", rest, "80"),
        Some(("https", rest)) => ("https", rest, "443"),
        Some((scheme, rest)) => (scheme, rest, "11434"),
    };
    let (hostport, path) = match rest.split_once('/') {
        Some((hostport, path)) => (hostport, path.trim_end_matches('/')),
        None => (rest, ""),
    };
    let (host, port) = split_host_port(hostport);
    let host = match host.trim_matches(|c| c == '[' || c == ']') {
        "" | "0.0.0.0" | "::" => "127.0.0.1".to_string(),
        h if h.contains(':') => format!("[{h}]"),
        h => h.to_string(),
    };
    let port = match port {
        Some(p) if p.parse::<u16>().is_ok() => p,
        _ => default_port,
    };
    let path = if path.is_empty() { String::new() } else { format!("/{path}") };
    format!("{scheme}://{host}:{port}{path}")
}

/// Splits `host:port`, `[v6]:port`, `[v6]`, a bare IPv6 address, or a bare host.
fn split_host_port(hostport: &str) -> (&str, Option<&str>) {
    if let Some(rest) = hostport.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((host, tail)) => (host, tail.strip_prefix(':')),
            None => (rest, None),
        };
    }
    match hostport.rsplit_once(':') {
        // More than one colon and no brackets: a bare IPv6 address.
        Some((host, _)) if host.contains(':') => (hostport, None),
        Some((host, port)) => (host, Some(port)),
        None => (hostport, None),
    }
}

#[cfg(feature = "http")]
impl Backend for Ollama {
    fn kind(&self) -> BackendKind {
        BackendKind::Ollama
    }

    fn location(&self) -> String {
        self.host.clone()
    }

    /// Ollama takes a JSON schema as `format` from 0.5.0 on (`GET /api/version` says which
    /// this is); nothing else: it has no grammar field, and it drops tool calls when `format`
    /// comes with `tools`, so a native step is carried in the `json` protocol.
    fn enforcement(&mut self) -> Enforcement {
        let url = format!("{}/api/version", self.host);
        let version = match self.exchange.probe(&url) {
            Ok(body) => serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|value| value["version"].as_str().map(str::to_string))
                .unwrap_or_default(),
            // Not Ollama, or not up: the chat request says what is wrong.
            Err(_) => return Enforcement::nothing(None),
        };
        let numbers: Vec<u64> = version.split(['.', '-', '+']).take(3).map(|part| part.parse().unwrap_or(0)).collect();
        let at_least = |wanted: &[u64]| numbers.as_slice() >= wanted;
        if numbers.len() < 3 || numbers == [0, 0, 0] {
            return Enforcement::nothing(None);
        }
        if !at_least(&[0, 5, 0]) {
            return Enforcement::nothing(Some(format!(
                "Ollama {version:?} is not known to take a JSON schema as `format` (0.5.0 and later do)"
            )));
        }
        Enforcement {
            server: format!("Ollama {version}"),
            json_schema: true,
            grammar: false,
            tool_call: false,
            why_not: Some("it drops tool calls under a format".to_string()),
            max_output_tokens: Some(self.wire.max_output_tokens),
        }
    }

    fn chat(&mut self, request: &ChatRequest<'_>) -> Result<ChatResponse, BackendError> {
        self.exchange.chat(&self.wire, request, &mut |_| {})
    }

    fn chat_observed(
        &mut self,
        request: &ChatRequest<'_>,
        progress: &mut dyn FnMut(&Progress<'_>),
    ) -> Result<ChatResponse, BackendError> {
        self.exchange.chat(&self.wire, request, progress)
    }
}

#[cfg(feature = "http")]
impl Wire for OllamaWire {
    // Ollama's tool parser keeps every token of a tool call until the call is complete.
    const HOLDS_BACK_TOOL_CALLS: bool = true;

    fn head(&self, request: &ChatRequest<'_>, ask: Ask) -> serde_json::Result<String> {
        let format = match request.constraint {
            Some(Constraint::JsonSchema(schema)) => Some(RawValue::from_string(schema.clone())?),
            _ => None,
        };
        serde_json::to_string(&WireRequest {
            model: request.model,
            tools: request.tools.iter().map(WireTool::from_spec).collect(),
            format,
            stream: ask != Ask::Whole,
            think: false,
            options: WireOptions {
                seed: request.seed,
                temperature: request.temperature,
                num_ctx: self.num_ctx,
                num_predict: self.max_output_tokens,
            },
        })
    }

    // Ollama takes arguments as an object, and renders them itself.
    fn encode(message: &Message, _sent: &SentArguments) -> serde_json::Result<String> {
        serde_json::to_string(&WireMessage::from_message(message))
    }

    fn read_whole(body: &str) -> Result<AssembledReply, Unread> {
        let mut wire: WireResponse = serde_json::from_str(body).map_err(|e| Unread::Bad(e.to_string()))?;
        if let Some(error) = wire.error.take() {
            return Err(Unread::Error(serde_json::json!({ "error": error }).to_string()));
        }
        let message = wire.message.ok_or_else(|| Unread::Bad("it has no `message`".to_string()))?;
        Ok(AssembledReply {
            content: message.content,
            tool_calls: message.tool_calls.into_iter().map(WireCallIn::assembled).collect(),
            usage: Some(Usage { prompt_tokens: wire.prompt_eval_count, completion_tokens: wire.eval_count }),
            finish_reason: wire.done_reason,
            prompt_cache: wire.prompt_eval_count.map(|read| PromptCache { read, reused: None }),
        })
    }

    fn decoder() -> stream::Decoder {
        stream::Decoder::ollama()
    }
}

impl stream::Decoder {
    /// A decoder of Ollama's NDJSON stream.
    pub fn ollama() -> stream::Decoder {
        stream::Decoder::new(stream::Framing::Ndjson, apply_chunk)
    }
}

/// One line of a streamed reply: a piece of the text, whole tool calls, or (with `done: true`)
/// the end, with the token counts; or the error that ended the stream.
pub(crate) fn apply_chunk(assembly: &mut Assembly, line: &str) -> Result<(), StreamError> {
    let mut chunk: WireResponse = serde_json::from_str(line).map_err(|e| stream::malformed(e, line))?;
    if let Some(error) = chunk.error.take() {
        return Err(StreamError::Server { body: serde_json::json!({ "error": error }).to_string() });
    }
    if let Some(message) = chunk.message {
        let carried = !message.content.is_empty() || !message.tool_calls.is_empty();
        assembly.text(&message.content);
        for call in message.tool_calls {
            assembly.whole_call(call.id, call.function.name, call.function.arguments);
        }
        if carried {
            assembly.piece();
        }
    }
    if chunk.done {
        assembly.usage(Usage { prompt_tokens: chunk.prompt_eval_count, completion_tokens: chunk.eval_count });
        // Ollama counts only the prompt tokens it evaluated: the rest came from its cache.
        if let Some(read) = chunk.prompt_eval_count {
            assembly.prompt_cache(PromptCache { read, reused: None });
        }
        if let Some(reason) = chunk.done_reason {
            assembly.finish_reason(reason);
        }
        assembly.complete = true;
    }
    Ok(())
}

#[cfg(feature = "http")]
#[derive(Serialize)]
/// The request without its `messages`, which go in already encoded (see [`MessageCache`]).
struct WireRequest<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    /// A JSON schema the reply must follow.
    #[serde(skip_serializing_if = "Option::is_none")]
    format: Option<Box<RawValue>>,
    stream: bool,
    think: bool,
    options: WireOptions,
}

#[cfg(feature = "http")]
#[derive(Serialize)]
struct WireOptions {
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    num_ctx: u32,
    /// The output cap per reply.
    num_predict: u32,
}

#[cfg(feature = "http")]
#[derive(Serialize)]
struct WireMessage<'a> {
    role: Role,
    content: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<WireCallOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
}

#[cfg(feature = "http")]
impl<'a> WireMessage<'a> {
    fn from_message(message: &'a Message) -> WireMessage<'a> {
        WireMessage {
            role: message.role,
            content: &message.content,
            tool_calls: message
                .tool_calls
                .iter()
                .map(|call| WireCallOut {
                    id: &call.id,
                    function: WireFunctionOut { name: &call.name, arguments: call.arguments.to_json_object() },
                })
                .collect(),
            tool_name: message.tool_name.as_deref(),
            tool_call_id: message.tool_call_id.as_deref(),
        }
    }
}

#[cfg(feature = "http")]
/// An echoed tool call: the arguments go back as an object (a string breaks Ollama's parser).
#[derive(Serialize)]
struct WireCallOut<'a> {
    id: &'a str,
    function: WireFunctionOut<'a>,
}

#[cfg(feature = "http")]
#[derive(Serialize)]
struct WireFunctionOut<'a> {
    name: &'a str,
    arguments: Value,
}

#[cfg(feature = "http")]
#[derive(Serialize)]
struct WireTool<'a> {
    r#type: &'static str,
    function: &'a ToolSpec,
}

#[cfg(feature = "http")]
impl<'a> WireTool<'a> {
    fn from_spec(spec: &'a ToolSpec) -> WireTool<'a> {
        WireTool { r#type: "function", function: spec }
    }
}

/// A whole reply, or one line of a streamed one.
#[derive(Deserialize)]
struct WireResponse {
    message: Option<WireReplyMessage>,
    #[serde(default)]
    done: bool,
    done_reason: Option<String>,
    prompt_eval_count: Option<u64>,
    eval_count: Option<u64>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct WireReplyMessage {
    #[serde(default)]
    content: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    tool_calls: Vec<WireCallIn>,
}

#[derive(Deserialize)]
struct WireCallIn {
    id: Option<String>,
    function: WireFunctionIn,
}

impl WireCallIn {
    fn assembled(self) -> AssembledCall {
        AssembledCall {
            id: self.id,
            name: self.function.name,
            arguments: Arguments::from_value(self.function.arguments),
            arguments_text: None,
        }
    }
}

#[derive(Deserialize)]
struct WireFunctionIn {
    name: String,
    #[serde(default)]
    arguments: Value,
}

#[cfg(test)]
mod tests {
    use super::parse_host;

    #[test]
    fn every_legal_ollama_host_form() {
        let cases = [
            ("", "http://127.0.0.1:11434"),
            ("example.com", "http://example.com:11434"),
            ("example.com:1234", "http://example.com:1234"),
            ("http://example.com", "http://example.com:80"),
            ("https://example.com", "https://example.com:443"),
            ("https://example.com:8443/ollama/", "https://example.com:8443/ollama"),
            ("example.com/path", "http://example.com:11434/path"),
            ("0.0.0.0", "http://127.0.0.1:11434"),
            ("0.0.0.0:8080", "http://127.0.0.1:8080"),
            (":11435", "http://127.0.0.1:11435"),
            ("[::1]:11434", "http://[::1]:11434"),
            ("[::1]", "http://[::1]:11434"),
            ("::1", "http://[::1]:11434"),
            ("::", "http://127.0.0.1:11434"),
            ("  \"127.0.0.1:9\"  ", "http://127.0.0.1:9"),
            ("localhost:notaport", "http://localhost:11434"),
            ("localhost:99999", "http://localhost:11434"),
        ];
        for (input, expected) in cases {
            assert_eq!(parse_host(input), expected, "OLLAMA_HOST={input:?}");
        }
    }
}
