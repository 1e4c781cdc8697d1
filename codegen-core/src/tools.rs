//! The six tools a model works with, as it sees them: `read_file`, `write_file`, `edit_file`,
//! `list_files` and `finish` in every step, and `check` in a step that has a
//! [`Check`](crate::check::Check).
//!
//! The descriptions are part of the product: a model picks a tool and fills its arguments
//! from this text alone, so each one says what the tool does, what the paths are relative
//! to, and what it must not be used for.

use serde_json::json;

use crate::chat::{Arguments, ToolSpec};
use crate::sandbox::Sandbox;

/// `read_file(path)`.
pub const READ_FILE: &str = "read_file";
/// `write_file(path, content)`.
pub const WRITE_FILE: &str = "write_file";
/// `edit_file(path, old, new)`: replace text that occurs once in a file of the step's.
pub const EDIT_FILE: &str = "edit_file";
/// `list_files(dir?)`.
pub const LIST_FILES: &str = "list_files";
/// `finish(summary)`.
pub const FINISH: &str = "finish";

/// `check()`: offered only when the step has a [`Check`](crate::check::Check).
pub const CHECK: &str = "check";

/// The names of the five tools every step is offered, in that order; [`CHECK`], the sixth, is
/// offered after them, and only when the step has a check.
pub const TOOL_NAMES: [&str; 5] = [READ_FILE, WRITE_FILE, EDIT_FILE, LIST_FILES, FINISH];

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
            name: EDIT_FILE,
            description: "Change part of a file that exists in the output folder: `old` is text copied \
                          exactly from the file, which must occur there once, and `new` replaces it. \
                          Use it to fix a few lines instead of writing the whole file again. Several \
                          changes to one file go in `edits`, a list of {old, new}, applied in order, \
                          all or none.",
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Relative path of the file to change, e.g. \"view.rs\"."},
                    "old": {"type": "string", "description": "The exact text to replace, with enough lines around the change to occur only once."},
                    "new": {"type": "string", "description": "The text that replaces it."}
                },
                "required": ["path", "old", "new"]
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

/// The tool definitions for a step, with the `check` tool when it has a check.
pub fn specs_for(with_check: bool) -> Vec<ToolSpec> {
    let mut specs = tool_specs();
    if with_check {
        specs.push(ToolSpec {
            name: CHECK,
            description: "Compile-check (or otherwise check) every file written so far, exactly as \
                          `finish` will, and return the errors, if any. Use it after writing code to \
                          fix mistakes before you finish.",
            parameters: json!({"type": "object", "properties": {}}),
        });
    }
    specs
}

/// What running one tool call came to.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ToolOutcome {
    /// It ran; the text goes back to the model.
    Ran(String),
    /// It was refused; the text says what was wrong and what is allowed, for the model.
    Refused(String),
    /// The model called `finish` with this summary (the loop decides whether to accept it).
    Finish(String),
}

/// Runs one call against the sandbox. Every way the model can get a call wrong (unknown
/// tool, malformed or missing arguments, a path the sandbox refuses) is a
/// [`ToolOutcome::Refused`] naming the exact problem; nothing here fails the step.
pub(crate) fn execute(name: &str, arguments: &Arguments, sandbox: &mut Sandbox) -> ToolOutcome {
    let args = match arguments {
        Arguments::Object(map) => map,
        Arguments::Malformed { raw, error } => {
            return ToolOutcome::Refused(format!(
                "the arguments of `{name}` could not be read ({error}). They must be one JSON object, \
                 e.g. {}; you sent: {}",
                example_arguments(name),
                crate::report::excerpt(raw, 200)
            ));
        }
    };
    let result = match name {
        READ_FILE => string_arg(name, args, "path").map(|path| sandbox.read_file(path).map_err(|r| r.to_string())),
        WRITE_FILE => string_arg(name, args, "path").and_then(|path| {
            let content = string_arg(name, args, "content")?;
            Ok(sandbox
                .write_file(path, content)
                .map(|w| {
                    let state = if w.changed { "written" } else { "unchanged (same content)" };
                    format!("{}: {state}, {} bytes.", w.path, w.bytes)
                })
                .map_err(|r| r.to_string()))
        }),
        EDIT_FILE => string_arg(name, args, "path").and_then(|path| {
            let edits = edits_arg(args)?;
            Ok(sandbox.edit_file(path, &edits).map(|done| edited(&done)).map_err(|r| r.to_string()))
        }),
        LIST_FILES => optional_string_arg(name, args, "dir").map(|dir| {
            sandbox
                .list_files(dir)
                .map(|files| if files.is_empty() { "(no files yet)".to_string() } else { files.join("\n") })
                .map_err(|r| r.to_string())
        }),
        FINISH => {
            return match optional_string_arg(name, args, "summary") {
                Ok(summary) => ToolOutcome::Finish(summary.unwrap_or_default().to_string()),
                Err(problem) => ToolOutcome::Refused(problem),
            };
        }
        unknown => Err(format!(
            "there is no tool `{}`. The tools are: {}.",
            crate::report::excerpt(unknown, 60),
            TOOL_NAMES.join(", ")
        )),
    };
    match result {
        Ok(Ok(text)) => ToolOutcome::Ran(text),
        Ok(Err(problem)) | Err(problem) => ToolOutcome::Refused(problem),
    }
}

/// What the model is told of an edit that was applied.
fn edited(done: &crate::sandbox::EditOutcome) -> String {
    let lines: Vec<String> = done.matches.iter().map(|m| m.line.to_string()).collect();
    let state = if done.write.changed { "edited" } else { "unchanged (the edit gave the same content)" };
    let mut text = format!(
        "{}: {state} at line{} {}, now {} bytes.",
        done.write.path,
        if lines.len() == 1 { "" } else { "s" },
        lines.join(", "),
        done.write.bytes
    );
    if done.matches.iter().any(|m| m.loose) {
        text.push_str(
            " `old` matched only once trailing whitespace and line endings were set aside; the file's own were \
             replaced with yours there.",
        );
    }
    text
}

/// The edits of an `edit_file` call: `old` and `new`, or `edits`, a list of them.
fn edits_arg(args: &Args) -> Result<Vec<crate::edit::Edit>, String> {
    let one = |args: &Args| -> Result<crate::edit::Edit, String> {
        Ok(crate::edit::Edit {
            old: string_arg(EDIT_FILE, args, "old")?.to_string(),
            new: string_arg(EDIT_FILE, args, "new")?.to_string(),
        })
    };
    match args.get("edits") {
        None | Some(serde_json::Value::Null) => one(args).map(|edit| vec![edit]),
        Some(serde_json::Value::Array(list)) if !args.contains_key("old") => list
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                serde_json::Value::Object(edit) => {
                    one(edit).map_err(|problem| format!("in edit {} of `edits`: {problem}", i + 1))
                }
                other => Err(format!(
                    "`edits` must be a list of {{\"old\": ..., \"new\": ...}} objects, and edit {} was {}",
                    i + 1,
                    crate::chat::json_kind(other)
                )),
            })
            .collect(),
        Some(_) => Err(format!(
            "`edit_file` takes either `old` and `new`, or `edits`, a list of {{\"old\": ..., \"new\": ...}}. Send e.g. {}.",
            example_arguments(EDIT_FILE)
        )),
    }
}

type Args = serde_json::Map<String, serde_json::Value>;

fn string_arg<'a>(tool: &str, args: &'a Args, key: &str) -> Result<&'a str, String> {
    match args.get(key) {
        Some(serde_json::Value::String(s)) => Ok(s),
        Some(other) => Err(format!(
            "`{tool}` needs `{key}` to be a string, and it was {}. Send e.g. {}.",
            crate::chat::json_kind(other),
            example_arguments(tool)
        )),
        None => Err(format!(
            "`{tool}` needs the argument `{key}`{}. Send e.g. {}.",
            received_keys(args),
            example_arguments(tool)
        )),
    }
}

fn optional_string_arg<'a>(tool: &str, args: &'a Args, key: &str) -> Result<Option<&'a str>, String> {
    match args.get(key) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(_) => string_arg(tool, args, key).map(Some),
    }
}

fn received_keys(args: &Args) -> String {
    if args.is_empty() {
        " and no arguments were sent".to_string()
    } else {
        let keys: Vec<String> = args.keys().map(|k| format!("`{}`", crate::report::excerpt(k, 40))).collect();
        format!(" and got only {}", keys.join(", "))
    }
}

fn example_arguments(tool: &str) -> &'static str {
    match tool {
        READ_FILE => r#"{"path": "src/view.rs"}"#,
        WRITE_FILE => r#"{"path": "view.rs", "content": "<the whole file>"}"#,
        EDIT_FILE => r#"{"path": "view.rs", "old": "<lines copied from the file>", "new": "<what replaces them>"}"#,
        LIST_FILES => r#"{"dir": "src"} or {}"#,
        FINISH => r#"{"summary": "Wrote view.rs."}"#,
        _ => r#"{"path": "view.rs"}"#,
    }
}
