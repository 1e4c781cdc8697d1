//! How a model expresses tool calls: natively, as JSON in text, or as `@@@` blocks.

pub mod blocks;
pub mod text;

use std::fmt;

use serde::{Deserialize, Serialize};

/// The way a model calls tools during a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolProtocol {
    /// The protocol's own `tools` field; tool calls written as text in the content are
    /// recognised too (qwen2.5-coder does that).
    #[default]
    Native,
    /// Tools described in the system prompt; the model answers with a JSON object naming the
    /// tool and its arguments.
    Json,
    /// `@@@read(file)`, `@@@write_begin(file)` ... `@@@write_end`, `@@@done`: code needs no
    /// JSON escaping, which small models handle better.
    Blocks,
}

impl ToolProtocol {
    /// Every protocol.
    pub const ALL: [ToolProtocol; 3] = [ToolProtocol::Native, ToolProtocol::Json, ToolProtocol::Blocks];

    /// The protocol as configuration spells it: `native`, `json`, `blocks`.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolProtocol::Native => "native",
            ToolProtocol::Json => "json",
            ToolProtocol::Blocks => "blocks",
        }
    }

    /// How a model changes a few lines of a file in this protocol, as the instructions name
    /// it: `edit_file`, or an `@@@edit_begin` block.
    pub fn edit_named(self) -> &'static str {
        match self {
            ToolProtocol::Blocks => "an @@@edit_begin block",
            ToolProtocol::Native | ToolProtocol::Json => crate::tools::EDIT_FILE,
        }
    }
}

impl fmt::Display for ToolProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
