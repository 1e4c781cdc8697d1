//! Canned model turns from a file: for tests and for reproducible demos.
//!
//! A script is not a model, and this backend says so everywhere it is named: its kind is
//! `scripted`, its location is the script's path, and it reports no token usage. Each
//! request is answered with the script's next turn, whatever the request says; a step that
//! asks for more turns than the script has fails with [`BackendError::ScriptExhausted`].
//!
//! The file is TOML (or JSON, when its name ends in `.json`); TOML's multi-line literal
//! strings keep code readable:
//!
//! ```toml
//! [[turn]]
//! content = "I'll look at the existing view first."
//! [[turn.call]]
//! name = "read_file"
//! arguments = { path = "view.rs" }
//!
//! [[turn]]
//! [[turn.call]]
//! name = "write_file"
//! [turn.call.arguments]
//! path = "presenter.rs"
//! content = '''
//! pub struct Presenter;
//! '''
//! ```
//!
//! For the `json` and `blocks` protocols a turn has only `content`, written the way such a
//! model writes its answer.
//!
//! A step that runs again from its recorded files (a re-run by edit) is answered from the
//! script's `[[edit.turn]]`s when it has them, so one script shows both the first run and a
//! later change made by `edit_file`; without them it gets the `[[turn]]`s again:
//!
//! ```toml
//! [[edit.turn]]
//! [[edit.turn.call]]
//! name = "edit_file"
//! arguments = { path = "presenter.rs", old = "Hello", new = "Hi" }
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::chat::{Backend, ChatRequest, ChatResponse, Delivery, Usage};
use super::error::BackendError;
use super::kind::BackendKind;
use super::wire::IdMinter;
use crate::chat::{Arguments, Message, ToolCall};

/// A backend that answers from a script of canned turns.
#[derive(Debug)]
pub struct Scripted {
    path: PathBuf,
    turns: Vec<Message>,
    next: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptFile {
    #[serde(rename = "turn", default)]
    turns: Vec<ScriptTurn>,
    edit: Option<EditTurns>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EditTurns {
    #[serde(rename = "turn", default)]
    turns: Vec<ScriptTurn>,
}

/// Which of a script's turns a run is answered from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptPart {
    /// The `[[turn]]`s: a step run from nothing.
    Fresh,
    /// The `[[edit.turn]]`s, when the script has them, else the `[[turn]]`s: a step run again
    /// from its recorded files.
    Edit,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptTurn {
    #[serde(default)]
    content: String,
    #[serde(rename = "call", default)]
    calls: Vec<ScriptCall>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptCall {
    id: Option<String>,
    name: String,
    #[serde(default)]
    arguments: Value,
}

impl Scripted {
    /// Reads a script file (TOML, or JSON when the name ends in `.json`), for a step run from
    /// nothing.
    pub fn from_file(path: &Path) -> Result<Scripted, BackendError> {
        Scripted::from_file_part(path, ScriptPart::Fresh)
    }

    /// Reads a script file, serving `part` of its turns.
    pub fn from_file_part(path: &Path, part: ScriptPart) -> Result<Scripted, BackendError> {
        let script_error = |detail: String| BackendError::Script { path: path.to_owned(), detail };
        let text = crate::fs::read_to_string(path).map_err(|e| script_error(e.to_string()))?;
        let file: ScriptFile = if path.extension().is_some_and(|ext| ext == "json") {
            serde_json::from_str(&text).map_err(|e| script_error(format!("not a valid script: {e}")))?
        } else {
            toml::from_str(&text).map_err(|e| script_error(format!("not a valid script: {e}")))?
        };
        if file.turns.is_empty() {
            return Err(script_error("it has no turns; add at least one `[[turn]]`".into()));
        }
        if file.edit.as_ref().is_some_and(|edit| edit.turns.is_empty()) {
            return Err(script_error("its `edit` table has no turns; add an `[[edit.turn]]` or remove it".into()));
        }
        let turns = match (part, file.edit) {
            (ScriptPart::Edit, Some(edit)) => edit.turns,
            _ => file.turns,
        };
        let mut ids = IdMinter::default();
        let turns = turns
            .into_iter()
            .map(|turn| {
                let calls = turn
                    .calls
                    .into_iter()
                    .map(|call| ToolCall {
                        id: ids.keep_or_mint(call.id),
                        name: call.name,
                        arguments: Arguments::from_value(call.arguments),
                    })
                    .collect();
                Message::assistant(turn.content, calls)
            })
            .collect();
        Ok(Scripted { path: path.to_owned(), turns, next: 0 })
    }

    /// A script held in memory, e.g. for tests; `label` stands in for the path in messages.
    pub fn from_turns(label: impl Into<PathBuf>, turns: Vec<Message>) -> Scripted {
        Scripted { path: label.into(), turns, next: 0 }
    }

    /// Turns not yet served.
    pub fn remaining(&self) -> usize {
        self.turns.len() - self.next
    }
}

impl Backend for Scripted {
    fn kind(&self) -> BackendKind {
        BackendKind::Scripted
    }

    fn location(&self) -> String {
        format!("script {}", self.path.display())
    }

    fn chat(&mut self, _request: &ChatRequest<'_>) -> Result<ChatResponse, BackendError> {
        let turn = self
            .turns
            .get(self.next)
            .cloned()
            .ok_or_else(|| BackendError::ScriptExhausted { path: self.path.clone(), turns: self.turns.len() })?;
        self.next += 1;
        Ok(ChatResponse {
            message: turn,
            usage: Usage::default(),
            finish_reason: Some("scripted".into()),
            retries: Vec::new(),
            delivery: Delivery::Whole,
            prompt_cache: None,
        })
    }
}
