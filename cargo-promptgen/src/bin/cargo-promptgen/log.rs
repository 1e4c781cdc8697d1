//! `cargo promptgen log [STEP]`: a step's conversation for people. Messages, each tool call
//! with its arguments cut short, the results, refusals and repairs, check rounds with their
//! diagnostics, tokens and timings; in colour on a terminal.

use std::io::Write;

use anstyle::{AnsiColor, Style};
use codegen_core::chat::{Arguments, Role};

use codegen_core::backend::Delivery;

use crate::history::{Event, Kind, Line, Shown, StepHistory, list};

/// How much of each long text to show.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `--full`: everything.
    pub full: bool,
}

impl Limits {
    fn lines(&self, usual: usize) -> usize {
        if self.full { usize::MAX } else { usual }
    }
}

const TITLE: Style = Style::new().bold();
const DIM: Style = AnsiColor::BrightBlack.on_default();
const SYSTEM: Style = AnsiColor::Magenta.on_default();
const USER: Style = AnsiColor::Green.on_default().bold();
const MODEL: Style = AnsiColor::Cyan.on_default().bold();
const TOOL: Style = AnsiColor::Yellow.on_default();
const BAD: Style = AnsiColor::Red.on_default().bold();
const GOOD: Style = AnsiColor::Green.on_default();

/// Writes `step`'s history; `out` drops the styles where colour is off.
pub fn write_step(out: &mut dyn Write, step: &StepHistory, limits: Limits) -> std::io::Result<()> {
    let Some(shown) = &step.shown else {
        writeln!(out, "{TITLE}step {}{TITLE:#} ({}): no transcript is kept", step.id, step.state)?;
        return Ok(());
    };
    writeln!(
        out,
        "{TITLE}step {}{TITLE:#} · {} · {DIM}{}{DIM:#}",
        step.id,
        paint(kind_style(shown.kind), shown.kind.as_str()),
        shown.origin
    )?;
    let others: Vec<Kind> = step.available.iter().copied().filter(|k| *k != shown.kind).collect();
    if !others.is_empty() {
        writeln!(out, "{DIM}also kept: {} (`--show KIND`){DIM:#}", list(&others))?;
    }
    if let Some(provenance) = step.entry.as_ref().and_then(|entry| entry.provenance()) {
        writeln!(out, "{DIM}{provenance}{DIM:#}")?;
    }
    if let Some(error) = &shown.error {
        writeln!(out, "{BAD}{}:{BAD:#} {}", shown.kind.as_str(), indent_rest(error, "  "))?;
    }
    write_events(out, shown, limits)?;
    if let Some(partial) = &shown.partial {
        let tool = partial.tool.as_deref().map(|t| format!(", calling {t}")).unwrap_or_default();
        let pieces = if partial.pieces == 1 { "1 piece".to_string() } else { format!("{} pieces", partial.pieces) };
        writeln!(
            out,
            "{BAD}abandoned:{BAD:#} the reply to call {} had {pieces}{tool} when it was interrupted",
            partial.model_call
        )?;
        if !partial.text.is_empty() {
            writeln!(out, "  {DIM}its text so far:{DIM:#}")?;
            write_block(out, &partial.text, limits.lines(12), "    ")?;
        }
        if !partial.arguments.is_empty() {
            writeln!(out, "  {DIM}the arguments of its call so far:{DIM:#}")?;
            write_block(out, &unescaped(&partial.arguments), limits.lines(12), "    ")?;
        }
    }
    if !shown.timed {
        writeln!(out, "{DIM}(no timings: the store keeps none, and no attempt on this machine matches){DIM:#}")?;
    }
    Ok(())
}

fn kind_style(kind: Kind) -> Style {
    match kind {
        Kind::Recorded => GOOD,
        Kind::Pending => TOOL,
        Kind::Failed | Kind::Interrupted => BAD,
    }
}

fn paint(style: Style, text: &str) -> String {
    format!("{style}{text}{style:#}")
}

fn write_events(out: &mut dyn Write, shown: &Shown, limits: Limits) -> std::io::Result<()> {
    let mut run = 0;
    let mut budget = 0;
    let mut user_messages = 0;
    let mut repairs: Vec<String> = Vec::new();
    let mut totals = (0u32, 0u64, 0u64, 0u32, 0u32, 0u64);
    for line in &shown.events {
        let event = match line {
            Line::Event(event) => event,
            Line::Unknown(kind) => {
                writeln!(out, "  {DIM}(a `{kind}` event, which this version of cargo-promptgen cannot show){DIM:#}")?;
                continue;
            }
        };
        match event {
            Event::Start { model, backend, protocol, seed, temperature, max_model_calls, volatile } => {
                run += 1;
                budget = *max_model_calls;
                user_messages = 0;
                let mut parts = vec![format!("{backend} {model}"), format!("{protocol} protocol")];
                if let Some(seed) = seed {
                    parts.push(format!("seed {seed}"));
                }
                if let Some(t) = temperature {
                    parts.push(format!("temperature {t}"));
                }
                parts.push(format!("budget {max_model_calls} calls"));
                if let Some(v) = volatile {
                    parts.push(v.location.clone());
                }
                writeln!(out, "{TITLE}run {run}{TITLE:#}: {}", parts.join(" · "))?;
            }
            Event::Message { message, .. } => {
                let (label, style, lines) = match message.role {
                    Role::System => ("system", SYSTEM, limits.lines(3)),
                    Role::User if user_messages == 0 => ("user", USER, limits.lines(40)),
                    Role::User => ("user", USER, limits.lines(8)),
                    Role::Assistant => ("model", MODEL, limits.lines(20)),
                    Role::Tool => ("result", TOOL, limits.lines(4)),
                };
                if message.role == Role::User {
                    user_messages += 1;
                }
                let content = message.content.trim_end();
                if message.role == Role::Assistant && content.is_empty() {
                    continue;
                }
                if matches!(message.role, Role::Tool | Role::User)
                    && user_messages != 1
                    && repairs.iter().any(|r| r == content)
                {
                    let name = message.tool_name.as_deref().map(|n| format!(" of {n}")).unwrap_or_default();
                    writeln!(out, "  {style}{label}{name}{style:#}: {DIM}(the refusal above){DIM:#}")?;
                    continue;
                }
                let name = message.tool_name.as_deref().map(|n| format!(" of {n}")).unwrap_or_default();
                writeln!(out, "  {style}{label}{name}{style:#}")?;
                write_block(out, content, lines, "    ")?;
            }
            Event::ModelCall { number, usage, finish_reason, constraint, volatile, .. } => {
                totals.0 += 1;
                totals.1 += usage.prompt_tokens.unwrap_or(0);
                totals.2 += usage.completion_tokens.unwrap_or(0);
                let mut parts = vec![format!("call {number}/{budget}")];
                let cache = volatile
                    .as_ref()
                    .and_then(|v| v.prompt_cache)
                    .map(|cache| prompt_cache_text(cache, usage.prompt_tokens))
                    .unwrap_or_default();
                parts.push(format!(
                    "{} prompt{cache} + {} completion tokens",
                    count(usage.prompt_tokens),
                    count(usage.completion_tokens)
                ));
                if let Some(digest) = constraint {
                    parts.push(format!("constrained ({digest})"));
                }
                if let Some(v) = volatile {
                    let ms = u64::try_from(v.duration.as_millis()).unwrap_or(u64::MAX);
                    totals.5 += ms;
                    parts.push(seconds(ms));
                    if !v.retries.is_empty() {
                        parts.push(format!("{} retries", v.retries.len()));
                    }
                    parts.push(
                        match v.delivery {
                            Delivery::Streamed => "streamed",
                            Delivery::Fallback(_) => "whole, after a failed stream",
                            _ => "whole",
                        }
                        .to_string(),
                    );
                }
                if let Some(reason) = finish_reason {
                    parts.push(format!("stop: {reason}"));
                }
                writeln!(out, "{DIM}┄┄ {}{DIM:#}", parts.join(" · "))?;
            }
            Event::ToolRun { tool, arguments, ok, .. } => {
                let (mark, style) = if *ok { ("→", TOOL) } else { ("✗", BAD) };
                let status = if *ok { String::new() } else { format!(" {BAD}refused{BAD:#}") };
                writeln!(out, "  {style}{mark} {tool}{style:#} {}{status}", shown_arguments(arguments))?;
            }
            Event::Repair { problem, .. } => {
                totals.3 += 1;
                repairs.push(problem.trim_end().to_string());
                writeln!(out, "  {BAD}repair{BAD:#}")?;
                write_block(out, problem, limits.lines(10), "    ")?;
            }
            Event::Check { asked_by_model, diagnostics, put_off, .. } => {
                let when = if *asked_by_model { "asked for by the model" } else { "at finish" };
                match diagnostics {
                    None => {
                        let part = put_off.as_deref().map(|p| format!(" in part ({p})")).unwrap_or_default();
                        writeln!(out, "  {GOOD}check passed{GOOD:#} ({when}){part}")?;
                    }
                    Some(text) => {
                        if !asked_by_model {
                            totals.4 += 1;
                        }
                        writeln!(out, "  {BAD}check failed{BAD:#} ({when}):")?;
                        write_block(out, text, limits.lines(20), "    ")?;
                    }
                }
            }
            Event::Fallback { from, to, reason } => {
                writeln!(out, "  {TOOL}fell back{TOOL:#} from the {from} protocol to {to}: {reason}")?;
            }
            Event::Constrained { protocol, by, server } => {
                let server = if server.is_empty() { "the server" } else { server.as_str() };
                writeln!(
                    out,
                    "  {TOOL}constrained{TOOL:#}: {server} enforces {} on every reply ({protocol} protocol)",
                    by.describe()
                )?;
            }
            Event::Unconstrained { reason } => {
                writeln!(out, "  {BAD}unconstrained{BAD:#}: the server refused the constraint: {reason}")?;
            }
            Event::End { outcome, summary, volatile } => {
                let style = if outcome.is_done() { GOOD } else { BAD };
                let mut line = format!("{style}end: {}{style:#}", outcome.as_str().replace('_', " "));
                if let Some(summary) = summary {
                    line.push_str(&format!(" — {}", summary.trim()));
                }
                if let Some(v) = volatile {
                    let ms = u64::try_from(v.wall_time.as_millis()).unwrap_or(u64::MAX);
                    line.push_str(&format!(" {DIM}({} in all){DIM:#}", seconds(ms)));
                }
                writeln!(out, "{line}")?;
            }
            _ => {}
        }
    }
    let (calls, prompt, completion, repairs, rounds, model_ms) = totals;
    let time = if shown.timed { format!(" · {} waiting for the model", seconds(model_ms)) } else { String::new() };
    writeln!(
        out,
        "{TITLE}total{TITLE:#}: {calls} model calls · {prompt} + {completion} tokens · {repairs} repairs · {rounds} check rounds{time}"
    )
}

/// What the server read of a prompt of `prompt_tokens`: ` (120 read, the rest cached)`,
/// ` (all read)`; nothing when it only says it read the whole prompt (Ollama counts what it
/// read, so a prompt read whole tells nothing more).
pub(crate) fn prompt_cache_text(cache: codegen_core::backend::PromptCache, prompt_tokens: Option<u64>) -> String {
    match cache.reused {
        Some(0) => " (all read)".to_string(),
        None if Some(cache.read) == prompt_tokens => String::new(),
        _ => format!(" ({} read, the rest cached)", cache.read),
    }
}

/// Arguments cut off in the middle are not JSON yet: show their strings' line breaks as
/// line breaks, so that code reads as code.
fn unescaped(arguments: &str) -> String {
    arguments.replace("\\n", "\n").replace("\\t", "    ").replace("\\\"", "\"")
}

fn count(tokens: Option<u64>) -> String {
    tokens.map_or_else(|| "?".into(), |t| t.to_string())
}

fn seconds(ms: u64) -> String {
    format!("{:.1}s", ms as f64 / 1000.0)
}

fn indent_rest(text: &str, indent: &str) -> String {
    text.trim_end().replace('\n', &format!("\n{indent}"))
}

/// `text` indented, cut to `max_lines` lines with a note of how many more there are.
fn write_block(out: &mut dyn Write, text: &str, max_lines: usize, indent: &str) -> std::io::Result<()> {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    for line in lines.iter().take(max_lines) {
        writeln!(out, "{indent}{line}")?;
    }
    if lines.len() > max_lines {
        writeln!(out, "{indent}{DIM}… {} more lines (`--full` shows them){DIM:#}", lines.len() - max_lines)?;
    }
    Ok(())
}

/// A call's arguments on one line: each long or multi-line string cut to its start, with its
/// size.
pub fn shown_arguments(arguments: &Arguments) -> String {
    match arguments {
        Arguments::Object(map) => {
            let parts: Vec<String> = map.iter().map(|(key, value)| format!("{key}: {}", shown_value(value))).collect();
            format!("{{{}}}", parts.join(", "))
        }
        Arguments::Malformed { raw, error } => format!("(malformed: {error}) {}", shown_value(&raw.clone().into())),
    }
}

fn shown_value(value: &serde_json::Value) -> String {
    const MAX: usize = 48;
    match value {
        serde_json::Value::String(text) => {
            let lines = text.lines().count();
            let first = text.lines().next().unwrap_or_default();
            if lines <= 1 && text.chars().count() <= MAX {
                return serde_json::Value::String(text.clone()).to_string();
            }
            let start: String = first.chars().take(MAX).collect();
            let size = if lines > 1 {
                format!("{lines} lines, {} bytes", text.len())
            } else {
                format!("{} bytes", text.len())
            };
            format!("{}… ({size})", serde_json::Value::String(start).to_string().trim_end_matches('"'))
        }
        other => {
            let text = other.to_string();
            if text.chars().count() <= MAX {
                text
            } else {
                format!("{}…", text.chars().take(MAX).collect::<String>())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn long_arguments_are_cut_to_their_start_and_size() {
        let args = Arguments::Object(
            json!({"path": "src/a.rs", "content": "pub fn a() {}\npub fn b() {}\npub fn c() {}\n"})
                .as_object()
                .unwrap()
                .clone(),
        );
        assert_eq!(shown_arguments(&args), r#"{content: "pub fn a() {}… (3 lines, 42 bytes), path: "src/a.rs"}"#);
        let malformed = Arguments::Malformed { raw: "{\"path\": ".into(), error: "EOF".into() };
        assert_eq!(shown_arguments(&malformed), r#"(malformed: EOF) "{\"path\": ""#);
    }
}
