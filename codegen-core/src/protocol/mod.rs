//! How a model expresses tool calls: natively, as JSON in text, or as `@@@` blocks.

pub mod blocks;
pub mod text;

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
