//! Constrained decoding: the server, not the model, guarantees that every reply is one tool
//! call the loop can run.
//!
//! Small models get the *shape* of a tool call wrong far more often than its content: prose
//! instead of a call, JSON that does not parse, a call to a file the step may not write.
//! Servers built on llama.cpp (and vLLM, Ollama, OpenAI) can restrict sampling to a JSON
//! schema or a grammar, so that no other reply can be generated at all. With
//! [`Constrain::Auto`] (the default) a step asks its backend what the server can enforce
//! ([`Backend::enforcement`](crate::backend::Backend::enforcement)) and, per protocol:
//!
//! | protocol | constrained with | |
//! |---|---|---|
//! | `json` | a JSON schema ([`Constraint::JsonSchema`]) | `{"tool": ..., "arguments": {...}}`, one branch per tool |
//! | `blocks` | a GBNF grammar ([`Constraint::Grammar`]) | exactly one `@@@` command per reply |
//! | `native` | `tool_choice: "required"` and narrowed tools ([`Constraint::ToolCall`]) | where the server applies it; else the step is carried in `json` under a schema ([`plan`]) |
//!
//! Each turn's constraint admits only what the loop would accept *at that point*
//! ([`Admissible`]): `write_file` to a declared output, `read_file` of a readable file (an
//! enum when there are few enough to list, else a pattern that excludes absolute and
//! parent-relative paths), `finish` only once every declared output exists, and a file's
//! content no longer than the reply may be, so that a reply is never cut off in the middle of
//! its call.
//!
//! A server that rejects the constraint is asked again without it, once per step; the step
//! says so in its notes and its transcript ([`Event::Unconstrained`](crate::transcript::Event::Unconstrained)).

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::chat::ToolSpec;
use crate::protocol::ToolProtocol;
use crate::tools;

/// Whether a step asks the server to enforce its protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Constrain {
    /// Wherever the server can enforce the step's protocol (see [`plan`]).
    #[default]
    Auto,
    /// Never: the model is only told the protocol, as before constrained decoding.
    Off,
}

impl Constrain {
    /// As configuration spells it: `auto`, `off`.
    pub fn as_str(self) -> &'static str {
        match self {
            Constrain::Auto => "auto",
            Constrain::Off => "off",
        }
    }
}

impl fmt::Display for Constrain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a server can enforce, as its backend found out (once, when first asked).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Enforcement {
    /// The server, as identified: `llama-server`, `llama-cpp-python`, `vLLM`, `Ollama 0.6.2`,
    /// `OpenAI`. Empty when it is not known.
    pub server: String,
    /// It restricts a reply to a JSON schema.
    pub json_schema: bool,
    /// It restricts a reply to a GBNF grammar.
    pub grammar: bool,
    /// It makes the model call one of the offered tools (`tool_choice: "required"`).
    pub tool_call: bool,
    /// Why nothing (or not native tool calls) can be enforced, for the step's notes; `None`
    /// where there is nothing to say (the scripted backend).
    pub why_not: Option<String>,
    /// The most tokens a reply may have, which bounds a constrained file's length
    /// ([`Admissible::content_chars_for`]); `None`: the default.
    pub max_output_tokens: Option<u32>,
}

impl Enforcement {
    /// A server that enforces nothing, and why (`None`: nothing worth a note).
    pub fn nothing(why_not: Option<String>) -> Enforcement {
        Enforcement { why_not, ..Enforcement::default() }
    }
}

/// The kind of constraint a step runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ConstraintKind {
    /// A JSON schema of the `json` protocol's calls.
    JsonSchema,
    /// A GBNF grammar of the `blocks` protocol's commands.
    Grammar,
    /// Native tool calls, one required per reply.
    ToolCall,
}

impl ConstraintKind {
    /// For messages: `a JSON schema`, `a grammar`, `a required tool call`.
    pub fn describe(self) -> &'static str {
        match self {
            ConstraintKind::JsonSchema => "a JSON schema",
            ConstraintKind::Grammar => "a GBNF grammar",
            ConstraintKind::ToolCall => "a required tool call",
        }
    }
}

/// The constraint one request carries.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Constraint {
    /// The reply is one JSON document of this schema (JSON text).
    JsonSchema(String),
    /// The reply is one sentence of this GBNF grammar.
    Grammar(String),
    /// The reply calls one of the request's tools (already narrowed to what may run now).
    ToolCall,
}

impl Constraint {
    /// Its kind.
    pub fn kind(&self) -> ConstraintKind {
        match self {
            Constraint::JsonSchema(_) => ConstraintKind::JsonSchema,
            Constraint::Grammar(_) => ConstraintKind::Grammar,
            Constraint::ToolCall => ConstraintKind::ToolCall,
        }
    }

    /// `sha256:` and the first 16 hex digits of the SHA-256 of the constraint's kind and text:
    /// what a transcript records of it (the text is derived from the step, and long).
    pub fn digest(&self) -> String {
        let text = match self {
            Constraint::JsonSchema(schema) => schema.as_str(),
            Constraint::Grammar(grammar) => grammar.as_str(),
            Constraint::ToolCall => "",
        };
        let mut hasher = Sha256::new();
        hasher.update(format!("{:?}\n", self.kind()).as_bytes());
        hasher.update(text.as_bytes());
        let hex: String = hasher.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect();
        format!("sha256:{hex}")
    }
}

/// How a step runs under [`Constrain::Auto`], decided at its start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The protocol it runs in: the one asked for, or `json` carrying a `native` step.
    pub protocol: ToolProtocol,
    /// What constrains its requests, if anything.
    pub kind: Option<ConstraintKind>,
    /// What the user should know about it.
    pub note: Option<String>,
}

/// How a step asking for `protocol` runs against a server that enforces `enforcement`.
///
/// `native` is constrained by a required tool call where the server applies one; where it
/// does not but takes a JSON schema, the step is carried in the `json` protocol under the
/// schema (and the note says so): a reply that is a valid call beats one in the asked-for
/// wire format that is not.
pub fn plan(protocol: ToolProtocol, enforcement: &Enforcement) -> Plan {
    let server = if enforcement.server.is_empty() { "the server" } else { enforcement.server.as_str() };
    let unconstrained = |why: String| Plan { protocol, kind: None, note: Some(why) };
    let why = enforcement.why_not.clone();
    match protocol {
        ToolProtocol::Native if enforcement.tool_call => {
            Plan { protocol, kind: Some(ConstraintKind::ToolCall), note: None }
        }
        ToolProtocol::Native if enforcement.json_schema || enforcement.grammar => {
            let kind = json_constraint(enforcement);
            Plan {
                protocol: ToolProtocol::Json,
                kind: Some(kind),
                note: Some(format!(
                    "{server} cannot be made to call a tool natively{}, so this step ran in the `json` protocol under {} \
                     it enforces; set `constrain = \"off\"` to keep native tool calls, unconstrained",
                    why.map(|why| format!(" ({why})")).unwrap_or_default(),
                    kind.describe()
                )),
            }
        }
        ToolProtocol::Json if enforcement.json_schema || enforcement.grammar => {
            Plan { protocol, kind: Some(json_constraint(enforcement)), note: None }
        }
        ToolProtocol::Blocks if enforcement.grammar => {
            Plan { protocol, kind: Some(ConstraintKind::Grammar), note: None }
        }
        _ => match why {
            Some(why) if !enforcement.json_schema && !enforcement.grammar && !enforcement.tool_call => {
                unconstrained(format!("nothing constrained this step's replies: {why}"))
            }
            None if enforcement.server.is_empty() => Plan { protocol, kind: None, note: None },
            _ => unconstrained(format!(
                "{server} cannot enforce the `{protocol}` protocol, so this step's replies were not constrained; the \
                 `{}` protocol can be",
                if enforcement.json_schema {
                    "json"
                } else if enforcement.grammar {
                    "blocks"
                } else {
                    "native"
                }
            )),
        },
    }
}

/// How a `json` step is constrained: by a grammar where the server takes one, else by a JSON
/// schema. The grammar writes the call with no whitespace of the model's choosing: a schema
/// compiled by the server admits any whitespace between tokens, and a reply the model spread
/// over `"\n"` tokens is tokenized differently when it comes back in the history, so the
/// server's prompt cache misses from there on (measured on llama-server: 2.5x the new tokens
/// read again per turn under a schema, 1.0x under the grammar).
fn json_constraint(enforcement: &Enforcement) -> ConstraintKind {
    if enforcement.grammar { ConstraintKind::Grammar } else { ConstraintKind::JsonSchema }
}

/// What the loop would accept from the model this turn, from which each turn's constraint is
/// made.
#[derive(Debug, Clone, PartialEq)]
pub struct Admissible {
    /// The files `write_file` may write: the declared outputs; empty when the step declares
    /// none (then any relative path).
    pub writable: Vec<String>,
    /// The files `edit_file` may change: the declared outputs that exist now (none, when the
    /// step declares none: then no edits are admitted).
    pub editable: Vec<String>,
    /// The files `read_file` may read, when there are at most [`Admissible::MAX_LISTED`];
    /// `None` when there are more (then a pattern that excludes absolute and parent paths).
    pub readable: Option<Vec<String>>,
    /// Whether `finish` would be accepted: every declared output exists.
    pub finish: bool,
    /// Whether the step has a `check` tool (admitted, like `finish`, once every declared output
    /// exists).
    pub check: bool,
    /// Every declared output has been written in this step and nothing checks them: `finish`
    /// is then the only call that moves the step on (a small model otherwise rewrites the same
    /// file until its budget is spent), so it is the only one admitted.
    pub only_finish: bool,
    /// The most characters a file's content may have in one reply: the reply's token cap
    /// less room for the call around it (a token is at least one character), so that a
    /// constrained reply always ends within the cap.
    pub max_content_chars: u32,
}

/// Room for the call around a file's content, in tokens.
const CALL_OVERHEAD_TOKENS: u32 = 48;

/// A `finish` summary's longest form.
const MAX_SUMMARY_CHARS: u32 = 300;

/// Paths the sandbox could read: relative, not starting with `.` or `/`.
const PATH_PATTERN: &str = "^[A-Za-z0-9_][A-Za-z0-9_./-]*$";

impl Admissible {
    /// Readable files listed one by one up to this many; beyond it the constraint would grow
    /// with the project.
    pub const MAX_LISTED: usize = 64;

    /// The content bound for a reply cap of `max_output_tokens`.
    pub fn content_chars_for(max_output_tokens: u32) -> u32 {
        max_output_tokens.saturating_sub(CALL_OVERHEAD_TOKENS).max(16)
    }

    fn summary_chars(&self) -> u32 {
        MAX_SUMMARY_CHARS.min(self.max_content_chars)
    }

    /// The bound of each of an edit's `old` and `new`: half a file's, since both are in one
    /// reply.
    fn edit_chars(&self) -> u32 {
        (self.max_content_chars / 2).max(8)
    }

    /// The tools that may be called now, in order.
    fn tool_names(&self) -> Vec<&'static str> {
        if self.only_finish && self.finish {
            return vec![tools::FINISH];
        }
        let mut names = vec![tools::WRITE_FILE];
        if !self.editable.is_empty() {
            names.push(tools::EDIT_FILE);
        }
        // With nothing to read, reading and listing can only waste a call.
        if self.readable.as_ref().is_none_or(|files| !files.is_empty()) {
            names.push(tools::READ_FILE);
            names.push(tools::LIST_FILES);
        }
        // Checking a tree that still lacks an output can only fail (seen: a model asking for
        // `cargo test` four times before writing anything): like `finish`, once they exist.
        if self.check && self.finish {
            names.push(tools::CHECK);
        }
        if self.finish {
            names.push(tools::FINISH);
        }
        names
    }

    /// The JSON schema of one `json`-protocol reply: `{"tool": NAME, "arguments": {...}}`
    /// for each tool that may be called now, `tool` written first (servers generate keys in
    /// the schema's order, and the tool's name then steers its arguments).
    pub fn json_schema(&self) -> String {
        let branches: Vec<String> = self
            .tool_names()
            .into_iter()
            .map(|name| {
                let (arguments, required) = self.arguments_schema(name);
                object(
                    &[
                        ("tool", format!("{{\"const\":{}}}", json_string(name))),
                        ("arguments", object(&arguments, &required)),
                    ],
                    &["tool", "arguments"],
                )
            })
            .collect();
        format!("{{\"anyOf\":[{}]}}", branches.join(","))
    }

    /// The properties of a tool's arguments and which are required, as schema text.
    fn arguments_schema(&self, tool: &str) -> (Vec<(&'static str, String)>, Vec<&'static str>) {
        let string = |max: u32| format!("{{\"type\":\"string\",\"maxLength\":{max}}}");
        match tool {
            tools::WRITE_FILE => (
                vec![("path", self.path_schema(Some(&self.writable))), ("content", string(self.max_content_chars))],
                vec!["path", "content"],
            ),
            tools::EDIT_FILE => (
                vec![
                    ("path", self.path_schema(Some(&self.editable))),
                    ("old", format!("{{\"type\":\"string\",\"minLength\":1,\"maxLength\":{}}}", self.edit_chars())),
                    ("new", string(self.edit_chars())),
                ],
                vec!["path", "old", "new"],
            ),
            tools::READ_FILE => (vec![("path", self.path_schema(self.readable.as_ref()))], vec!["path"]),
            tools::LIST_FILES => (Vec::new(), Vec::new()),
            tools::FINISH => (vec![("summary", string(self.summary_chars()))], vec!["summary"]),
            _ => (Vec::new(), Vec::new()),
        }
    }

    fn path_schema(&self, files: Option<&Vec<String>>) -> String {
        match files {
            Some(files) if !files.is_empty() => {
                let names: Vec<String> = files.iter().map(|f| json_string(f)).collect();
                format!("{{\"enum\":[{}]}}", names.join(","))
            }
            _ => format!("{{\"type\":\"string\",\"pattern\":{},\"maxLength\":200}}", json_string(PATH_PATTERN)),
        }
    }

    /// The GBNF grammar of one reply in `protocol`: [`Admissible::json_grammar`] for `json`
    /// (and `native`, which a grammar carries in `json`), [`Admissible::blocks_grammar`] for
    /// `blocks`.
    pub fn grammar(&self, protocol: ToolProtocol) -> String {
        match protocol {
            ToolProtocol::Blocks => self.blocks_grammar(),
            ToolProtocol::Json | ToolProtocol::Native => self.json_grammar(),
        }
    }

    /// The GBNF grammar of one `json`-protocol reply: the calls of [`Admissible::json_schema`],
    /// written exactly as `{"tool": "write_file", "arguments": {"path": "a.rs", "content": "..."}}`,
    /// with no other whitespace, strings escaped as JSON requires.
    pub fn json_grammar(&self) -> String {
        let mut calls = Vec::new();
        let mut rules = Vec::new();
        for tool in self.tool_names() {
            let rule = format!("call-{}", tool.replace('_', "-"));
            let head = gbnf_literal(&format!("{{\"tool\": {}, \"arguments\": {{", json_string(tool)));
            let body = match tool {
                tools::WRITE_FILE => {
                    rules.push(format!("writable ::= {}", json_path_rule(Some(&self.writable))));
                    format!("{} writable {} content", gbnf_literal("\"path\": "), gbnf_literal(", \"content\": "))
                }
                tools::EDIT_FILE => {
                    rules.push(format!("editable ::= {}", json_path_rule(Some(&self.editable))));
                    rules.push(format!("old ::= \"\\\"\" jchar{{1,{}}} \"\\\"\"", self.edit_chars()));
                    rules.push(format!("new ::= \"\\\"\" jchar{{0,{}}} \"\\\"\"", self.edit_chars()));
                    format!(
                        "{} editable {} old {} new",
                        gbnf_literal("\"path\": "),
                        gbnf_literal(", \"old\": "),
                        gbnf_literal(", \"new\": ")
                    )
                }
                tools::READ_FILE => {
                    rules.push(format!("readable ::= {}", json_path_rule(self.readable.as_ref())));
                    format!("{} readable", gbnf_literal("\"path\": "))
                }
                tools::FINISH => format!("{} summary", gbnf_literal("\"summary\": ")),
                _ => String::new(),
            };
            rules.push(format!("{rule} ::= {head} {body} \"}}}}\""));
            calls.push(rule);
        }
        rules.push(format!("content ::= \"\\\"\" jchar{{0,{}}} \"\\\"\"", self.max_content_chars));
        if self.finish {
            rules.push(format!("summary ::= \"\\\"\" jchar{{1,{}}} \"\\\"\"", self.summary_chars()));
        }
        rules.push(r#"jchar ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})"#.to_string());
        if rules.iter().any(|rule| rule.contains("jpath")) {
            rules.push("jpath ::= \"\\\"\" [A-Za-z0-9_] [A-Za-z0-9_./-]{0,199} \"\\\"\"".to_string());
        }
        gbnf(&calls, rules)
    }

    /// The GBNF grammar of one `blocks`-protocol reply: exactly one command, of the tools that
    /// may be called now (blocks has no `check` command), a write's content free of `@@@` and
    /// at most [`Admissible::max_content_chars`] pieces long.
    pub fn blocks_grammar(&self) -> String {
        let mut commands = Vec::new();
        let mut rules = Vec::new();
        for tool in self.tool_names() {
            match tool {
                tools::WRITE_FILE => {
                    commands.push("write".to_string());
                    rules.push(
                        "write ::= \"@@@write_begin(\" writable \")\\n\" content \"\\n@@@write_end\"".to_string(),
                    );
                    rules.push(format!("writable ::= {}", path_rule(Some(&self.writable))));
                    // No `@@@` inside a file: it would end the block early.
                    rules.push(format!("content ::= piece{{0,{}}}", self.max_content_chars));
                    if !rules.iter().any(|rule| rule.starts_with("piece ::=")) {
                        rules.push("piece ::= [^@] | \"@\" [^@] | \"@@\" [^@]".to_string());
                    }
                }
                tools::EDIT_FILE => {
                    commands.push("edit".to_string());
                    // One search/replace pair: the lines to find, then their replacement.
                    rules.push(
                        "edit ::= \"@@@edit_begin(\" editable \")\\n<<<<<<< SEARCH\\n\" old \"\\n=======\\n\" new \">>>>>>> REPLACE\\n@@@edit_end\""
                            .to_string(),
                    );
                    rules.push(format!("editable ::= {}", path_rule(Some(&self.editable))));
                    rules.push(format!("old ::= piece{{1,{}}}", self.edit_chars()));
                    rules.push(format!("new ::= (piece{{0,{}}} \"\\n\")?", self.edit_chars()));
                    if !rules.iter().any(|rule| rule.starts_with("piece ::=")) {
                        rules.push("piece ::= [^@] | \"@\" [^@] | \"@@\" [^@]".to_string());
                    }
                }
                tools::READ_FILE => {
                    commands.push("read".to_string());
                    rules.push("read ::= \"@@@read(\" readable \")\"".to_string());
                    rules.push(format!("readable ::= {}", path_rule(self.readable.as_ref())));
                }
                tools::LIST_FILES => {
                    commands.push("list".to_string());
                    rules.push("list ::= \"@@@list()\"".to_string());
                }
                tools::FINISH => {
                    commands.push("done".to_string());
                    rules.push(format!("done ::= \"@@@done(\" [^()\\n]{{1,{}}} \")\"", self.summary_chars()));
                }
                _ => {}
            }
        }
        if rules.iter().any(|rule| rule.contains(" path")) {
            rules.push("path ::= [A-Za-z0-9_] [A-Za-z0-9_./-]{0,199}".to_string());
        }
        gbnf(&commands, rules)
    }

    /// The tool definitions of a natively constrained turn: the step's tools, less those that
    /// cannot run now, their paths narrowed as in [`Admissible::json_schema`].
    pub fn tools(&self) -> Vec<ToolSpec> {
        let names = self.tool_names();
        tools::specs_for(self.check)
            .into_iter()
            .filter(|spec| names.contains(&spec.name))
            .map(|mut spec| {
                let files = match spec.name {
                    tools::WRITE_FILE => Some(&self.writable),
                    tools::EDIT_FILE => Some(&self.editable),
                    tools::READ_FILE => self.readable.as_ref(),
                    _ => None,
                };
                if let Some(files) = files.filter(|files| !files.is_empty())
                    && let Some(path) = spec.parameters.pointer_mut("/properties/path")
                {
                    path["enum"] = Value::from(files.clone());
                }
                spec
            })
            .collect()
    }
}

/// A grammar whose root is one of `alternatives`, with `rules` after it, a line each.
fn gbnf(alternatives: &[String], rules: Vec<String>) -> String {
    let mut out = format!("root ::= {}\n", alternatives.join(" | "));
    for rule in rules {
        out.push_str(&rule);
        out.push('\n');
    }
    out
}

/// A GBNF rule body for one of `files` as JSON strings, or any readable-looking path as one.
fn json_path_rule(files: Option<&Vec<String>>) -> String {
    match files {
        Some(files) if !files.is_empty() => {
            files.iter().map(|file| gbnf_literal(&json_string(file))).collect::<Vec<_>>().join(" | ")
        }
        _ => "jpath".to_string(),
    }
}

/// A GBNF rule body for one of `files`, or any readable-looking path when there is no list.
fn path_rule(files: Option<&Vec<String>>) -> String {
    match files {
        Some(files) if !files.is_empty() => files.iter().map(|file| gbnf_literal(file)).collect::<Vec<_>>().join(" | "),
        _ => "path".to_string(),
    }
}

/// `text` as a GBNF string literal.
fn gbnf_literal(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_string(text: &str) -> String {
    Value::String(text.to_string()).to_string()
}

/// A JSON-schema object with these properties in this order (a `serde_json` map would sort
/// them), no others.
fn object(properties: &[(&str, String)], required: &[&str]) -> String {
    let properties: Vec<String> =
        properties.iter().map(|(name, schema)| format!("{}:{schema}", json_string(name))).collect();
    let required: Vec<String> = required.iter().map(|name| json_string(name)).collect();
    format!(
        "{{\"type\":\"object\",\"properties\":{{{}}},\"required\":[{}],\"additionalProperties\":false}}",
        properties.join(","),
        required.join(",")
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn admissible(finish: bool) -> Admissible {
        Admissible {
            writable: vec!["a.rs".into()],
            editable: Vec::new(),
            readable: Some(vec!["src/lib.rs".into()]),
            finish,
            check: false,
            only_finish: false,
            max_content_chars: 100,
        }
    }

    fn branches(schema: &str) -> Vec<Value> {
        let value: Value = serde_json::from_str(schema).unwrap();
        value["anyOf"].as_array().unwrap().clone()
    }

    #[test]
    fn the_schema_admits_finish_only_once_the_outputs_exist_and_names_tool_first() {
        let before = admissible(false).json_schema();
        let tools: Vec<Value> = branches(&before).iter().map(|b| b["properties"]["tool"]["const"].clone()).collect();
        assert_eq!(tools, [json!("write_file"), json!("read_file"), json!("list_files")]);
        let after = admissible(true).json_schema();
        assert!(branches(&after).iter().any(|b| b["properties"]["tool"]["const"] == "finish"));
        let write = &branches(&before)[0];
        assert_eq!(write["properties"]["arguments"]["properties"]["path"]["enum"], json!(["a.rs"]));
        assert_eq!(write["properties"]["arguments"]["properties"]["content"]["maxLength"], 100);
        assert_eq!(write["properties"]["arguments"]["additionalProperties"], false);
        assert!(before.find("\"tool\"").unwrap() < before.find("\"arguments\"").unwrap(), "{before}");
    }

    #[test]
    fn without_a_short_list_paths_are_a_pattern_that_refuses_absolute_and_parent_paths() {
        let mut many = admissible(false);
        many.readable = None;
        many.writable.clear();
        let schema = many.json_schema();
        let read = &branches(&schema)[1];
        assert_eq!(read["properties"]["arguments"]["properties"]["path"]["pattern"], PATH_PATTERN);
        let pattern = PATH_PATTERN.trim_start_matches('^').trim_end_matches('$');
        assert!(!pattern.is_empty());
        // Nothing readable: no read_file at all.
        let mut none = admissible(false);
        none.readable = Some(Vec::new());
        assert!(branches(&none.json_schema()).iter().all(|b| b["properties"]["tool"]["const"] != "read_file"));
        assert!(!none.blocks_grammar().contains("read"));
        assert!(!none.json_grammar().contains("read_file"));
    }

    #[test]
    fn the_json_grammar_writes_each_call_one_way_and_admits_finish_only_once_allowed() {
        let grammar = admissible(true).json_grammar();
        let expected = [
            r#"root ::= call-write-file | call-read-file | call-list-files | call-finish"#,
            r#"writable ::= "\"a.rs\"""#,
            r#"call-write-file ::= "{\"tool\": \"write_file\", \"arguments\": {" "\"path\": " writable ", \"content\": " content "}}""#,
            r#"readable ::= "\"src/lib.rs\"""#,
            r#"call-read-file ::= "{\"tool\": \"read_file\", \"arguments\": {" "\"path\": " readable "}}""#,
            r#"call-list-files ::= "{\"tool\": \"list_files\", \"arguments\": {"  "}}""#,
            r#"call-finish ::= "{\"tool\": \"finish\", \"arguments\": {" "\"summary\": " summary "}}""#,
            r#"content ::= "\"" jchar{0,100} "\"""#,
            r#"summary ::= "\"" jchar{1,100} "\"""#,
            r#"jchar ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})"#,
        ];
        assert_eq!(grammar.lines().collect::<Vec<_>>(), expected, "{grammar}");
        let before = admissible(false).json_grammar();
        assert!(before.starts_with("root ::= call-write-file | call-read-file | call-list-files\n"), "{before}");
        assert!(!before.contains("summary"));
        let mut open = admissible(false);
        open.writable.clear();
        let grammar = open.json_grammar();
        assert!(grammar.contains("writable ::= jpath\n") && grammar.contains("jpath ::= "), "{grammar}");
    }

    #[test]
    fn the_grammar_holds_one_command_and_done_only_when_allowed() {
        let before = admissible(false).blocks_grammar();
        assert!(before.starts_with("root ::= write | read | list\n"), "{before}");
        assert!(before.contains("writable ::= \"a.rs\"") && before.contains("readable ::= \"src/lib.rs\""));
        assert!(before.contains("content ::= piece{0,100}"), "{before}");
        let after = admissible(true).blocks_grammar();
        assert!(after.starts_with("root ::= write | read | list | done\n"), "{after}");
        let mut open = admissible(true);
        open.writable.clear();
        open.readable = None;
        let grammar = open.blocks_grammar();
        assert!(grammar.contains("writable ::= path") && grammar.contains("path ::= [A-Za-z0-9_]"), "{grammar}");
        assert_eq!(gbnf_literal("a\"b\\c"), "\"a\\\"b\\\\c\"");
    }

    #[test]
    fn native_tools_are_narrowed_the_same_way() {
        let names = |a: &Admissible| a.tools().iter().map(|s| s.name).collect::<Vec<_>>();
        assert_eq!(names(&admissible(false)), ["read_file", "write_file", "list_files"]);
        let mut checked = admissible(true);
        checked.check = true;
        assert_eq!(names(&checked), ["read_file", "write_file", "list_files", "finish", "check"]);
        checked.finish = false;
        assert_eq!(names(&checked), ["read_file", "write_file", "list_files"], "no check before the outputs exist");
        let write = admissible(false).tools().into_iter().find(|s| s.name == "write_file").unwrap();
        assert_eq!(write.parameters["properties"]["path"]["enum"], json!(["a.rs"]));
    }

    #[test]
    fn native_is_carried_in_json_where_only_a_schema_is_enforced_and_the_note_says_so() {
        let llama = Enforcement {
            server: "llama-server".into(),
            json_schema: true,
            grammar: true,
            tool_call: false,
            why_not: Some("its chat template".into()),
            max_output_tokens: None,
        };
        let carried = plan(ToolProtocol::Native, &llama);
        // Under a grammar where the server takes one (see `json_constraint`).
        assert_eq!((carried.protocol, carried.kind), (ToolProtocol::Json, Some(ConstraintKind::Grammar)));
        let schema_only = Enforcement { grammar: false, ..llama.clone() };
        assert_eq!(plan(ToolProtocol::Native, &schema_only).kind, Some(ConstraintKind::JsonSchema));
        assert!(
            carried.note.unwrap().contains("llama-server cannot be made to call a tool natively (its chat template)")
        );
        assert_eq!(plan(ToolProtocol::Blocks, &llama).kind, Some(ConstraintKind::Grammar));
        let vllm = Enforcement {
            server: "vLLM".into(),
            json_schema: true,
            grammar: true,
            tool_call: true,
            ..Enforcement::default()
        };
        assert_eq!(plan(ToolProtocol::Native, &vllm).kind, Some(ConstraintKind::ToolCall));
        let ollama = Enforcement { server: "Ollama 0.6.2".into(), json_schema: true, ..Enforcement::default() };
        let blocks = plan(ToolProtocol::Blocks, &ollama);
        assert_eq!(blocks.kind, None);
        assert!(blocks.note.unwrap().contains("the `json` protocol can be"));
        assert_eq!(
            plan(ToolProtocol::Json, &Enforcement::nothing(None)),
            Plan { protocol: ToolProtocol::Json, kind: None, note: None }
        );
        let unknown = plan(ToolProtocol::Json, &Enforcement::nothing(Some("the server did not say what it is".into())));
        assert!(unknown.note.unwrap().contains("nothing constrained this step's replies: the server did not say"));
    }

    #[test]
    fn once_every_output_is_written_and_nothing_checks_it_only_finish_is_admitted() {
        let mut done = admissible(true);
        done.only_finish = true;
        assert_eq!(branches(&done.json_schema()).len(), 1);
        assert!(done.json_grammar().starts_with("root ::= call-finish\n"), "{}", done.json_grammar());
        assert!(done.blocks_grammar().starts_with("root ::= done\n"), "{}", done.blocks_grammar());
        assert_eq!(done.tools().iter().map(|s| s.name).collect::<Vec<_>>(), ["finish"]);
    }

    #[test]
    fn an_edit_is_admitted_once_its_file_exists_with_both_sides_bounded() {
        let mut editing = admissible(true);
        editing.editable = vec!["a.rs".into()];
        let schema = editing.json_schema();
        let edit = &branches(&schema)[1];
        assert_eq!(edit["properties"]["tool"]["const"], "edit_file");
        let arguments = &edit["properties"]["arguments"];
        assert_eq!(arguments["required"], json!(["path", "old", "new"]));
        assert_eq!(arguments["properties"]["path"]["enum"], json!(["a.rs"]));
        assert_eq!(
            (arguments["properties"]["old"]["minLength"].clone(), arguments["properties"]["old"]["maxLength"].clone()),
            (json!(1), json!(50))
        );
        let grammar = editing.json_grammar();
        assert!(grammar.starts_with("root ::= call-write-file | call-edit-file |"), "{grammar}");
        assert!(grammar.contains(r#"call-edit-file ::= "{\"tool\": \"edit_file\", \"arguments\": {" "\"path\": " editable ", \"old\": " old ", \"new\": " new "}}""#), "{grammar}");
        assert!(grammar.contains(r#"old ::= "\"" jchar{1,50} "\"""#), "{grammar}");
        let blocks = editing.blocks_grammar();
        assert!(blocks.contains("old ::= piece{1,50}\nnew ::= (piece{0,50} \"\\n\")?\n"), "{blocks}");
        assert_eq!(blocks.matches("piece ::=").count(), 1, "{blocks}");
        assert_eq!(
            editing.tools().iter().map(|s| s.name).collect::<Vec<_>>(),
            ["read_file", "write_file", "edit_file", "list_files", "finish"]
        );
        // Nothing exists yet: no edit.
        assert!(!admissible(false).json_grammar().contains("edit"));
    }

    #[test]
    fn digests_tell_constraints_apart() {
        let a = Constraint::JsonSchema(admissible(false).json_schema());
        let b = Constraint::JsonSchema(admissible(true).json_schema());
        assert_ne!(a.digest(), b.digest());
        assert_eq!(a.digest(), a.clone().digest());
        assert!(a.digest().starts_with("sha256:") && a.digest().len() == 23);
        assert_ne!(Constraint::ToolCall.digest(), Constraint::Grammar(String::new()).digest());
    }
}
