//! `cargo promptgen graph`: the chain as a Mermaid flowchart (the default; GitHub and most
//! Markdown viewers draw it) or a Graphviz graph (`--format dot`). Each step is a box with its
//! id, its state (`fresh`, `pending`, `stale`, or `unpulled` in cache mode) and its outputs;
//! an arrow goes from each step to the steps that run after it. With `--workspace`, each
//! package is a subgraph of one chart, and every node names its package.

use std::fmt::Write as _;
use std::process::ExitCode;

use cargo_promptgen::__private::Overrides;
use cargo_promptgen::__private::ProcessLock;
use cargo_promptgen::__private::review::{self as report, StatusRow};
use clap::{Args, ValueEnum};

use crate::{Package, Packages};

/// `graph`'s options.
#[derive(Args, Debug, Default, Clone)]
pub struct GraphArgs {
    #[command(flatten)]
    packages: Packages,
    /// `mermaid` (a Mermaid flowchart) or `dot` (Graphviz).
    #[arg(long, value_enum, default_value_t = Format::Mermaid)]
    format: Format,
}

/// How the graph is written.
#[derive(ValueEnum, Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A Mermaid flowchart.
    #[default]
    Mermaid,
    /// A Graphviz `digraph`.
    Dot,
}

/// One package's steps.
struct Chart {
    package: String,
    rows: Vec<StatusRow>,
}

pub fn graph(args: &GraphArgs) -> anyhow::Result<ExitCode> {
    let selection = &args.packages.selection;
    let metadata = crate::cargo_metadata(selection.manifest_path.as_deref())?;
    let workspace = args.packages.members.workspace;
    let manifests = if workspace {
        crate::workspace::chain_members(&metadata, &args.packages.members)?.into_iter().map(|(_, m)| m).collect()
    } else {
        vec![crate::select_package(&metadata, selection)?]
    };
    let mut charts = Vec::new();
    for manifest in manifests {
        let Package { chain, layout } = crate::open_manifest(&metadata, &manifest, &Overrides::default())?;
        let _guard = ProcessLock::acquire(&layout)?;
        charts.push(Chart { package: chain.package_name.clone(), rows: report::status(&chain, &layout)? });
    }
    let text = match args.format {
        Format::Mermaid => mermaid(&charts, workspace),
        Format::Dot => dot(&charts, workspace),
    };
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

/// `01 (fresh)` and the outputs, one per line.
fn label_lines(row: &StatusRow, package: Option<&str>) -> Vec<String> {
    let mut lines = vec![match package {
        Some(package) => format!("{package} {} ({})", row.id, row.state),
        None => format!("{} ({})", row.id, row.state),
    }];
    lines.extend(row.outputs.iter().cloned());
    lines
}

/// The style of a state: fresh, pending, or stale (unpulled too).
fn class(state: &str) -> &'static str {
    match state {
        "fresh" => "fresh",
        "pending" => "pending",
        _ => "stale",
    }
}

/// A Mermaid node id for a step: letters and digits kept, `_` doubled, every other character
/// `_` and its code, so that two ids never meet.
fn mermaid_id(package: Option<&str>, id: &str) -> String {
    let escape = |text: &str| {
        let mut out = String::new();
        for c in text.chars() {
            match c {
                c if c.is_ascii_alphanumeric() => out.push(c),
                '_' => out.push_str("__"),
                c => {
                    let _ = write!(out, "_{:x}", u32::from(c));
                }
            }
        }
        out
    };
    match package {
        Some(package) => format!("p_{}_s_{}", escape(package), escape(id)),
        None => format!("s_{}", escape(id)),
    }
}

fn mermaid(charts: &[Chart], workspace: bool) -> String {
    let mut out = String::from("flowchart TD\n");
    let mut classes: Vec<(String, &'static str)> = Vec::new();
    for chart in charts {
        let package = workspace.then_some(chart.package.as_str());
        let indent = if workspace { "        " } else { "    " };
        if let Some(package) = package {
            let _ = writeln!(out, "    subgraph {}[\"{}\"]", mermaid_id(Some(package), ""), mermaid_text(package));
        }
        for row in &chart.rows {
            let node = mermaid_id(package, &row.id);
            let label: Vec<String> = label_lines(row, package).iter().map(|l| mermaid_text(l)).collect();
            let _ = writeln!(out, "{indent}{node}[\"{}\"]", label.join("<br/>"));
            classes.push((node, class(row.state)));
        }
        for row in &chart.rows {
            for after in &row.after {
                let _ = writeln!(out, "{indent}{} --> {}", mermaid_id(package, after), mermaid_id(package, &row.id));
            }
        }
        if workspace {
            out.push_str("    end\n");
        }
    }
    out.push_str("    classDef fresh fill:#dcf5dc,stroke:#2e7d32\n");
    out.push_str("    classDef pending fill:#fff4ce,stroke:#b28704\n");
    out.push_str("    classDef stale fill:#fde0dc,stroke:#c62828\n");
    for (node, class) in classes {
        let _ = writeln!(out, "    class {node} {class}");
    }
    out
}

/// Text inside a quoted Mermaid label: its quotes and angle brackets as entities.
fn mermaid_text(text: &str) -> String {
    text.replace('"', "#quot;").replace('<', "#lt;").replace('>', "#gt;")
}

fn dot(charts: &[Chart], workspace: bool) -> String {
    let mut out =
        String::from("digraph promptgen {\n    rankdir=TB;\n    node [shape=box, style=\"rounded,filled\"];\n");
    for chart in charts {
        let package = workspace.then_some(chart.package.as_str());
        let indent = if workspace { "        " } else { "    " };
        let node = |id: &str| match package {
            Some(package) => dot_string(&format!("{package}/{id}")),
            None => dot_string(id),
        };
        if let Some(package) = package {
            let _ = writeln!(out, "    subgraph {} {{", dot_string(&format!("cluster_{package}")));
            let _ = writeln!(out, "        label={};", dot_string(package));
        }
        for row in &chart.rows {
            let color = match class(row.state) {
                "fresh" => "#dcf5dc",
                "pending" => "#fff4ce",
                _ => "#fde0dc",
            };
            let label = label_lines(row, package).join("\n");
            let _ = writeln!(out, "{indent}{} [label={}, fillcolor=\"{color}\"];", node(&row.id), dot_string(&label));
        }
        for row in &chart.rows {
            for after in &row.after {
                let _ = writeln!(out, "{indent}{} -> {};", node(after), node(&row.id));
            }
        }
        if workspace {
            out.push_str("    }\n");
        }
    }
    out.push_str("}\n");
    out
}

/// A quoted DOT string.
fn dot_string(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, state: &'static str, after: &[&str], outputs: &[&str]) -> StatusRow {
        StatusRow {
            id: id.into(),
            prompt: format!("prompts/{id}.md"),
            after: after.iter().map(|s| s.to_string()).collect(),
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            state,
            reasons: Vec::new(),
            files: 1,
            backend: "ollama".into(),
            model: "m".into(),
            model_calls: None,
            tokens: None,
            repairs: None,
            check_rounds: None,
            seed: None,
            retried: false,
        }
    }

    fn diamond() -> Vec<Chart> {
        vec![Chart {
            package: "pkg".into(),
            rows: vec![
                row("01", "fresh", &[], &["a.rs"]),
                row("02", "stale", &["01"], &["b.rs"]),
                row("03", "pending", &["01"], &["c.rs", "d.rs"]),
                row("04", "stale", &["02", "03"], &["e.rs"]),
            ],
        }]
    }

    #[test]
    fn mermaid_draws_each_step_with_its_state_and_outputs_and_an_arrow_per_dependency() {
        let text = mermaid(&diamond(), false);
        for line in [
            "flowchart TD",
            "    s_01[\"01 (fresh)<br/>a.rs\"]",
            "    s_03[\"03 (pending)<br/>c.rs<br/>d.rs\"]",
            "    s_01 --> s_02",
            "    s_02 --> s_04",
            "    s_03 --> s_04",
            "    class s_02 stale",
            "    class s_01 fresh",
        ] {
            assert!(text.lines().any(|l| l == line), "no line {line:?} in:\n{text}");
        }
        assert_eq!(text.matches("-->").count(), 4, "{text}");
    }

    #[test]
    fn ids_that_differ_stay_different_nodes() {
        assert_ne!(mermaid_id(None, "a-b"), mermaid_id(None, "a_b"));
        assert_ne!(mermaid_id(Some("p"), "a_s_b"), mermaid_id(Some("p_s_a"), "b"));
        assert!(mermaid_id(Some("pg-e2e"), "0_1").chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    }

    #[test]
    fn dot_is_a_digraph_with_quoted_names_and_clusters_per_package() {
        let text = dot(&diamond(), true);
        assert!(text.starts_with("digraph promptgen {\n") && text.ends_with("}\n"), "{text}");
        for line in [
            "    subgraph \"cluster_pkg\" {",
            "        \"pkg/01\" [label=\"pkg 01 (fresh)\\na.rs\", fillcolor=\"#dcf5dc\"];",
            "        \"pkg/01\" -> \"pkg/03\";",
            "        \"pkg/03\" -> \"pkg/04\";",
        ] {
            assert!(text.lines().any(|l| l == line), "no line {line:?} in:\n{text}");
        }
        assert_eq!(dot_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
    }
}
