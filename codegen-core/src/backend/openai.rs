//! The OpenAI-compatible chat API: `POST {base}/chat/completions`, streamed as server-sent
//! events (see `stream.rs`) or, where streaming fails, whole.
//!
//! One backend for OpenAI, llama.cpp's `llama-server` and `llama-cpp-python`, vLLM, LM Studio
//! and Ollama's `/v1`. Their differences that matter here: `arguments` arrives as JSON text,
//! as `""`, or (llama.cpp) as an object; ids may be missing; `tool_choice` must be sent or
//! llama-cpp-python ignores the tools; llama.cpp rejects an echoed call without
//! `"type": "function"`.

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
    super::chat::{Backend, ChatRequest, ChatResponse, Progress, PromptSize},
    super::config::BackendConfig,
    super::error::BackendError,
    super::exchange::{Ask, Exchange, SentArguments, Unread, Wire},
    super::kind::BackendKind,
    crate::chat::{Message, Role, ToolSpec},
    crate::constrain::{Constraint, Enforcement},
    serde_json::value::RawValue,
};

/// The base URL when neither the configuration nor `OPENAI_BASE_URL` gives one.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

#[cfg(feature = "http")]
/// A client of one OpenAI-compatible server.
pub struct OpenAi {
    base: String,
    wire: OpenAiWire,
    exchange: Exchange,
    /// llama-server's context, once `GET /props` said it (see `prompt_size`).
    context: Option<u64>,
}

#[cfg(feature = "http")]
/// What the requests carry besides the request itself.
struct OpenAiWire {
    /// The output cap per reply, and the field that carries it.
    output_cap: (OutputCapField, u32),
    /// The server, once asked (see [`OpenAi::enforcement`]): it decides the constraint's fields.
    server: Option<Option<Flavor>>,
}

#[cfg(feature = "http")]
/// The OpenAI-compatible servers whose constraint fields are known, as `GET {base}/models`
/// tells them apart (each model's `owned_by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavor {
    /// llama.cpp's `llama-server` (`owned_by: "llamacpp"`).
    LlamaServer,
    /// llama-cpp-python's server (`owned_by: "me"`).
    LlamaCppPython,
    /// vLLM (`owned_by: "vllm"`).
    Vllm,
    /// Ollama's `/v1` (`owned_by: "library"`, or the model's namespace, with `ollama` in it).
    Ollama,
    /// OpenAI itself (`owned_by: "openai"`, `"system"`, `"openai-internal"`).
    OpenAi,
}

#[cfg(feature = "http")]
impl Flavor {
    fn from_models(body: &str) -> Option<Flavor> {
        let value: Value = serde_json::from_str(body).ok()?;
        let owners: Vec<String> = value["data"]
            .as_array()?
            .iter()
            .filter_map(|model| model["owned_by"].as_str().map(str::to_lowercase))
            .collect();
        let first = owners.first()?;
        Some(match first.as_str() {
            "llamacpp" => Flavor::LlamaServer,
            "me" => Flavor::LlamaCppPython,
            "vllm" => Flavor::Vllm,
            "library" | "ollama" => Flavor::Ollama,
            "openai" | "system" | "openai-internal" => Flavor::OpenAi,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Flavor::LlamaServer => "llama-server",
            Flavor::LlamaCppPython => "llama-cpp-python",
            Flavor::Vllm => "vLLM",
            Flavor::Ollama => "Ollama (/v1)",
            Flavor::OpenAi => "OpenAI",
        }
    }

    /// What it enforces, and through which fields (see `head`). Sources:
    /// `../shared/reference/llm-wire-protocols.md`, and the real-server tests.
    fn enforcement(self, max_output_tokens: u32) -> Enforcement {
        let (json_schema, grammar, tool_call, why_not) = match self {
            // Its `tool_choice: "required"` grammar lets prose come first with a template
            // that has no tool-call prefix of its own (ours), so a reply may still be text.
            Flavor::LlamaServer => (true, true, false, Some("its required tool call still admits prose first")),
            // `chatml-function-calling` asserts `tool_choice == "auto"`.
            Flavor::LlamaCppPython => {
                (true, true, false, Some("its chatml-function-calling takes only tool_choice \"auto\""))
            }
            Flavor::Vllm => (true, true, true, None),
            // Ollama drops tool calls when `format` and `tools` come together.
            Flavor::Ollama => (true, false, false, Some("it drops tool calls under a format")),
            Flavor::OpenAi => (true, false, true, None),
        };
        Enforcement {
            server: self.name().to_string(),
            json_schema,
            grammar,
            tool_call,
            why_not: why_not.map(str::to_string),
            max_output_tokens: Some(max_output_tokens),
        }
    }
}

#[cfg(feature = "http")]
impl OpenAi {
    /// Opens a client: base URL from `config.base_url`, else `OPENAI_BASE_URL`, else
    /// [`DEFAULT_BASE_URL`]; key from `config.api_key`, else `OPENAI_API_KEY` when set.
    pub fn from_config(config: &BackendConfig) -> Result<OpenAi, BackendError> {
        let non_empty = |v: String| (!v.trim().is_empty()).then(|| v.trim().to_string());
        let base = config
            .base_url
            .clone()
            .or_else(|| std::env::var("OPENAI_BASE_URL").ok())
            .and_then(non_empty)
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_string());
        let base = base.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(BackendError::Config {
                backend: BackendKind::OpenAi,
                url: base,
                detail: "the base URL must start with http:// or https://, e.g. http://127.0.0.1:8080/v1".into(),
            });
        }
        let api_key = config.api_key.clone().or_else(|| std::env::var("OPENAI_API_KEY").ok()).and_then(non_empty);
        let output_cap = (OutputCapField::for_base_url(&base), config.max_output_tokens);
        let exchange = Exchange::new(BackendKind::OpenAi, format!("{base}/chat/completions"), api_key, config)?;
        Ok(OpenAi { base, wire: OpenAiWire { output_cap, server: None }, exchange, context: None })
    }

    /// The base URL, as resolved.
    pub fn base_url(&self) -> &str {
        &self.base
    }
}

#[cfg(feature = "http")]
impl Backend for OpenAi {
    fn kind(&self) -> BackendKind {
        BackendKind::OpenAi
    }

    fn location(&self) -> String {
        self.base.clone()
    }

    /// Asks `GET {base}/models` which server this is (each model's `owned_by`); a server that
    /// does not say, or is not one whose constraint fields are known, enforces nothing.
    fn enforcement(&mut self) -> Enforcement {
        // Asked once per backend: a chain's steps share it.
        let server = match self.wire.server {
            Some(known) => known,
            None => {
                let answer = self.exchange.probe(&format!("{}/models", self.base));
                let server = answer.ok().as_deref().and_then(Flavor::from_models);
                self.wire.server = Some(server);
                server
            }
        };
        // A server that cannot be told apart runs as it did before constrained decoding,
        // without a note on every step: `cargo promptgen log` shows which steps were constrained.
        match server {
            Some(server) => server.enforcement(self.wire.output_cap.1),
            None => Enforcement::nothing(None),
        }
    }

    /// llama-server renders the prompt with its template (`POST /apply-template`, the chat
    /// request as it is), counts it (`POST /tokenize`) and says its context (`GET /props`).
    fn prompt_size(&mut self, request: &ChatRequest<'_>) -> Option<PromptSize> {
        if self.wire.server.flatten() != Some(Flavor::LlamaServer) {
            return None;
        }
        // Its own endpoints live beside `/v1`.
        let root = self.base.strip_suffix("/v1").unwrap_or(&self.base).to_string();
        // The context does not change while the server runs: asked once per backend.
        let context = match self.context {
            Some(context) => context,
            None => {
                let props: Value = serde_json::from_str(&self.exchange.probe(&format!("{root}/props")).ok()?).ok()?;
                let context =
                    props["default_generation_settings"]["n_ctx"].as_u64().or_else(|| props["n_ctx"].as_u64())?;
                *self.context.insert(context)
            }
        };
        let rendered: Value =
            serde_json::from_str(&self.exchange.post_beside(&self.wire, request, &format!("{root}/apply-template"))?)
                .ok()?;
        let prompt = rendered["prompt"].as_str()?;
        let body = serde_json::to_vec(&serde_json::json!({ "content": prompt })).ok()?;
        let tokens: Value = serde_json::from_str(&self.exchange.post_text(&format!("{root}/tokenize"), body)?).ok()?;
        Some(PromptSize {
            tokens: tokens["tokens"].as_array()?.len() as u64,
            context,
            max_output_tokens: self.wire.output_cap.1,
        })
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
impl Wire for OpenAiWire {
    // OpenAI, llama.cpp and vLLM stream a tool call's arguments as the model writes them.
    // Ollama's `/v1` does not, and is recognised by its replies (see `Decoder`).
    const HOLDS_BACK_TOOL_CALLS: bool = false;

    fn head(&self, request: &ChatRequest<'_>, ask: Ask) -> serde_json::Result<String> {
        let has_tools = !request.tools.is_empty();
        let (field, cap) = self.output_cap;
        let server = self.server.flatten();
        let mut constrained = ConstraintFields::default();
        match (request.constraint, server) {
            (Some(Constraint::JsonSchema(schema)), Some(Flavor::LlamaCppPython)) => {
                // Its `response_format` takes a schema only in the `json_object` form.
                constrained.response_format =
                    Some(RawValue::from_string(format!("{{\"type\":\"json_object\",\"schema\":{schema}}}"))?);
            }
            (Some(Constraint::JsonSchema(schema)), Some(_)) => {
                constrained.response_format = Some(RawValue::from_string(format!(
                    "{{\"type\":\"json_schema\",\"json_schema\":{{\"name\":\"tool_call\",\"schema\":{schema}}}}}"
                ))?);
            }
            (Some(Constraint::Grammar(grammar)), Some(Flavor::LlamaServer | Flavor::LlamaCppPython)) => {
                constrained.grammar = Some(grammar);
            }
            (Some(Constraint::Grammar(grammar)), Some(Flavor::Vllm)) => {
                constrained.structured_outputs = Some(StructuredOutputs { grammar });
            }
            _ => {}
        }
        let required = matches!(request.constraint, Some(Constraint::ToolCall));
        serde_json::to_string(&WireRequest {
            model: request.model,
            tools: request.tools.iter().map(|spec| WireTool { r#type: "function", function: spec }).collect(),
            tool_choice: has_tools.then_some(if required { "required" } else { "auto" }),
            constrained,
            seed: request.seed,
            temperature: request.temperature,
            max_tokens: (field == OutputCapField::MaxTokens).then_some(cap),
            max_completion_tokens: (field == OutputCapField::MaxCompletionTokens).then_some(cap),
            stream: ask != Ask::Whole,
            stream_options: (ask == Ask::Stream { usage: true }).then_some(StreamOptions { include_usage: true }),
        })
    }

    fn encode(message: &Message, sent: &SentArguments) -> serde_json::Result<String> {
        serde_json::to_string(&WireMessage::from_message(message, sent))
    }

    fn read_whole(body: &str) -> Result<AssembledReply, Unread> {
        let mut wire: WireResponse = serde_json::from_str(body).map_err(|e| Unread::Bad(e.to_string()))?;
        if let Some(error) = wire.error.take() {
            return Err(Unread::Error(serde_json::json!({ "error": error }).to_string()));
        }
        let choice = wire.choices.into_iter().next().ok_or_else(|| Unread::Bad("`choices` is empty".to_string()))?;
        let usage = wire.usage.unwrap_or_default();
        let prompt_cache = prompt_cache(wire.timings.as_ref(), &usage);
        Ok(AssembledReply {
            content: choice.message.content.unwrap_or_default(),
            tool_calls: choice
                .message
                .tool_calls
                .into_iter()
                .map(|call| {
                    let arguments_text = call.function.arguments.as_str().map(str::to_string);
                    AssembledCall {
                        id: call.id,
                        name: call.function.name,
                        arguments: Arguments::from_value(call.function.arguments),
                        arguments_text,
                    }
                })
                .collect(),
            usage: Some(Usage { prompt_tokens: usage.prompt_tokens, completion_tokens: usage.completion_tokens }),
            finish_reason: choice.finish_reason,
            prompt_cache,
        })
    }

    fn decoder() -> stream::Decoder {
        stream::Decoder::openai()
    }
}

impl stream::Decoder {
    /// A decoder of an OpenAI-compatible server's event stream.
    pub fn openai() -> stream::Decoder {
        stream::Decoder::new(stream::Framing::Sse, apply_chunk)
    }
}

/// One `data:` event of a streamed reply (other than `[DONE]`): pieces of the text and of tool
/// calls in `choices[0].delta`, the finish reason, the token counts (a last chunk with no
/// choices), or the error that ended the stream.
pub(crate) fn apply_chunk(assembly: &mut Assembly, data: &str) -> Result<(), StreamError> {
    let mut chunk: WireChunk = serde_json::from_str(data).map_err(|e| stream::malformed(e, data))?;
    if let Some(error) = chunk.error.take() {
        return Err(StreamError::Server { body: serde_json::json!({ "error": error }).to_string() });
    }
    if chunk.system_fingerprint.as_ref().and_then(Value::as_str) == Some("fp_ollama") {
        assembly.holds_back_tool_calls = true;
    }
    if let Some(cache) = prompt_cache(chunk.timings.as_ref(), chunk.usage.as_ref().unwrap_or(&WireUsage::default())) {
        assembly.prompt_cache(cache);
    }
    if let Some(usage) = chunk.usage {
        assembly.usage(Usage { prompt_tokens: usage.prompt_tokens, completion_tokens: usage.completion_tokens });
    }
    // One reply was asked for (no `n`): any other choice is not ours.
    for choice in chunk.choices.into_iter().filter(|choice| choice.index.unwrap_or(0) == 0) {
        if let Some(delta) = choice.delta {
            let text = delta.content.unwrap_or_default();
            let carried = !text.is_empty() || !delta.tool_calls.is_empty();
            assembly.text(&text);
            for call in delta.tool_calls {
                let (name, arguments) = match call.function {
                    Some(function) => (function.name, function.arguments),
                    None => (None, Value::Null),
                };
                assembly.call_fragment(call.index, call.id, name, arguments);
            }
            if carried {
                assembly.piece();
            }
        }
        if let Some(reason) = choice.finish_reason {
            assembly.finish_reason(reason);
        }
    }
    Ok(())
}

/// What the server read of the prompt and took from its cache: llama-server's `timings`,
/// else `usage.prompt_tokens_details.cached_tokens`.
fn prompt_cache(timings: Option<&WireTimings>, usage: &WireUsage) -> Option<PromptCache> {
    if let Some(WireTimings { prompt_n: Some(read), cache_n }) = timings {
        return Some(PromptCache { read: *read, reused: *cache_n });
    }
    let cached = usage.prompt_tokens_details.as_ref()?.cached_tokens?;
    Some(PromptCache { read: usage.prompt_tokens?.saturating_sub(cached), reused: Some(cached) })
}

#[cfg(feature = "http")]
#[derive(Serialize)]
/// The request without its `messages`, which go in already encoded (see [`MessageCache`]).
struct WireRequest<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<&'static str>,
    #[serde(flatten)]
    constrained: ConstraintFields<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    stream: bool,
    /// Asks a stream for its token counts (a last chunk with `usage`), which a whole reply
    /// always carries.
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
}

#[cfg(feature = "http")]
/// The fields that carry a constraint, by server: `response_format` (a JSON schema; every
/// server here), `grammar` (GBNF; llama.cpp's servers) or `structured_outputs.grammar` (vLLM).
#[derive(Serialize, Default)]
struct ConstraintFields<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    grammar: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    structured_outputs: Option<StructuredOutputs<'a>>,
}

#[cfg(feature = "http")]
#[derive(Serialize)]
struct StructuredOutputs<'a> {
    grammar: &'a str,
}

#[cfg(feature = "http")]
#[derive(Serialize, PartialEq)]
struct StreamOptions {
    include_usage: bool,
}

#[cfg(feature = "http")]
/// Which request field carries the output cap.
///
/// Every compatible server reads `max_tokens` (llama-cpp-python reads nothing else), while
/// OpenAI's own reasoning models refuse it with a 400 asking for `max_completion_tokens`,
/// which OpenAI accepts for every model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OutputCapField {
    MaxTokens,
    MaxCompletionTokens,
}

#[cfg(feature = "http")]
impl OutputCapField {
    fn for_base_url(base: &str) -> OutputCapField {
        let host = base.split("://").nth(1).unwrap_or(base).split(['/', ':']).next().unwrap_or_default();
        if host.eq_ignore_ascii_case("api.openai.com") {
            OutputCapField::MaxCompletionTokens
        } else {
            OutputCapField::MaxTokens
        }
    }
}

#[cfg(feature = "http")]
#[derive(Serialize)]
struct WireTool<'a> {
    r#type: &'static str,
    function: &'a ToolSpec,
}

#[cfg(feature = "http")]
#[derive(Serialize)]
struct WireMessage<'a> {
    role: Role,
    /// Always a string, `""` for an assistant turn that only calls tools: OpenAI takes `null`
    /// there too, but llama-cpp-python's request validation rejects it with a 500 (seen
    /// against a real server in `cargo-promptgen/tests/it/real_llm.rs`).
    content: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<WireCallOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
}

#[cfg(feature = "http")]
impl<'a> WireMessage<'a> {
    fn from_message(message: &'a Message, sent: &SentArguments) -> WireMessage<'a> {
        WireMessage {
            role: message.role,
            content: &message.content,
            tool_calls: message
                .tool_calls
                .iter()
                .map(|call| WireCallOut {
                    id: &call.id,
                    r#type: "function",
                    // Always valid JSON text: llama-server parses echoed arguments and answers a
                    // whole request with HTTP 500 when one does not parse (seen with a call the
                    // output cap had cut). The model learns what was wrong from the tool result.
                    // What the server generated, where it still reads as these arguments: the
                    // history it sees again is then the one in its prompt cache.
                    function: WireFunctionOut {
                        name: &call.name,
                        arguments: sent
                            .text_of(call)
                            .map(str::to_string)
                            .unwrap_or_else(|| call.arguments.to_json_object().to_string()),
                    },
                })
                .collect(),
            tool_call_id: message.tool_call_id.as_deref(),
        }
    }
}

#[cfg(feature = "http")]
#[derive(Serialize)]
struct WireCallOut<'a> {
    id: &'a str,
    r#type: &'static str,
    function: WireFunctionOut<'a>,
}

#[cfg(feature = "http")]
#[derive(Serialize)]
struct WireFunctionOut<'a> {
    name: &'a str,
    arguments: String,
}

#[derive(Deserialize)]
struct WireResponse {
    #[serde(default)]
    choices: Vec<WireChoice>,
    usage: Option<WireUsage>,
    timings: Option<WireTimings>,
    error: Option<Value>,
}

/// llama-server's `timings`: prompt tokens evaluated, and taken from the cache.
#[derive(Deserialize)]
struct WireTimings {
    prompt_n: Option<u64>,
    cache_n: Option<u64>,
}

#[derive(Deserialize)]
struct WireChoice {
    message: WireReplyMessage,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireReplyMessage {
    content: Option<String>,
    #[serde(default, deserialize_with = "null_as_empty")]
    tool_calls: Vec<WireCallIn>,
}

#[derive(Deserialize)]
struct WireCallIn {
    id: Option<String>,
    function: WireFunctionIn,
}

#[derive(Deserialize)]
struct WireFunctionIn {
    name: String,
    /// JSON text, `""`, or (some llama.cpp builds) an object: all read by `Arguments::from_value`.
    #[serde(default)]
    arguments: Value,
}

/// One chunk of a streamed reply.
#[derive(Deserialize)]
struct WireChunk {
    #[serde(default, deserialize_with = "null_as_empty")]
    choices: Vec<WireChunkChoice>,
    usage: Option<WireUsage>,
    timings: Option<WireTimings>,
    system_fingerprint: Option<Value>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct WireChunkChoice {
    index: Option<u64>,
    delta: Option<WireDelta>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireDelta {
    content: Option<String>,
    #[serde(default, deserialize_with = "null_as_empty")]
    tool_calls: Vec<WireCallDelta>,
}

/// A fragment of a tool call: `index` says which call; `id` and `name` come in its first
/// fragment, `arguments` text in pieces.
#[derive(Deserialize)]
struct WireCallDelta {
    index: Option<u64>,
    id: Option<String>,
    function: Option<WireFunctionDelta>,
}

#[derive(Deserialize)]
struct WireFunctionDelta {
    name: Option<String>,
    #[serde(default)]
    arguments: Value,
}

#[derive(Deserialize, Default)]
struct WireUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<WirePromptDetails>,
}

#[derive(Deserialize)]
struct WirePromptDetails {
    cached_tokens: Option<u64>,
}
