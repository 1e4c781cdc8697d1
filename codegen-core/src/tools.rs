//! The four tools a model works with, as it sees them.
//!
//! The descriptions are part of the product: a model picks a tool and fills its arguments
//! from this text alone, so each one says what the tool does, what the paths are relative
//! to, and what it must not be used for.

use serde_json::json;

use crate::chat::ToolSpec;

/// `read_file(path)`.
pub const READ_FILE: &str = "read_file";
/// `write_file(path, content)`.
pub const WRITE_FILE: &str = "write_file";
/// `list_files(dir?)`.
pub const LIST_FILES: &str = "list_files";
/// `finish(summary)`.
pub const FINISH: &str = "finish";

/// The names of every tool, in the order they are offered.
pub const TOOL_NAMES: [&str; 4] = [READ_FILE, WRITE_FILE, LIST_FILES, FINISH];

/// The tool definitions sent to the model.
pub fn tool_specs() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: READ_FILE,
            description: "Read a whole text file and return its content. Use it to look at a file \
                          before you change it or when your task refers to it. `path` is relative \
                          to the project root, uses forward slashes, and must be one of the paths \
                          that list_files shows.",
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Relative path of the file, e.g. \"src/view.rs\"."}
                },
                "required": ["path"]
            }),
        },
        ToolSpec {
            name: WRITE_FILE,
            description: "Create or replace a text file with exactly `content`: the complete file, \
                          never a fragment, a diff or a placeholder such as \"rest unchanged\". \
                          `path` is relative to the output folder and uses forward slashes; \
                          folders are created as needed. Call it once per file you produce.",
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Relative path of the file to write, e.g. \"view.rs\"."},
                    "content": {"type": "string", "description": "The complete new content of the file."}
                },
                "required": ["path", "content"]
            }),
        },
        ToolSpec {
            name: LIST_FILES,
            description: "List the files you may read, one relative path per line. Without `dir` \
                          it lists everything; with `dir` only the files under that folder.",
            parameters: json!({
                "type": "object",
                "properties": {
                    "dir": {"type": "string", "description": "Optional folder to list, e.g. \"src\"."}
                }
            }),
        },
        ToolSpec {
            name: FINISH,
            description: "Declare the task complete once every file it asks for has been written. \
                          Call it exactly once, as your last action, with a one-sentence summary \
                          of what you wrote.",
            parameters: json!({
                "type": "object",
                "properties": {
                    "summary": {"type": "string", "description": "One sentence on what you did."}
                },
                "required": ["summary"]
            }),
        },
    ]
}
