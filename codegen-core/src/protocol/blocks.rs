//! The `@@@` command protocol of the original Gradle agent.
//!
//! Code travels verbatim, with no JSON escaping, which small models handle far better.
//!
//! # Syntax
//!
//! A command is a line starting with `@@@` (leading and trailing whitespace is tolerated, and the
//! command name is case-insensitive):
//!
//! | command | meaning |
//! |---|---|
//! | `@@@read(path)` | read a file |
//! | `@@@list()` or `@@@list(dir)` | list the files (under `dir`) |
//! | `@@@write_begin(path)` | start writing a file: every following line, verbatim, is its content... |
//! | `@@@write_end` | ...up to this line |
//! | `@@@edit_begin(path)` | change a file: one or more search/replace pairs (below)... |
//! | `@@@edit_end` | ...up to this line |
//! | `@@@done`, `@@@done(summary)` or `@@@done summary text` | the task is complete |
//!
//! Arguments are read leniently: `@@@read src/a.rs` and `@@@read: src/a.rs` work too, quotes or
//! backticks around a path are removed, a missing `)` is forgiven, and a path may hold
//! parentheses when the line ends with `)` (`@@@read(app/(group)/page.tsx)`). Text after the
//! `)` is ignored unless it holds another command, which is reported: one command per line.
//!
//! # Write blocks
//!
//! The content of a file is every line between `@@@write_begin(path)` and `@@@write_end`: not
//! trimmed, not unescaped, with `\r\n` line ends turned into `\n` and a `\n` added after the last
//! line (no lines give an empty file). Inside a block only two lines are commands:
//! `@@@write_end` (which may carry ignored text after it, as in `@@@write_end(view.rs)`) and a new
//! `@@@write_begin(...)`, which abandons the open block as a problem; every other line, even
//! one starting with `@@@`, is content.
//!
//! Models like to wrap code in Markdown fences, so a block whose first and last non-blank lines
//! are a fence pair (an opening line such as ```` ```rust ````, and the line of backticks that
//! closes it by Markdown's rules, i.e. the first later line of at least as many backticks and
//! nothing else) loses those two lines and the blank lines outside them. A file that genuinely
//! starts and ends with such a fence pair (a Markdown file made of one code block) cannot be
//! written through this protocol unless its fence uses more backticks than the wrapper.
//!
//! # Edit blocks
//!
//! Between `@@@edit_begin(path)` and `@@@edit_end`, each change is a search/replace pair in
//! the style aider uses: the lines to find, then the lines that replace them.
//!
//! ```text
//! @@@edit_begin(view.rs)
//! <<<<<<< SEARCH
//!     println!("Hello");
//! =======
//!     println!("Hello, {name}!");
//! >>>>>>> REPLACE
//! @@@edit_end
//! ```
//!
//! A marker line is seven or more `<`, `=` or `>` (and, for the first and last, any text
//! after them); each side's lines are taken verbatim, each ended by `\n`. Blank lines and
//! fence lines between pairs are ignored; anything else there, a pair left open, or a block
//! with no pair is a problem, and then no change of the block is made (they apply all or
//! none, see [`crate::edit`]).
//!
//! # Around the commands
//!
//! Fence lines outside write blocks are dropped, so a reply wrapped whole in a ```` ``` ````
//! fence reads like an unwrapped one. Every other line outside a command goes to
//! [`BlockReply::text`].
//!
//! Commands after `@@@done` are kept, in order, with no problem noted: the loop decides what to
//! run (it may run the writes and then stop, for instance).
//!
//! # Problems
//!
//! What cannot be read becomes a model-facing sentence in [`BlockReply::problems`] (the command
//! quoted, its line number, what is wrong and what to write instead), and no command: an
//! unknown command, a missing path, a write block that is never ended or is interrupted by
//! another `@@@write_begin` (its file is not written), a stray `@@@write_end`, several commands
//! on one line. Nothing here panics on any input, and the work is linear in its length.

use crate::tools;

/// One command of a blocks-protocol reply.
#[derive(Debug, Clone, PartialEq)]
pub enum BlockCommand {
    /// `@@@read(path)`: read a file (the [`tools::READ_FILE`] tool).
    Read {
        /// The path as written.
        path: String,
    },
    /// `@@@write_begin(path)` ... `@@@write_end`: write a file (the [`tools::WRITE_FILE`] tool).
    Write {
        /// The path as written.
        path: String,
        /// The complete content, each line ended by `\n`.
        content: String,
    },
    /// `@@@edit_begin(path)` ... `@@@edit_end`: change a file (the [`tools::EDIT_FILE`] tool).
    Edit {
        /// The path as written.
        path: String,
        /// The search/replace pairs, in order: `(old, new)`, each line ended by `\n`.
        edits: Vec<(String, String)>,
    },
    /// `@@@list()` or `@@@list(dir)`: list the files (the [`tools::LIST_FILES`] tool).
    List {
        /// The folder to list, or `None` for everything.
        dir: Option<String>,
    },
    /// `@@@done`, `@@@done(summary)` or `@@@done summary`: the task is complete (the
    /// [`tools::FINISH`] tool).
    Done {
        /// The summary, empty when none was given.
        summary: String,
    },
}

impl BlockCommand {
    /// The command as the model would write it, without `@@@` and without a write's content:
    /// `read(src/a.rs)`, `write_begin(view.rs)`, `list()`, `list(src)`, `done`. Meant as the
    /// `command_label` of [`render_result`].
    pub fn label(&self) -> String {
        match self {
            BlockCommand::Read { path } => format!("read({path})"),
            BlockCommand::Write { path, .. } => format!("write_begin({path})"),
            BlockCommand::Edit { path, .. } => format!("edit_begin({path})"),
            BlockCommand::List { dir } => format!("list({})", dir.as_deref().unwrap_or("")),
            BlockCommand::Done { .. } => "done".to_owned(),
        }
    }

    /// The name of the tool this command stands for (one of [`tools::TOOL_NAMES`]).
    pub fn tool_name(&self) -> &'static str {
        match self {
            BlockCommand::Read { .. } => tools::READ_FILE,
            BlockCommand::Write { .. } => tools::WRITE_FILE,
            BlockCommand::Edit { .. } => tools::EDIT_FILE,
            BlockCommand::List { .. } => tools::LIST_FILES,
            BlockCommand::Done { .. } => tools::FINISH,
        }
    }
}

/// A blocks-protocol reply, read by [`parse_blocks`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockReply {
    /// The commands read, in order (including any after `@@@done`).
    pub commands: Vec<BlockCommand>,
    /// What could not be read, one precise model-facing sentence each, in order; e.g.
    /// "`@@@write_begin(view.rs)` on line 3 has no matching `@@@write_end`, so view.rs was not
    /// written; end every file with a line containing only @@@write_end".
    pub problems: Vec<String>,
    /// The lines outside any command and write block (fence lines excepted), trimmed.
    pub text: String,
}

/// The commands, for the message about an unknown one.
const KNOWN_COMMANDS: &str = "@@@read(path), @@@list() or @@@list(dir), @@@write_begin(path) ... @@@write_end, \
     @@@edit_begin(path) ... @@@edit_end, and @@@done(summary)";
/// The remedy for a write block that is not ended.
const END_EVERY_FILE: &str = "end every file with a line containing only @@@write_end";

/// Reads a blocks-protocol reply. See the module documentation for the syntax.
pub fn parse_blocks(content: &str) -> BlockReply {
    let mut reply = BlockReply::default();
    let mut text: Vec<&str> = Vec::new();
    let mut open: Option<OpenWrite> = None;

    for (index, raw) in content.split('\n').enumerate() {
        let number = index + 1;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let trimmed = line.trim();
        let command = trimmed.strip_prefix("@@@").map(|rest| {
            let rest = rest.trim_start();
            let name_len = rest.bytes().take_while(|b| b.is_ascii_alphanumeric() || *b == b'_').count();
            (rest[..name_len].to_ascii_lowercase(), &rest[name_len..])
        });

        if let Some(block) = open.as_mut() {
            match command.as_ref().map(|(name, _)| name.as_str()) {
                // Either end closes either block: which one was open is not in doubt.
                Some("write_end" | "edit_end") => {
                    if let Some(block) = open.take()
                        && let Some(path) = block.path.clone()
                    {
                        if block.edit {
                            match edit_pairs(&block.lines, block.number) {
                                Ok(edits) => reply.commands.push(BlockCommand::Edit { path, edits }),
                                Err(problem) => reply.problems.push(format!(
                                    "`{}` on line {}: {problem}, so {path} was not changed",
                                    block.header, block.number
                                )),
                            }
                        } else {
                            reply.commands.push(BlockCommand::Write { path, content: block_content(&block.lines) });
                        }
                    }
                    continue;
                }
                Some("write_begin" | "edit_begin") => {
                    if let Some(block) = open.take() {
                        reply.problems.push(format!(
                            "`{}` on line {} was not ended before `{}` on line {number}, so {} was not {}; {}",
                            block.header,
                            block.number,
                            shorten(trimmed),
                            block.target(),
                            block.verb(),
                            block.remedy(),
                        ));
                    }
                    // Read below as a new block.
                }
                _ => {
                    if block.first_command.is_none() && command.is_some() {
                        block.first_command = Some((shorten(trimmed), number));
                    }
                    block.lines.push(line);
                    continue;
                }
            }
        }

        let Some((name, rest)) = command else {
            if !is_fence_line(trimmed) {
                text.push(line);
            }
            continue;
        };
        let shown = shorten(trimmed);
        match name.as_str() {
            "read" => match argument(rest, &shown, number, true, &mut reply.problems) {
                Some(path) => reply.commands.push(BlockCommand::Read { path }),
                None => reply.problems.push(no_path(&shown, number, "@@@read(src/view.rs)")),
            },
            "list" => {
                let dir = argument(rest, &shown, number, true, &mut reply.problems);
                reply.commands.push(BlockCommand::List { dir });
            }
            "write_begin" => {
                let path = argument(rest, &shown, number, true, &mut reply.problems);
                if path.is_none() {
                    reply.problems.push(format!(
                        "{}; its content up to `@@@write_end` was not written",
                        no_path(&shown, number, "@@@write_begin(view.rs)")
                    ));
                }
                open = Some(OpenWrite { path, header: shown, number, lines: Vec::new(), first_command: None, edit: false });
            }
            "edit_begin" => {
                let path = argument(rest, &shown, number, true, &mut reply.problems);
                if path.is_none() {
                    reply.problems.push(format!(
                        "{}; its changes up to `@@@edit_end` were not made",
                        no_path(&shown, number, "@@@edit_begin(view.rs)")
                    ));
                }
                open = Some(OpenWrite { path, header: shown, number, lines: Vec::new(), first_command: None, edit: true });
            }
            "edit_end" => reply.problems.push(format!(
                "`{shown}` on line {number} has no `@@@edit_begin(path)` before it; start every change with a line \
                 @@@edit_begin(path), then its search/replace pairs, then a line containing only @@@edit_end"
            )),
            "write_end" => reply.problems.push(format!(
                "`{shown}` on line {number} has no `@@@write_begin(path)` before it; start every file with a line \
                 @@@write_begin(path), then its content, then a line containing only @@@write_end"
            )),
            "done" => {
                let summary = argument(rest, &shown, number, false, &mut reply.problems).unwrap_or_default();
                reply.commands.push(BlockCommand::Done { summary });
            }
            _ => reply.problems.push(format!(
                "`{shown}` on line {number} is not a command; the commands are {KNOWN_COMMANDS}, each on a line of its own"
            )),
        }
    }

    if let Some(block) = open {
        let mut problem = format!(
            "`{}` on line {} has no matching `@@@{}`, so {} was not {}; {}",
            block.header,
            block.number,
            if block.edit { "edit_end" } else { "write_end" },
            block.target(),
            block.verb(),
            block.remedy()
        );
        if let Some((command, number)) = block.first_command {
            problem.push_str(&format!(" (the `{command}` on line {number} was read as part of the file)"));
        }
        reply.problems.push(problem);
    }
    reply.text = text.join("\n").trim().to_owned();
    reply
}

/// A write block not ended yet.
struct OpenWrite<'a> {
    /// `None` when the begin line named no file: the block is read and dropped.
    path: Option<String>,
    /// The begin line as written (shortened), for messages.
    header: String,
    number: usize,
    lines: Vec<&'a str>,
    /// The first line inside that looks like a command, for the "never ended" message.
    first_command: Option<(String, usize)>,
    /// An `@@@edit_begin` block, not a write.
    edit: bool,
}

impl OpenWrite<'_> {
    fn target(&self) -> String {
        self.path.clone().unwrap_or_else(|| "the file".to_owned())
    }

    fn verb(&self) -> &'static str {
        if self.edit { "changed" } else { "written" }
    }

    fn remedy(&self) -> &'static str {
        if self.edit { END_EVERY_EDIT } else { END_EVERY_FILE }
    }
}

/// The remedy for an edit block that is not ended.
const END_EVERY_EDIT: &str = "end every change with a line containing only @@@edit_end";

/// What a marker line of a search/replace pair is.
#[derive(Clone, Copy, PartialEq)]
enum Marker {
    Search,
    Divider,
    Replace,
}

fn marker(line: &str) -> Option<Marker> {
    let line = line.trim();
    let run = |c: u8| line.bytes().take_while(|&b| b == c).count();
    if run(b'<') >= 7 {
        Some(Marker::Search)
    } else if run(b'=') >= 7 && line.bytes().all(|b| b == b'=') {
        Some(Marker::Divider)
    } else if run(b'>') >= 7 {
        Some(Marker::Replace)
    } else {
        None
    }
}

/// The search/replace pairs of an edit block whose first line is line `begin` of the reply.
fn edit_pairs(lines: &[&str], begin: usize) -> Result<Vec<(String, String)>, String> {
    let joined = |lines: &[&str]| lines.iter().map(|l| format!("{l}\n")).collect::<String>();
    let mut pairs = Vec::new();
    let mut at = 0;
    while at < lines.len() {
        let number = begin + at + 1;
        match marker(lines[at]) {
            Some(Marker::Search) => {
                let divider =
                    lines[at + 1..].iter().position(|l| marker(l) == Some(Marker::Divider)).map(|p| at + 1 + p);
                let Some(divider) = divider else {
                    return Err(format!("the `<<<<<<< SEARCH` on line {number} has no `=======` after it"));
                };
                let end = lines[divider + 1..]
                    .iter()
                    .position(|l| marker(l) == Some(Marker::Replace))
                    .map(|p| divider + 1 + p);
                let Some(end) = end else {
                    return Err(format!("the `<<<<<<< SEARCH` on line {number} has no `>>>>>>> REPLACE` to end it"));
                };
                pairs.push((joined(&lines[at + 1..divider]), joined(&lines[divider + 1..end])));
                at = end + 1;
            }
            None if lines[at].trim().is_empty() || is_fence_line(lines[at].trim()) => at += 1,
            _ => {
                return Err(format!(
                    "line {number} (`{}`) is outside a search/replace pair; write each change as `<<<<<<< SEARCH`, the \
                     lines to find, `=======`, the lines that replace them, `>>>>>>> REPLACE`",
                    shorten(lines[at].trim())
                ));
            }
        }
    }
    if pairs.is_empty() {
        return Err("it holds no search/replace pair (`<<<<<<< SEARCH` ... `=======` ... `>>>>>>> REPLACE`)".into());
    }
    Ok(pairs)
}

/// The content of a write block: its lines, each ended by `\n`, without a fence pair that
/// wraps them all.
fn block_content(lines: &[&str]) -> String {
    let mut body = lines;
    let first = lines.iter().position(|l| !l.trim().is_empty());
    let last = lines.iter().rposition(|l| !l.trim().is_empty());
    if let (Some(first), Some(last)) = (first, last)
        && first < last
        && let Some(ticks) = fence_opener(lines[first])
    {
        let closer = lines[first + 1..].iter().position(|l| closes_fence(l, ticks)).map(|p| first + 1 + p);
        if closer == Some(last) {
            body = &lines[first + 1..last];
        }
    }
    let mut content = String::with_capacity(body.iter().map(|l| l.len() + 1).sum());
    for line in body {
        content.push_str(line);
        content.push('\n');
    }
    content
}

/// The number of backticks of a fence's opening line (three or more, then an optional tag).
fn fence_opener(line: &str) -> Option<usize> {
    let line = line.trim();
    let ticks = line.bytes().take_while(|&b| b == b'`').count();
    (ticks >= 3 && !line[ticks..].contains('`')).then_some(ticks)
}

/// Whether `line` closes a fence opened with `ticks` backticks.
fn closes_fence(line: &str, ticks: usize) -> bool {
    let line = line.trim();
    line.len() >= ticks && line.bytes().all(|b| b == b'`')
}

fn is_fence_line(trimmed: &str) -> bool {
    trimmed.starts_with("```")
}

/// The argument of a command: `(arg)`, ` arg` or `: arg`, unquoted and trimmed; `None` when
/// empty. The argument ends at the last `)`, except for a path when the line does not end with
/// `)`, and when another command follows the first `)`: that is reported.
fn argument(rest: &str, shown: &str, number: usize, path: bool, problems: &mut Vec<String>) -> Option<String> {
    let rest = rest.trim();
    let arg = if let Some(inner) = rest.strip_prefix('(') {
        let first = inner.find(')');
        let close = match first {
            Some(first) if inner[first + 1..].contains("@@@") => Some(first),
            _ if !path || inner.ends_with(')') => inner.rfind(')'),
            _ => first,
        };
        match close {
            Some(close) => {
                let after = inner[close + 1..].trim();
                if after.contains("@@@") {
                    problems.push(format!(
                        "line {number} holds more than one command (`{shown}`); only the first was read. Put \
                         each @@@ command on a line of its own"
                    ));
                }
                &inner[..close]
            }
            None => inner,
        }
    } else {
        rest.strip_prefix(':').unwrap_or(rest)
    };
    let arg = unquote(arg.trim()).trim();
    (!arg.is_empty()).then(|| arg.to_owned())
}

/// `arg` without one pair of matching quotes or backticks around it.
fn unquote(arg: &str) -> &str {
    for quote in ['"', '\'', '`'] {
        if let Some(inner) = arg.strip_prefix(quote).and_then(|a| a.strip_suffix(quote)) {
            return inner;
        }
    }
    arg
}

fn no_path(shown: &str, number: usize, example: &str) -> String {
    format!("`{shown}` on line {number} names no file; write the path inside the parentheses, e.g. {example}")
}

/// `line` cut to a length fit for a message, on a character boundary.
fn shorten(line: &str) -> String {
    const MAX: usize = 80;
    if line.len() <= MAX {
        return line.replace('`', "'");
    }
    let mut cut = MAX;
    while !line.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", line[..cut].replace('`', "'"))
}

/// How a command's result is shown to a blocks-protocol model:
///
/// ```text
/// @@@result read(view.rs)
/// <body>
/// @@@end
/// ```
///
/// `command_label` is the command without `@@@` (see [`BlockCommand::label`]); a `\n` is added
/// after `body` unless it ends with one. A refused command is rendered the same way, its body
/// saying what was wrong and what to do: see [`render_refusal`].
pub fn render_result(command_label: &str, body: &str) -> String {
    let mut out = format!("@@@result {command_label}\n{body}");
    if !body.is_empty() && !body.ends_with('\n') {
        out.push('\n');
    }
    out.push_str("@@@end");
    out
}

/// A refused command, as [`render_result`] shows it: the command, the problem, what to do.
///
/// ```text
/// @@@result write_begin(../x.rs)
/// REFUSED: the path leaves the output folder.
/// What to do: write paths relative to the output folder, e.g. view.rs.
/// @@@end
/// ```
pub fn render_refusal(command_label: &str, problem: &str, remedy: &str) -> String {
    render_result(command_label, &format!("REFUSED: {}\nWhat to do: {}", problem.trim(), remedy.trim()))
}

/// System-prompt text describing the protocol exactly, with an example exchange.
pub fn blocks_protocol_instructions() -> String {
    String::from(
        "You work on files by writing commands, each on a line of its own:\n\
         @@@list()              list the files you may read; @@@list(src) only those under src\n\
         @@@read(path)          show the content of the file at path\n\
         @@@write_begin(path)   the lines that follow are the complete new content of the file at path,\n\
         @@@write_end           up to this line\n\
         @@@edit_begin(path)    then lines <<<<<<< SEARCH, the exact lines to change, =======, their replacement,\n\
         @@@edit_end            >>>>>>> REPLACE, and this line: changes a file that exists\n\
         @@@done(summary)       the task is done, with a one-sentence summary\n\
         \n\
         Paths are relative, with forward slashes and no quotes. Between @@@write_begin(path) and @@@write_end \
         put the whole file exactly as it must be saved: no fragment, no placeholder, no escaping, no ``` fence. \
         The results of @@@read and @@@list come back in the next message, each between \
         @@@result <command> and @@@end. When every file the task asks for is written, end with @@@done(summary).\n",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &str, content: &str) -> BlockCommand {
        BlockCommand::Write { path: path.to_owned(), content: content.to_owned() }
    }

    fn read(path: &str) -> BlockCommand {
        BlockCommand::Read { path: path.to_owned() }
    }

    fn done(summary: &str) -> BlockCommand {
        BlockCommand::Done { summary: summary.to_owned() }
    }

    fn clean(content: &str) -> Vec<BlockCommand> {
        let reply = parse_blocks(content);
        assert_eq!(reply.problems, Vec::<String>::new(), "{content:?}");
        reply.commands
    }

    #[test]
    fn edit_blocks_hold_search_replace_pairs() {
        let reply = "@@@edit_begin(a.rs)\n<<<<<<< SEARCH\nfn a() {}\n=======\nfn a() -> u8 { 1 }\n>>>>>>> REPLACE\n\n```\n<<<<<<< SEARCH\n  x\n=======\n>>>>>>> REPLACE\n```\n@@@edit_end\n@@@done";
        let edits =
            vec![("fn a() {}\n".to_owned(), "fn a() -> u8 { 1 }\n".to_owned()), ("  x\n".to_owned(), String::new())];
        assert_eq!(clean(reply), vec![BlockCommand::Edit { path: "a.rs".into(), edits }, done("")]);
        assert_eq!(
            clean("@@@edit_begin(a.rs)\n<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE\n@@@write_end")[0].label(),
            "edit_begin(a.rs)"
        );
    }

    #[test]
    fn broken_edit_blocks_change_nothing_and_say_why() {
        let problems = |reply: &str| {
            let parsed = parse_blocks(reply);
            assert!(parsed.commands.is_empty(), "{:?}", parsed.commands);
            parsed.problems
        };
        let open = problems("@@@edit_begin(a.rs)\n<<<<<<< SEARCH\nx\n=======\ny\n");
        assert!(open[0].contains("has no matching `@@@edit_end`, so a.rs was not changed"), "{open:?}");
        let no_divider = problems("@@@edit_begin(a.rs)\n<<<<<<< SEARCH\nx\n>>>>>>> REPLACE\n@@@edit_end");
        assert!(
            no_divider[0].contains("the `<<<<<<< SEARCH` on line 2 has no `=======` after it, so a.rs was not changed"),
            "{no_divider:?}"
        );
        let no_end = problems("@@@edit_begin(a.rs)\n<<<<<<< SEARCH\nx\n=======\ny\n@@@edit_end");
        assert!(no_end[0].contains("has no `>>>>>>> REPLACE`"), "{no_end:?}");
        let outside = problems("@@@edit_begin(a.rs)\nchange x to y\n@@@edit_end");
        assert!(outside[0].contains("line 2 (`change x to y`) is outside a search/replace pair"), "{outside:?}");
        let empty = problems("@@@edit_begin(a.rs)\n@@@edit_end");
        assert!(empty[0].contains("holds no search/replace pair"), "{empty:?}");
        let stray = problems("@@@edit_end");
        assert!(stray[0].contains("has no `@@@edit_begin(path)` before it"), "{stray:?}");
    }

    #[test]
    fn every_command() {
        let reply = parse_blocks(
            "Let me look.\n@@@list()\n  @@@list(src)\n@@@read(src/a.rs)\n@@@write_begin(view.rs)\n  fn main() {}\n\t\n@@@write_end\n@@@done(All written.)\nBye.",
        );
        assert_eq!(
            reply,
            BlockReply {
                commands: vec![
                    BlockCommand::List { dir: None },
                    BlockCommand::List { dir: Some("src".into()) },
                    read("src/a.rs"),
                    write("view.rs", "  fn main() {}\n\t\n"),
                    done("All written."),
                ],
                problems: vec![],
                text: "Let me look.\nBye.".into(),
            }
        );
    }

    #[test]
    fn done_forms() {
        assert_eq!(clean("@@@done"), vec![done("")]);
        assert_eq!(clean("@@@done()"), vec![done("")]);
        assert_eq!(clean("@@@done(Wrote a (small) file.)"), vec![done("Wrote a (small) file.")]);
        assert_eq!(clean("@@@done Wrote view.rs."), vec![done("Wrote view.rs.")]);
        assert_eq!(clean("@@@done: Wrote view.rs."), vec![done("Wrote view.rs.")]);
        assert_eq!(clean("@@@DONE"), vec![done("")]);
    }

    #[test]
    fn lenient_arguments() {
        assert_eq!(clean("@@@read src/a.rs"), vec![read("src/a.rs")]);
        assert_eq!(clean("@@@read(\"src/a.rs\")"), vec![read("src/a.rs")]);
        assert_eq!(clean("@@@read(`src/a.rs`)"), vec![read("src/a.rs")]);
        assert_eq!(clean("@@@read( src/a.rs )"), vec![read("src/a.rs")]);
        assert_eq!(clean("@@@read(src/a.rs"), vec![read("src/a.rs")]);
        assert_eq!(clean("@@@read(app/(group)/page.tsx)"), vec![read("app/(group)/page.tsx")]);
        assert_eq!(clean("@@@read(a.rs) please"), vec![read("a.rs")]);
        assert_eq!(clean("@@@list"), vec![BlockCommand::List { dir: None }]);
    }

    #[test]
    fn write_content_is_verbatim() {
        let content =
            "@@@write_begin(a.py)\r\nx = \"\\n\"  \r\n\r\n    @decorator\r\n@@@not_a_command\r\n@@@write_end\r\n";
        assert_eq!(clean(content), vec![write("a.py", "x = \"\\n\"  \n\n    @decorator\n@@@not_a_command\n")]);
        assert_eq!(clean("@@@write_begin(empty.txt)\n@@@write_end"), vec![write("empty.txt", "")]);
        assert_eq!(clean("@@@write_begin(blank.txt)\n\n@@@write_end"), vec![write("blank.txt", "\n")]);
        assert_eq!(clean("@@@write_begin(a.rs)\nx\n  @@@write_end(a.rs)  "), vec![write("a.rs", "x\n")]);
    }

    #[test]
    fn fences_around_the_content_are_stripped() {
        let reply = "@@@write_begin(a.rs)\n```rust\nfn main() {}\n```\n@@@write_end";
        assert_eq!(clean(reply), vec![write("a.rs", "fn main() {}\n")]);
        let reply = "@@@write_begin(a.rs)\n\n```\n/// ```\n/// doc\n/// ```\nfn main() {}\n```\n\n@@@write_end";
        assert_eq!(clean(reply), vec![write("a.rs", "/// ```\n/// doc\n/// ```\nfn main() {}\n")]);
        // Two code blocks in a Markdown file: not a wrapper.
        let md = "```sh\nls\n```\n\ntext\n\n```sh\npwd\n```\n";
        assert_eq!(clean(&format!("@@@write_begin(a.md)\n{md}@@@write_end")), vec![write("a.md", md)]);
        // A longer fence wraps one with fewer backticks.
        let reply = "@@@write_begin(a.md)\n````markdown\n```sh\nls\n```\n````\n@@@write_end";
        assert_eq!(clean(reply), vec![write("a.md", "```sh\nls\n```\n")]);
        // A fence inside the content is kept.
        let reply = "@@@write_begin(a.md)\n# Title\n```\ncode\n```\n@@@write_end";
        assert_eq!(clean(reply), vec![write("a.md", "# Title\n```\ncode\n```\n")]);
    }

    #[test]
    fn a_reply_wrapped_in_a_fence() {
        let reply = parse_blocks("```\n@@@write_begin(a.rs)\n```rust\nfn x() {}\n```\n@@@write_end\n@@@done\n```");
        assert_eq!(reply, BlockReply { commands: vec![write("a.rs", "fn x() {}\n"), done("")], ..Default::default() });
        let reply = parse_blocks("Here you go:\n```text\n@@@read(a.rs)\n```\n");
        assert_eq!(reply.commands, vec![read("a.rs")]);
        assert_eq!(reply.text, "Here you go:");
    }

    #[test]
    fn unknown_command() {
        let reply = parse_blocks("@@@read(a.rs)\n@@@delete(a.rs)\n@@@");
        assert_eq!(reply.commands, vec![read("a.rs")]);
        assert_eq!(
            reply.problems,
            vec![
                format!(
                    "`@@@delete(a.rs)` on line 2 is not a command; the commands are {KNOWN_COMMANDS}, each on a line of its own"
                ),
                format!(
                    "`@@@` on line 3 is not a command; the commands are {KNOWN_COMMANDS}, each on a line of its own"
                ),
            ]
        );
    }

    #[test]
    fn missing_paths() {
        let reply = parse_blocks("@@@read()\n@@@read\n@@@write_begin( )\nfn x() {}\n@@@write_end\n@@@read(\"\")");
        assert_eq!(reply.commands, vec![]);
        assert_eq!(
            reply.problems,
            vec![
                "`@@@read()` on line 1 names no file; write the path inside the parentheses, e.g. @@@read(src/view.rs)",
                "`@@@read` on line 2 names no file; write the path inside the parentheses, e.g. @@@read(src/view.rs)",
                "`@@@write_begin( )` on line 3 names no file; write the path inside the parentheses, e.g. \
                 @@@write_begin(view.rs); its content up to `@@@write_end` was not written",
                "`@@@read(\"\")` on line 6 names no file; write the path inside the parentheses, e.g. @@@read(src/view.rs)",
            ]
        );
        assert_eq!(reply.text, "");
    }

    #[test]
    fn unclosed_write() {
        let reply = parse_blocks("Writing.\n@@@write_begin(view.rs)\nfn main() {}\n@@@done");
        assert_eq!(reply.commands, vec![]);
        assert_eq!(
            reply.problems,
            vec![
                "`@@@write_begin(view.rs)` on line 2 has no matching `@@@write_end`, so view.rs was not written; \
                 end every file with a line containing only @@@write_end (the `@@@done` on line 4 was read as \
                 part of the file)"
            ]
        );
        assert_eq!(reply.text, "Writing.");
        let reply = parse_blocks("@@@write_begin(view.rs)\nfn main() {}\n");
        assert_eq!(
            reply.problems,
            vec![
                "`@@@write_begin(view.rs)` on line 1 has no matching `@@@write_end`, so view.rs was not written; \
                 end every file with a line containing only @@@write_end"
            ]
        );
    }

    #[test]
    fn nested_write() {
        let reply = parse_blocks("@@@write_begin(a.rs)\nx\n@@@write_begin(b.rs)\ny\n@@@write_end\n@@@done");
        assert_eq!(reply.commands, vec![write("b.rs", "y\n"), done("")]);
        assert_eq!(
            reply.problems,
            vec![
                "`@@@write_begin(a.rs)` on line 1 was not ended before `@@@write_begin(b.rs)` on line 3, so a.rs \
                 was not written; end every file with a line containing only @@@write_end"
            ]
        );
    }

    #[test]
    fn stray_write_end() {
        let reply = parse_blocks("@@@write_end");
        assert_eq!(
            reply.problems,
            vec![
                "`@@@write_end` on line 1 has no `@@@write_begin(path)` before it; start every file with a line \
                 @@@write_begin(path), then its content, then a line containing only @@@write_end"
            ]
        );
    }

    #[test]
    fn two_commands_on_a_line() {
        let reply = parse_blocks("@@@read(a.rs) @@@read(b.rs)");
        assert_eq!(reply.commands, vec![read("a.rs")]);
        assert_eq!(reply.problems.len(), 1);
        let reply = parse_blocks("@@@read(a.rs), @@@read(b.rs) now");
        assert_eq!(reply.commands, vec![read("a.rs")]);
        assert_eq!(
            reply.problems,
            vec![
                "line 1 holds more than one command (`@@@read(a.rs), @@@read(b.rs) now`); only the first was read. \
                 Put each @@@ command on a line of its own"
            ]
        );
    }

    #[test]
    fn commands_after_done_are_kept() {
        assert_eq!(clean("@@@done\n@@@read(a.rs)"), vec![done(""), read("a.rs")]);
    }

    #[test]
    fn long_lines_are_shortened_in_problems() {
        let line = format!("@@@frob({})", "é".repeat(100));
        let problem = &parse_blocks(&line).problems[0];
        assert!(problem.starts_with(&format!("`@@@frob({}…` on line 1", "é".repeat(36))), "{problem}");
    }

    #[test]
    fn results_and_refusals() {
        assert_eq!(render_result("read(view.rs)", "fn x() {}\n"), "@@@result read(view.rs)\nfn x() {}\n@@@end");
        assert_eq!(render_result("read(view.rs)", "fn x() {}"), "@@@result read(view.rs)\nfn x() {}\n@@@end");
        assert_eq!(render_result("list()", ""), "@@@result list()\n@@@end");
        assert_eq!(
            render_refusal("write_begin(../x.rs)", "the path leaves the output folder.", "write view.rs instead."),
            "@@@result write_begin(../x.rs)\nREFUSED: the path leaves the output folder.\nWhat to do: write view.rs instead.\n@@@end"
        );
        assert_eq!(read("a.rs").label(), "read(a.rs)");
        assert_eq!(write("a.rs", "").label(), "write_begin(a.rs)");
        assert_eq!(BlockCommand::List { dir: None }.label(), "list()");
        assert_eq!(BlockCommand::List { dir: Some("src".into()) }.label(), "list(src)");
        assert_eq!(done("x").label(), "done");
        assert_eq!(done("x").tool_name(), "finish");
    }

    #[test]
    fn the_instructions_name_every_command_and_show_no_code_to_copy() {
        let text = blocks_protocol_instructions();
        for command in ["@@@read(path)", "@@@list()", "@@@write_begin(path)", "@@@write_end", "@@@done(summary)"] {
            assert!(text.contains(command), "{command}");
        }
        assert!(text.contains("@@@result <command> and @@@end"), "{text}");
        assert!(!text.contains("fn ") && !text.contains("view.rs"), "{text}");
        // Each command line, as a reply, reads as its command.
        assert_eq!(clean("@@@list()"), vec![BlockCommand::List { dir: None }]);
        assert_eq!(clean("@@@read(path)"), vec![read("path")]);
        assert_eq!(clean("@@@done(summary)"), vec![done("summary")]);
    }

    #[test]
    fn long_inputs_are_fast() {
        let start = std::time::Instant::now();
        let big = "@@@write_begin(a)\n".repeat(1 << 16) + &"x\n".repeat(1 << 19);
        let reply = parse_blocks(&big);
        assert_eq!(reply.problems.len(), 1 << 16);
        let _ = parse_blocks(&"@@@read(".repeat(1 << 17));
        let _ = parse_blocks(&"```\n".repeat(1 << 18));
        assert!(start.elapsed().as_secs() < 5);
    }
}
