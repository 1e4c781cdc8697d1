//! The OpenAI-compatible chat API: `POST {base}/chat/completions`, non-streaming.
//!
//! One backend for OpenAI, llama.cpp's `llama-server` and `llama-cpp-python`, vLLM, LM Studio
//! and Ollama's `/v1`. Their differences that matter here: `arguments` arrives as JSON text,
//! as `""`, or (llama.cpp) as an object; ids may be missing; `tool_choice` must be sent or
//! llama-cpp-python ignores the tools; llama.cpp rejects an echoed call without
//! `"type": "function"`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::http::HttpClient;
use super::{
    Backend, BackendConfig, BackendError, BackendKind, ChatRequest, ChatResponse, IdMinter, MessageCache, Received,
    Usage, WireReply, exchange, null_as_empty,
};
use crate::chat::{Arguments, Message, Role, ToolCall, ToolSpec};

/// The base URL when neither the configuration nor `OPENAI_BASE_URL` gives one.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// A client of one OpenAI-compatible server.
pub struct OpenAi {
    base: String,
    url: String,
    api_key: Option<String>,
    /// The output cap per reply, and the field that carries it.
    output_cap: (OutputCapField, u32),
    http: HttpClient,
    ids: IdMinter,
    /// The history as last sent, encoded.
    messages: MessageCache,
}

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
        let config_error =
            |detail: String| BackendError::Config { backend: BackendKind::OpenAi, url: base.clone(), detail };
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(config_error(
                "the base URL must start with http:// or https://, e.g. http://127.0.0.1:8080/v1".into(),
            ));
        }
        let api_key = config.api_key.clone().or_else(|| std::env::var("OPENAI_API_KEY").ok()).and_then(non_empty);
        let http = HttpClient::new(config.http.clone()).map_err(config_error)?;
        let output_cap = (OutputCapField::for_base_url(&base), config.max_output_tokens);
        Ok(OpenAi {
            url: format!("{base}/chat/completions"),
            base,
            api_key,
            output_cap,
            http,
            ids: IdMinter::default(),
            messages: MessageCache::default(),
        })
    }

    /// The base URL, as resolved.
    pub fn base_url(&self) -> &str {
        &self.base
    }
}

impl Backend for OpenAi {
    fn kind(&self) -> BackendKind {
        BackendKind::OpenAi
    }

    fn location(&self) -> String {
        self.base.clone()
    }

    fn chat(&mut self, request: &ChatRequest<'_>) -> Result<ChatResponse, BackendError> {
        let has_tools = !request.tools.is_empty();
        let body = WireRequest {
            model: request.model,
            tools: request.tools.iter().map(|spec| WireTool { r#type: "function", function: spec }).collect(),
            tool_choice: has_tools.then_some("auto"),
            seed: request.seed,
            temperature: request.temperature,
            max_tokens: (self.output_cap.0 == OutputCapField::MaxTokens).then_some(self.output_cap.1),
            max_completion_tokens: (self.output_cap.0 == OutputCapField::MaxCompletionTokens)
                .then_some(self.output_cap.1),
            stream: false,
        };
        let received: Received<WireResponse> = exchange(
            BackendKind::OpenAi,
            &self.http,
            &mut self.messages,
            &self.url,
            self.api_key.as_deref(),
            request.model,
            &body,
            request.messages,
            |m| serde_json::to_string(&WireMessage::from_message(m)),
        )?;
        let bad = received.bad("`choices` is empty");
        let wire = received.wire;
        let choice = wire.choices.into_iter().next().ok_or(bad)?;
        let tool_calls = choice
            .message
            .tool_calls
            .into_iter()
            .map(|call| ToolCall {
                id: self.ids.keep_or_mint(call.id),
                name: call.function.name,
                arguments: Arguments::from_value(call.function.arguments),
            })
            .collect();
        let usage = wire.usage.unwrap_or_default();
        Ok(ChatResponse {
            message: Message::assistant(choice.message.content.unwrap_or_default(), tool_calls),
            usage: Usage { prompt_tokens: usage.prompt_tokens, completion_tokens: usage.completion_tokens },
            finish_reason: choice.finish_reason,
            retries: received.retries,
        })
    }
}

#[derive(Serialize)]
/// The request without its `messages`, which go in already encoded (see [`MessageCache`]).
struct WireRequest<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    stream: bool,
}

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

#[derive(Serialize)]
struct WireTool<'a> {
    r#type: &'static str,
    function: &'a ToolSpec,
}

#[derive(Serialize)]
struct WireMessage<'a> {
    role: Role,
    /// Always a string, `""` for an assistant turn that only calls tools: OpenAI takes `null`
    /// there too, but llama-cpp-python's request validation rejects it with a 500 (seen
    /// against a real server in `cargo-promptgen/tests/real_llm.rs`).
    content: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<WireCallOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
}

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
                    r#type: "function",
                    function: WireFunctionOut { name: &call.name, arguments: call.arguments.to_json_text() },
                })
                .collect(),
            tool_call_id: message.tool_call_id.as_deref(),
        }
    }
}

#[derive(Serialize)]
struct WireCallOut<'a> {
    id: &'a str,
    r#type: &'static str,
    function: WireFunctionOut<'a>,
}

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
    error: Option<Value>,
}

impl WireReply for WireResponse {
    fn take_error(&mut self) -> Option<Value> {
        self.error.take()
    }
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

#[derive(Deserialize, Default)]
struct WireUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
}
