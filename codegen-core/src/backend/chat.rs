//! One chat call: the [`Backend`] trait, its request and its reply.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::BackendError;
use super::http::RetryRecord;
use super::kind::BackendKind;
use crate::chat::{Message, ToolSpec};
use crate::constrain::{Constraint, Enforcement};

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
    /// What the server is to enforce on the reply (see [`crate::constrain`]); `None` for
    /// nothing. Only a constraint the backend's [`Backend::enforcement`] said it enforces.
    pub constraint: Option<&'a Constraint>,
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
    /// How much of the prompt the server read and how much it took from its cache, when it
    /// says (run-dependent, like `delivery`).
    pub prompt_cache: Option<PromptCache>,
}

/// A prompt's size and the server's context, in tokens ([`Backend::prompt_size`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptSize {
    /// Tokens of the prompt as the server's template renders it.
    pub tokens: u64,
    /// Tokens the server's context holds, prompt and reply together.
    pub context: u64,
    /// The reply cap the backend sends (`max_output_tokens`).
    pub max_output_tokens: u32,
}

/// How much of a prompt the server evaluated, and how much it reused from the previous
/// request's cache: llama-server's `timings.prompt_n` and `timings.cache_n`, the
/// `usage.prompt_tokens_details.cached_tokens` of OpenAI and others, Ollama's
/// `prompt_eval_count` (which counts only what it read).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptCache {
    /// Prompt tokens the server evaluated for this request.
    pub read: u64,
    /// Prompt tokens it took from its cache instead; `None` when it does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reused: Option<u64>,
}

/// How a reply arrived.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    /// What the server can enforce on a reply (see [`crate::constrain`]). HTTP backends find
    /// out once, on first asking, and remember it; the default enforces nothing.
    fn enforcement(&mut self) -> Enforcement {
        Enforcement::nothing(None)
    }
    /// How many tokens `request`'s prompt is and how many the server's context holds, where
    /// the server can say before generating anything (llama-server's `/apply-template`,
    /// `/tokenize` and `/props`); `None` elsewhere, or when it cannot be had.
    fn prompt_size(&mut self, request: &ChatRequest<'_>) -> Option<PromptSize> {
        let _ = request;
        None
    }
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
