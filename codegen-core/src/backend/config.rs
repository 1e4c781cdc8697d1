//! [`BackendConfig`]: everything needed to open any backend.

use std::path::PathBuf;

#[cfg(doc)]
use super::error::BackendError;
use super::http::HttpConfig;
use super::kind::BackendKind;
use crate::cancel::Cancel;

/// Everything needed to open any backend, e.g. from a configuration file.
#[derive(Debug, Clone)]
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

/// Two configurations are equal when their settings are: the [`Cancel`] flag is a handle
/// to the run, not a setting.
impl PartialEq for BackendConfig {
    fn eq(&self, other: &BackendConfig) -> bool {
        let BackendConfig { kind, base_url, api_key, num_ctx, max_output_tokens, script, stream, http, cancel: _ } =
            self;
        (kind, base_url, api_key, num_ctx, max_output_tokens, script, stream, http)
            == (
                &other.kind,
                &other.base_url,
                &other.api_key,
                &other.num_ctx,
                &other.max_output_tokens,
                &other.script,
                &other.stream,
                &other.http,
            )
    }
}

impl BackendConfig {
    /// The most bytes one reply may have, on the wire (a stream's framing included) or
    /// assembled, before it is cut off ([`BackendError::ReplyTooLarge`]): a kibibyte per
    /// token of `max_output_tokens` (a streamed token's event is a few hundred bytes), at
    /// least [`BackendConfig::MIN_REPLY_BYTES`] and at most [`BackendConfig::MAX_REPLY_BYTES`].
    /// A server that ignores the cap is stopped here, and memory with it.
    pub fn reply_limit(&self) -> u64 {
        (u64::from(self.max_output_tokens) * 1024).clamp(Self::MIN_REPLY_BYTES, Self::MAX_REPLY_BYTES)
    }

    /// The least [`BackendConfig::reply_limit`] is: room for an error body and a short reply
    /// whatever the cap.
    pub const MIN_REPLY_BYTES: u64 = 1 << 20;

    /// The most [`BackendConfig::reply_limit`] is, whatever the cap.
    pub const MAX_REPLY_BYTES: u64 = 64 << 20;

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
}
