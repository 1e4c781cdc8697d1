//! Opening a backend from its configuration: the one place that knows every backend.

use std::path::PathBuf;

use super::chat::Backend;
use super::config::BackendConfig;
use super::error::BackendError;
use super::kind::BackendKind;
use super::scripted::{self, ScriptPart};
#[cfg(feature = "http")]
use super::{ollama, openai};

impl BackendConfig {
    /// Opens the backend, reading the environment for what the configuration leaves open.
    pub fn open(&self) -> Result<Box<dyn Backend>, BackendError> {
        self.open_for(ScriptPart::Fresh)
    }

    /// Opens the backend for a step that runs again from its recorded files. Only a script
    /// answers differently (from its `[[edit.turn]]`s); a model is told in its prompt.
    pub fn open_for_edit(&self) -> Result<Box<dyn Backend>, BackendError> {
        self.open_for(ScriptPart::Edit)
    }

    fn open_for(&self, part: ScriptPart) -> Result<Box<dyn Backend>, BackendError> {
        Ok(match self.kind {
            #[cfg(feature = "http")]
            BackendKind::Ollama => Box::new(ollama::Ollama::from_config(self)?),
            #[cfg(feature = "http")]
            BackendKind::OpenAi => Box::new(openai::OpenAi::from_config(self)?),
            #[cfg(not(feature = "http"))]
            kind @ (BackendKind::Ollama | BackendKind::OpenAi) => {
                return Err(BackendError::Config {
                    backend: kind,
                    url: self.base_url.clone().unwrap_or_default(),
                    detail: "this build of codegen-core has no HTTP client (its `http` feature is off; in a build \
                             script, cargo-promptgen's `online` feature turns it on)"
                        .into(),
                });
            }
            BackendKind::Scripted => {
                let path = self.script.clone().ok_or_else(|| BackendError::Script {
                    path: PathBuf::new(),
                    detail: "the scripted backend needs a script file and none was configured".into(),
                })?;
                Box::new(scripted::Scripted::from_file_part(&path, part)?)
            }
        })
    }
}
