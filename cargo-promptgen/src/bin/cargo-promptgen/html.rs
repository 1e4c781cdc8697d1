//! `cargo promptgen log --html FILE`: one self-contained page of the chain. Its steps and
//! what each runs after, drawn as a graph; each step's state, cost and conversation (folded);
//! the files it wrote, highlighted; its check rounds. No script, no font, no image is loaded
//! from anywhere: the page works offline and from a file. Everything a model or a prompt wrote
//! is escaped.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use cargo_promptgen::__private::Chain;
use codegen_core::chat::Role;

use crate::highlight::{escape, rust};
use crate::history::{Event, Kind, Line, StepHistory};
use crate::log::shown_arguments;

/// The edges of the chain's graph, `(before, after)`: each step after each step it runs after
/// (`after`, resolved), the same source `cargo promptgen graph` draws from. In the graph's
/// order, so that each step comes after the steps it runs after.
pub fn edges(chain: &Chain) -> Vec<(String, String)> {
    chain
        .graph
        .order()
        .iter()
        .map(|&index| &chain.steps[index])
        .flat_map(|step| step.after.iter().map(|before| (before.clone(), step.id.clone())))
        .collect()
}

/// The page.
pub fn page(chain: &Chain, steps: &[StepHistory]) -> String {
    let mut html = String::new();
    let title = format!("{}: prompt chain", chain.package_name);
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n\
         <title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{}</h1>\n",
        escape(&title),
        escape(&title)
    );
    let _ = writeln!(
        html,
        "<p class=\"meta\">{} steps · <code>{}</code> · written by <code>cargo promptgen log --html</code></p>",
        chain.steps.len(),
        escape(&chain.manifest_path.display().to_string())
    );
    // Laid out in the graph's order: a step's column is one past the columns of the steps
    // it runs after, which must be placed first.
    let mut ordered: Vec<&StepHistory> = steps.iter().collect();
    ordered.sort_by_key(|step| chain.index(&step.id).map(|i| chain.graph.rank(i)));
    html.push_str(&graph(&edges(chain), &ordered));
    html.push_str(&summary_table(steps));
    for step in steps {
        html.push_str(&step_section(step));
    }
    html.push_str("</body>\n</html>\n");
    html
}

/// `fresh`, `pending`, `failed`... : the word a step's colour is chosen by.
fn state_of(step: &StepHistory) -> &'static str {
    match step.shown.as_ref().map(|s| s.kind) {
        Some(Kind::Failed) => "failed",
        Some(Kind::Interrupted) => "interrupted",
        _ => match step.state.as_str() {
            "fresh" => "fresh",
            "pending" => "pending",
            _ => "stale",
        },
    }
}

/// Calls and tokens of what a step's shown transcript did.
fn cost(step: &StepHistory) -> (u32, u64, u64, u32, u32) {
    let mut cost = (0, 0, 0, 0, 0);
    for line in step.shown.iter().flat_map(|s| &s.events) {
        let Line::Event(event) = line else { continue };
        match event {
            Event::ModelCall { usage, .. } => {
                cost.0 += 1;
                cost.1 += usage.prompt_tokens.unwrap_or(0);
                cost.2 += usage.completion_tokens.unwrap_or(0);
            }
            Event::Repair { .. } => cost.3 += 1,
            Event::Check { asked_by_model: false, diagnostics: Some(_), .. } => cost.4 += 1,
            _ => {}
        }
    }
    cost
}

/// The steps as boxes in columns by depth (a step's column is one past its deepest
/// predecessor's), with an arrow for each edge.
fn graph(edges: &[(String, String)], steps: &[&StepHistory]) -> String {
    const W: usize = 150;
    const H: usize = 46;
    const GAP_X: usize = 50;
    const GAP_Y: usize = 18;
    let mut column: BTreeMap<&str, usize> = BTreeMap::new();
    let mut rows: Vec<usize> = Vec::new();
    let mut place: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for step in steps {
        let depth = edges
            .iter()
            .filter(|(_, after)| *after == step.id)
            .filter_map(|(before, _)| column.get(before.as_str()))
            .map(|c| c + 1)
            .max()
            .unwrap_or(0);
        column.insert(&step.id, depth);
        if rows.len() <= depth {
            rows.resize(depth + 1, 0);
        }
        place.insert(&step.id, (depth, rows[depth]));
        rows[depth] += 1;
    }
    let width = rows.len().max(1) * (W + GAP_X) + 20;
    let height = rows.iter().copied().max().unwrap_or(1).max(1) * (H + GAP_Y) + 20;
    let at = |id: &str| place.get(id).map(|(c, r)| (10 + c * (W + GAP_X), 10 + r * (H + GAP_Y)));
    let mut svg = format!(
        "<svg class=\"graph\" role=\"img\" aria-label=\"the chain's steps\" width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\" xmlns=\"http://www.w3.org/2000/svg\">\n\
         <defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" \
         orient=\"auto-start-reverse\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"#667\"/></marker></defs>\n"
    );
    for (before, after) in edges {
        if let (Some((x1, y1)), Some((x2, y2))) = (at(before), at(after)) {
            let _ = writeln!(
                svg,
                "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#667\" stroke-width=\"1.5\" marker-end=\"url(#arrow)\"/>",
                x1 + W,
                y1 + H / 2,
                x2,
                y2 + H / 2
            );
        }
    }
    for step in steps {
        let Some((x, y)) = at(&step.id) else { continue };
        let state = state_of(step);
        let (calls, prompt, completion, _, _) = cost(step);
        let _ = writeln!(
            svg,
            "<a href=\"#step-{id}\"><g class=\"node {state}\"><rect x=\"{x}\" y=\"{y}\" width=\"{W}\" height=\"{H}\" rx=\"6\"/>\
             <text x=\"{tx}\" y=\"{ty}\" class=\"name\">step {id}</text>\
             <text x=\"{tx}\" y=\"{ty2}\" class=\"sub\">{state} · {calls} calls · {tokens} tok</text></g></a>",
            id = escape(&step.id),
            tx = x + 10,
            ty = y + 19,
            ty2 = y + 36,
            tokens = prompt + completion,
        );
    }
    svg.push_str("</svg>\n");
    format!("<section class=\"chain\">\n<h2>Chain</h2>\n{svg}</section>\n")
}

fn summary_table(steps: &[StepHistory]) -> String {
    let mut html = String::from(
        "<table class=\"summary\">\n<thead><tr><th>step</th><th>state</th><th>transcript</th><th>model calls</th>\
         <th>tokens (prompt + completion)</th><th>repairs</th><th>check rounds</th><th>files</th></tr></thead>\n<tbody>\n",
    );
    for step in steps {
        let (calls, prompt, completion, repairs, rounds) = cost(step);
        let kind = step.shown.as_ref().map_or("none", |s| s.kind.as_str());
        let _ = writeln!(
            html,
            "<tr class=\"{state}\"><td><a href=\"#step-{id}\">{id}</a></td><td>{state}</td><td>{kind}</td><td>{calls}</td>\
             <td>{prompt} + {completion}</td><td>{repairs}</td><td>{rounds}</td><td>{files}</td></tr>",
            id = escape(&step.id),
            state = state_of(step),
            files = step.files.len(),
        );
    }
    html.push_str("</tbody>\n</table>\n");
    html
}

fn step_section(step: &StepHistory) -> String {
    let state = state_of(step);
    let (calls, prompt, completion, repairs, rounds) = cost(step);
    // What needs a look is unfolded: a step that failed, was interrupted, or waits for review.
    let open = if matches!(state, "failed" | "interrupted" | "pending") { " open" } else { "" };
    let mut html = format!(
        "<details class=\"step {state}\" id=\"step-{id}\"{open}>\n<summary><span class=\"id\">step {id}</span> \
         <span class=\"badge {state}\">{state}</span> <span class=\"cost\">{calls} model calls · {prompt} + {completion} tokens · \
         {repairs} repairs · {rounds} check rounds</span></summary>\n",
        id = escape(&step.id),
    );
    match &step.shown {
        None => html.push_str("<p class=\"meta\">No transcript is kept for this step.</p>\n"),
        Some(shown) => {
            let _ = writeln!(
                html,
                "<p class=\"meta\">{} transcript: <code>{}</code></p>",
                escape(shown.kind.as_str()),
                escape(&shown.origin)
            );
            if let Some(entry) = &step.entry {
                let _ = writeln!(
                    html,
                    "<p class=\"meta\">result made by {} <code>{}</code>, key <code>{}</code></p>",
                    escape(&entry.fingerprint.backend),
                    escape(&entry.fingerprint.model),
                    escape(entry.key.get(..16).unwrap_or(&entry.key))
                );
                if let Some(provenance) = entry.provenance() {
                    let _ = writeln!(html, "<p class=\"meta\">{}</p>", escape(&provenance));
                }
            }
            if let Some(error) = &shown.error {
                let _ = writeln!(html, "<pre class=\"error\">{}</pre>", escape(error));
            }
            html.push_str("<div class=\"conversation\">\n");
            let mut repairs: Vec<&str> = Vec::new();
            for line in &shown.events {
                let event = match line {
                    Line::Event(event) => event,
                    Line::Unknown(kind) => {
                        let _ = writeln!(
                            html,
                            "<p class=\"meta\">(a <code>{}</code> event, which this version of cargo-promptgen cannot show)</p>",
                            escape(kind)
                        );
                        continue;
                    }
                };
                match event {
                    Event::Repair { problem, .. } => repairs.push(problem.trim_end()),
                    // The answer that only repeats a repair shown just above it.
                    Event::Message { message, .. }
                        if matches!(message.role, Role::User | Role::Tool)
                            && repairs.contains(&message.content.trim_end()) =>
                    {
                        let _ = writeln!(
                            html,
                            "<p class=\"meta\">{} the model: the repair above</p>",
                            if message.role == Role::Tool { "the tool's result told" } else { "told" }
                        );
                        continue;
                    }
                    _ => {}
                }
                html.push_str(&event_html(event));
            }
            if let Some(partial) = &shown.partial {
                let _ = writeln!(
                    html,
                    "<div class=\"partial\"><p>The reply to call {} was abandoned after {} pieces:</p><pre>{}</pre></div>",
                    partial.model_call,
                    partial.pieces,
                    escape(&partial.text)
                );
                if !partial.arguments.is_empty() {
                    let _ = writeln!(
                        html,
                        "<div class=\"partial\"><p>and the arguments of its call of {} so far:</p><pre>{}</pre></div>",
                        escape(partial.tool.as_deref().unwrap_or("a tool")),
                        escape(&partial.arguments)
                    );
                }
            }
            html.push_str("</div>\n");
        }
    }
    if !step.files.is_empty() {
        html.push_str("<h3>Files</h3>\n");
        for (path, bytes) in &step.files {
            let text = String::from_utf8_lossy(bytes);
            let body = if path.ends_with(".rs") { rust(&text) } else { escape(&text) };
            let _ = writeln!(
                html,
                "<details class=\"file\" open><summary><code>{}</code> · {} lines</summary><pre class=\"code\">{body}</pre></details>",
                escape(path),
                text.lines().count()
            );
        }
    }
    html.push_str("</details>\n");
    html
}

/// Text in a `<pre>`, folded when it is long.
fn block(class: &str, label: &str, text: &str) -> String {
    let lines = text.lines().count();
    if lines > 12 {
        format!(
            "<details class=\"{class}\"><summary>{} <span class=\"meta\">({lines} lines)</span></summary><pre>{}</pre></details>\n",
            label,
            escape(text)
        )
    } else {
        format!("<div class=\"{class}\"><div class=\"label\">{label}</div><pre>{}</pre></div>\n", escape(text))
    }
}

fn event_html(event: &Event) -> String {
    match event {
        Event::Start { model, backend, protocol, seed, max_model_calls, .. } => format!(
            "<p class=\"run\">{} {} · {} protocol · seed {} · budget {} calls</p>\n",
            escape(&backend.to_string()),
            escape(model),
            escape(protocol.as_str()),
            seed.map_or_else(|| "none".to_string(), |s| s.to_string()),
            max_model_calls
        ),
        Event::Message { message, .. } => {
            let (class, label) = match message.role {
                Role::System => ("msg system", "system".to_string()),
                Role::User => ("msg user", "user".to_string()),
                Role::Assistant => ("msg model", "model".to_string()),
                Role::Tool => {
                    ("msg result", format!("result of {}", escape(message.tool_name.as_deref().unwrap_or("a tool"))))
                }
            };
            if message.role == Role::Assistant && message.content.trim().is_empty() {
                return String::new();
            }
            if message.role == Role::System {
                // Long and the same in every step: folded whatever its length.
                return format!(
                    "<details class=\"{class}\"><summary>system <span class=\"meta\">({} lines)</span></summary><pre>{}</pre></details>\n",
                    message.content.lines().count(),
                    escape(&message.content)
                );
            }
            block(class, &label, message.content.trim_end())
        }
        Event::ModelCall { number, usage, finish_reason, constraint, volatile, .. } => format!(
            "<p class=\"call\">call {number} · {} prompt{} + {} completion tokens{}{}{}</p>\n",
            usage.prompt_tokens.map_or("?".into(), |t| t.to_string()),
            volatile
                .as_ref()
                .and_then(|v| v.prompt_cache)
                .map(|cache| crate::log::prompt_cache_text(cache, usage.prompt_tokens))
                .unwrap_or_default(),
            usage.completion_tokens.map_or("?".into(), |t| t.to_string()),
            constraint.as_ref().map(|d| format!(" · constrained ({})", escape(d))).unwrap_or_default(),
            volatile.as_ref().map(|v| format!(" · {:.1}s", v.duration.as_secs_f64())).unwrap_or_default(),
            finish_reason.as_ref().map(|r| format!(" · stop: {}", escape(r))).unwrap_or_default()
        ),
        Event::ToolRun { tool, arguments, ok, .. } => format!(
            "<p class=\"tool {}\">{} <b>{}</b> <code>{}</code>{}</p>\n",
            if *ok { "ok" } else { "refused" },
            if *ok { "→" } else { "✗" },
            escape(tool),
            escape(&shown_arguments(arguments)),
            if *ok { "" } else { " <span class=\"badge failed\">refused</span>" }
        ),
        Event::Repair { problem, .. } => block("repair", "repair", problem),
        Event::Check { asked_by_model, diagnostics, put_off, .. } => {
            let when = if *asked_by_model { "asked for by the model" } else { "at finish" };
            match diagnostics {
                Some(text) => block("check failed", &format!("check failed ({when})"), text),
                None => format!(
                    "<p class=\"check passed\">check passed ({when}){}</p>\n",
                    put_off.as_ref().map(|p| format!(", in part: {}", escape(p))).unwrap_or_default()
                ),
            }
        }
        Event::Fallback { from, to, reason } => format!(
            "<p class=\"repair\">fell back from the {} protocol to {}: {}</p>\n",
            escape(from.as_str()),
            escape(to.as_str()),
            escape(reason)
        ),
        Event::Constrained { protocol, by, server } => format!(
            "<p class=\"tool ok\">constrained: {} enforces {} on every reply ({} protocol)</p>\n",
            escape(if server.is_empty() { "the server" } else { server }),
            escape(by.describe()),
            escape(protocol.as_str())
        ),
        Event::Unconstrained { reason } => {
            format!("<p class=\"repair\">unconstrained: the server refused the constraint: {}</p>\n", escape(reason))
        }
        Event::End { outcome, summary, .. } => format!(
            "<p class=\"end {}\">end: {}{}</p>\n",
            escape(outcome.as_str()),
            escape(&outcome.as_str().replace('_', " ")),
            summary.as_ref().map(|s| format!(" — {}", escape(s))).unwrap_or_default()
        ),
        _ => String::new(),
    }
}

const STYLE: &str = r#"
body { font: 15px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 70em; padding: 0 1em; color: #1d1d24; background: #fbfbfd; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.15em; } h3 { font-size: 1em; margin: 1em 0 0.4em; }
code, pre { font: 13px/1.4 ui-monospace, "DejaVu Sans Mono", monospace; }
pre { white-space: pre-wrap; word-break: break-word; margin: 0.2em 0; padding: 0.5em 0.7em; background: #f0f0f5; border-radius: 4px; }
.meta { color: #667; font-size: 0.9em; }
svg.graph { max-width: 100%; height: auto; }
svg .node rect { fill: #eef0f4; stroke: #99a; stroke-width: 1.2; }
svg .node.fresh rect { fill: #e3f4e6; stroke: #3a9a50; }
svg .node.pending rect { fill: #fdf3d6; stroke: #c19a18; }
svg .node.stale rect { fill: #eceef2; stroke: #8a8f9c; }
svg .node.failed rect, svg .node.interrupted rect { fill: #fbe3e3; stroke: #c0392b; }
svg text.name { font: bold 14px system-ui, sans-serif; fill: #1d1d24; }
svg text.sub { font: 11px system-ui, sans-serif; fill: #4a4f5c; }
table.summary { border-collapse: collapse; margin: 1em 0 1.5em; }
table.summary th, table.summary td { border-bottom: 1px solid #dde; padding: 0.25em 0.8em; text-align: left; }
details.step { border: 1px solid #d5d7e0; border-left-width: 5px; border-radius: 5px; margin: 0.8em 0; padding: 0.4em 0.9em; background: #fff; }
details.step.fresh { border-left-color: #3a9a50; } details.step.pending { border-left-color: #c19a18; }
details.step.failed, details.step.interrupted { border-left-color: #c0392b; } details.step.stale { border-left-color: #8a8f9c; }
details.step > summary { cursor: pointer; font-size: 1.05em; }
.id { font-weight: bold; }
.badge { display: inline-block; font-size: 0.8em; padding: 0 0.5em; border-radius: 9px; background: #e4e6ec; }
.badge.fresh { background: #d3efd9; } .badge.pending { background: #faeab8; } .badge.failed, .badge.interrupted { background: #f6cdcd; }
.cost { color: #4a4f5c; font-size: 0.9em; }
.msg, .repair, .check { margin: 0.4em 0; }
.label, details.msg > summary, details.repair > summary, details.check > summary { font-size: 0.85em; font-weight: bold; color: #4a4f5c; }
.msg.user .label { color: #2d7a3e; } .msg.model .label { color: #1f6f99; } .msg.result .label { color: #8a6d00; }
.repair .label, .repair > summary, .check.failed .label, .check.failed > summary { color: #b03020; }
.repair pre, .check.failed pre, pre.error { background: #fcecea; }
p.call { color: #667; font-size: 0.85em; border-top: 1px dashed #ccd; padding-top: 0.3em; margin: 0.8em 0 0.3em; }
p.tool { margin: 0.2em 0; } p.tool.refused b { color: #b03020; }
p.check.passed { color: #2d7a3e; } p.end { font-weight: bold; } p.end.failed, p.end.interrupted { color: #b03020; }
.partial pre { background: #fff6e0; }
pre.code .k { color: #8b2fc9; } pre.code .s { color: #2d7a3e; } pre.code .c { color: #7a7f8c; font-style: italic; }
pre.code .n { color: #b5541b; } pre.code .m { color: #1f6f99; } pre.code .a { color: #8a6d00; }
pre.code .t { color: #1f5fa8; } pre.code .l { color: #b03070; }
"#;
