//! Which kind of server a backend talks to.

use std::fmt;

use serde::{Deserialize, Serialize};

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
