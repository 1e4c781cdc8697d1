//! Why a model call failed, with what to do about it; and the error bodies of both protocols,
//! read into those errors.

use std::path::PathBuf;
use std::time::Duration;

use super::kind::BackendKind;
use crate::report::excerpt;

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
    /// The server sent more for one reply than its output cap allows: it ignores the cap.
    /// The reply was cut off there, and never retried.
    #[error(
        "{backend} at {url} sent more than {limit} bytes for one reply and was cut off: with max_output_tokens = {max_output_tokens}, a reply needs far less, so the server ignores the output cap (Ollama's `num_predict`, the OpenAI-compatible `max_tokens`).\nCheck the server's settings, or raise max_output_tokens if the step's replies really are that long."
    )]
    ReplyTooLarge {
        /// Which backend.
        backend: BackendKind,
        /// The URL.
        url: String,
        /// The bytes a reply may have.
        limit: u64,
        /// The cap the request sent.
        max_output_tokens: u32,
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
    format!(
        "{look}: {why}. If it is only slow, raise `{limit}` (`HttpConfig`; `{limit}_secs` in `cargo promptgen`'s metadata)."
    )
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

#[cfg(test)]
mod tests {
    use super::*;

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
