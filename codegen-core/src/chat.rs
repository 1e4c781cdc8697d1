//! The protocol-neutral conversation: messages, tool calls and tool definitions.
//!
//! Backends translate these to and from their wire shapes; the loop and the text protocols
//! only ever see these types.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Who speaks a [`Message`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions that frame the whole conversation.
    System,
    /// The user (the prompt, and the loop's own repair turns and text-protocol results).
    User,
    /// The model.
    Assistant,
    /// The result of one native tool call.
    Tool,
}

/// One turn of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who speaks.
    pub role: Role,
    /// The text of the turn; empty when an assistant turn only calls tools.
    #[serde(default)]
    pub content: String,
    /// Native tool calls made in an assistant turn.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a [`Role::Tool`] turn: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// For a [`Role::Tool`] turn: the name of the tool that ran (Ollama wants it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
}

impl Message {
    fn plain(role: Role, content: impl Into<String>) -> Message {
        Message { role, content: content.into(), tool_calls: Vec::new(), tool_call_id: None, tool_name: None }
    }

    /// A system turn.
    pub fn system(content: impl Into<String>) -> Message {
        Message::plain(Role::System, content)
    }

    /// A user turn.
    pub fn user(content: impl Into<String>) -> Message {
        Message::plain(Role::User, content)
    }

    /// An assistant turn, with the native tool calls it made (if any).
    pub fn assistant(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Message {
        Message { tool_calls, ..Message::plain(Role::Assistant, content) }
    }

    /// The result of the native tool call `call`.
    pub fn tool_result(call: &ToolCall, content: impl Into<String>) -> Message {
        Message {
            tool_call_id: Some(call.id.clone()),
            tool_name: Some(call.name.clone()),
            ..Message::plain(Role::Tool, content)
        }
    }
}

/// One tool call, however the model expressed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The server's id for the call, or one we minted when the server sent none.
    pub id: String,
    /// The tool's name as the model wrote it (it may name no tool we have).
    pub name: String,
    /// The arguments, or why they could not be read.
    pub arguments: Arguments,
}

/// The arguments of a [`ToolCall`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arguments {
    /// A JSON object, as every tool expects.
    Object(Map<String, Value>),
    /// Arguments the model sent that are not a JSON object. Kept verbatim so the repair turn
    /// can quote them and the echo to the server is byte-for-byte what the model said.
    Malformed {
        /// The text as received (for a non-string JSON value, its serialisation).
        raw: String,
        /// Why it is not a JSON object.
        error: String,
    },
}

impl Arguments {
    /// Reads arguments that arrived as JSON *text* (the OpenAI shape): `""` means `{}`,
    /// anything else must be a JSON object.
    pub fn from_json_text(text: &str) -> Arguments {
        if text.trim().is_empty() {
            return Arguments::Object(Map::new());
        }
        match serde_json::from_str::<Value>(text) {
            Ok(value) => Arguments::from_value_with_raw(value, text),
            // Models often put raw line breaks and tabs inside JSON strings (code, above all).
            // That has one meaning only, so read it rather than spend a model call on a repair.
            Err(err) if err.is_syntax() => match escape_control_characters_in_strings(text)
                .and_then(|fixed| serde_json::from_str::<Value>(&fixed).ok())
            {
                Some(value) => Arguments::from_value_with_raw(value, text),
                None => Arguments::Malformed { raw: text.to_owned(), error: format!("not valid JSON: {err}") },
            },
            Err(err) => Arguments::Malformed { raw: text.to_owned(), error: format!("not valid JSON: {err}") },
        }
    }

    /// Reads arguments that arrived as a JSON value (the Ollama shape, or a llama.cpp server
    /// that sent an object where OpenAI sends a string). A string value is parsed as JSON text.
    pub fn from_value(value: Value) -> Arguments {
        match value {
            Value::String(text) => Arguments::from_json_text(&text),
            Value::Null => Arguments::Object(Map::new()),
            other => {
                let raw = other.to_string();
                Arguments::from_value_with_raw(other, &raw)
            }
        }
    }

    fn from_value_with_raw(value: Value, raw: &str) -> Arguments {
        match value {
            Value::Object(map) => Arguments::Object(map),
            other => Arguments::Malformed {
                raw: raw.to_owned(),
                error: format!("expected a JSON object of named arguments, got {}", json_kind(&other)),
            },
        }
    }

    /// The arguments as JSON text, for protocols that carry them as a string.
    pub fn to_json_text(&self) -> String {
        match self {
            Arguments::Object(map) => Value::Object(map.clone()).to_string(),
            Arguments::Malformed { raw, .. } => raw.clone(),
        }
    }

    /// The arguments as a JSON object, for protocols that carry them as one. Malformed
    /// arguments become `{}`: a server that requires an object would reject anything else.
    pub fn to_json_object(&self) -> Value {
        match self {
            Arguments::Object(map) => Value::Object(map.clone()),
            Arguments::Malformed { .. } => Value::Object(Map::new()),
        }
    }
}

/// `text` with every raw control character inside a JSON string escaped (`\n`, `\t`,
/// `\u0001`...), or `None` when there was none to escape.
fn escape_control_characters_in_strings(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len() + 16);
    let (mut in_string, mut escaped, mut changed) = (false, false, false);
    for c in text.chars() {
        if in_string && !escaped && c.is_control() && (c as u32) < 0x20 {
            changed = true;
            match c {
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                other => out.push_str(&format!("\\u{:04x}", other as u32)),
            }
            continue;
        }
        out.push(c);
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
        }
    }
    changed.then_some(out)
}

/// A short English name for the kind of a JSON value, for error messages.
pub(crate) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A tool as offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolSpec {
    /// The name the model calls it by.
    pub name: &'static str,
    /// What it does and when to use it: the model chooses tools from this text.
    pub description: &'static str,
    /// A JSON schema of its arguments.
    pub parameters: Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_line_breaks_inside_strings_are_read_as_escapes() {
        let text = "{\"path\": \"a.py\", \"content\": \"def f():\n\treturn 1\n\"}";
        let expected = serde_json::json!({"path": "a.py", "content": "def f():\n\treturn 1\n"});
        assert_eq!(Arguments::from_json_text(text), Arguments::Object(expected.as_object().unwrap().clone()));
    }

    #[test]
    fn other_broken_json_stays_malformed_and_keeps_its_text() {
        for text in ["{\"path\": ", "{\"a\": \"x\n\" \"b\"}", "[1, 2]", "\"just a string\""] {
            match Arguments::from_json_text(text) {
                Arguments::Malformed { raw, .. } => assert_eq!(raw, text),
                other => panic!("{text:?} gave {other:?}"),
            }
        }
        assert_eq!(Arguments::from_json_text("  "), Arguments::Object(Map::new()));
    }
}
