//! What a model is told when a check in the crate fails: the compiler's errors, read from
//! Cargo's JSON messages and located by the paths the model knows (`user_json.rs:2:12` for a
//! generated file, `src/main.rs:8:5` for the crate's own), and the failing tests by name with
//! their messages. Never a build folder or an `OUT_DIR` path.
//!
//! Diagnostics obey the sandbox's read rules: the source lines of a span are shown only when
//! the model could read its file with `read_file` (the generated tree, the crate's sources);
//! a dependency's or the toolchain's file is named but not quoted; and a diagnostic that
//! points into any other file (`.env`, a file outside the package) is withheld whole, with
//! the reason, since even its message may quote that file.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use codegen_core::check::{Diagnostics, Finding, Findings, trim_diagnostics};
use serde::Deserialize;

use crate::check::redact::Redactor;

/// One line Cargo prints with `--message-format=json`, as far as the checks read it.
#[derive(Debug, Deserialize)]
struct CargoMessage {
    reason: String,
    #[serde(default)]
    package_id: String,
    message: Option<Diagnostic>,
    out_dir: Option<PathBuf>,
}

/// A compiler diagnostic (rustc's JSON shape).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Diagnostic {
    pub message: String,
    pub code: Option<Code>,
    pub level: String,
    #[serde(default)]
    pub spans: Vec<Span>,
    #[serde(default)]
    pub children: Vec<Diagnostic>,
}

/// `error[E0308]`'s code.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Code {
    pub code: String,
}

/// Where a diagnostic points.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Span {
    pub file_name: String,
    pub line_start: usize,
    pub column_start: usize,
    pub is_primary: bool,
    pub label: Option<String>,
    #[serde(default)]
    pub text: Vec<SpanLine>,
    /// What a `help` suggests writing there.
    pub suggested_replacement: Option<String>,
}

/// One source line of a span, with the columns it highlights (1-based, end exclusive).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct SpanLine {
    pub text: String,
    pub highlight_start: usize,
    pub highlight_end: usize,
}

/// What a Cargo run printed on its standard output, sorted.
#[derive(Debug, Default)]
pub(crate) struct CargoOutput {
    /// The compiler's errors (not warnings, not the closing "aborting due to" lines).
    pub errors: Vec<Diagnostic>,
    /// `OUT_DIR` of the checked package's build script, where the generated tree is mounted.
    pub out_dir: Option<PathBuf>,
    /// Every line that is not one of Cargo's JSON messages: the test harness's output.
    pub other_lines: Vec<String>,
}

/// Sorts Cargo's standard output, which mixes its JSON messages with the output of the test
/// binaries; `package_dir` says which build script's `OUT_DIR` is the checked package's.
pub(crate) fn read_cargo_output(stdout: &str, package_dir: &Path) -> CargoOutput {
    let mut output = CargoOutput::default();
    let ours = format!("file://{}", package_dir.display());
    for line in stdout.lines() {
        let message = line.starts_with('{').then(|| serde_json::from_str::<CargoMessage>(line).ok()).flatten();
        let Some(message) = message else {
            output.other_lines.push(line.to_string());
            continue;
        };
        match message.reason.as_str() {
            "compiler-message" => {
                if let Some(diagnostic) = message.message
                    && diagnostic.level.starts_with("error")
                    && !is_summary(&diagnostic)
                {
                    output.errors.push(diagnostic);
                }
            }
            "build-script-executed" if message.package_id.contains(&ours) => {
                // `file:///pkg` is also a prefix of `file:///pkg-other`: the id goes on with
                // `#` (the name or version), so check what follows.
                let rest = &message.package_id[message.package_id.find(&ours).unwrap_or(0) + ours.len()..];
                if rest.starts_with('#') {
                    output.out_dir = message.out_dir;
                }
            }
            _ => {}
        }
    }
    output
}

/// "aborting due to 2 previous errors", "could not compile": counts, not errors.
fn is_summary(diagnostic: &Diagnostic) -> bool {
    diagnostic.spans.is_empty()
        && (diagnostic.message.starts_with("aborting due to") || diagnostic.message.starts_with("could not compile"))
}

/// Where a file named in a diagnostic is, for the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Place {
    /// A generated file, by its path in the generated tree (`user_json.rs`).
    Generated(String),
    /// A file of the crate the model may read, by its path in the package (`src/main.rs`).
    Crate(String),
    /// A dependency's source or the standard library's: public, named but not quoted.
    Outside,
    /// A file the model may not read: a protected file of the package, or one outside it.
    Hidden {
        /// How to name it.
        shown: String,
        /// Why the model may not read it.
        why: String,
    },
}

/// Turns the paths in diagnostics into the paths the model knows.
#[derive(Debug, Clone)]
pub(crate) struct PathMap {
    /// Where the generated tree is mounted (`$OUT_DIR/promptgen`), when known.
    pub generated_root: Option<PathBuf>,
    /// The package folder.
    pub package_dir: PathBuf,
    /// The folder Cargo ran rustc in, which relative file names are relative to (the
    /// workspace root).
    pub relative_to: PathBuf,
    /// The package paths the model may read (`src`, `tests`, `Cargo.toml`, declared inputs):
    /// a file of the package elsewhere is hidden.
    pub readable: Vec<String>,
}

impl PathMap {
    pub fn place(&self, file_name: &str) -> Place {
        let path = Path::new(file_name);
        let path = if path.is_absolute() { path.to_path_buf() } else { self.relative_to.join(path) };
        if let Some(root) = &self.generated_root
            && let Ok(rest) = path.strip_prefix(root)
        {
            return Place::Generated(slashes(rest));
        }
        // Without the build script's own word, a mounted tree is still recognisable.
        let text = path.to_string_lossy();
        if self.generated_root.is_none()
            && let Some((_, rest)) = text.split_once("/out/promptgen/")
        {
            return Place::Generated(rest.to_string());
        }
        if let Ok(rest) = path.strip_prefix(&self.package_dir) {
            let rest = slashes(rest);
            if codegen_core::sandbox::is_protected(&rest) {
                return Place::Hidden { shown: rest, why: "it is protected: it may hold secrets".into() };
            }
            if self.readable.iter().any(|r| rest == *r || rest.starts_with(&format!("{r}/"))) {
                return Place::Crate(rest);
            }
            return Place::Hidden { shown: rest, why: "it is not among the crate files the model may read".into() };
        }
        if is_public(&text) {
            return Place::Outside;
        }
        Place::Hidden { shown: path.display().to_string(), why: "it is outside the package".into() }
    }

    /// `text` with every mounted-tree path (`/…/out/promptgen/x.rs`) and package path
    /// (`/…/pkg/src/main.rs`) written as the model knows it.
    pub fn relativize(&self, text: &str) -> String {
        let mut text = text.to_string();
        if let Some(root) = &self.generated_root {
            text = text.replace(&format!("{}/", root.display()), "");
        }
        text.replace(&format!("{}/", self.package_dir.display()), "")
    }
}

/// The toolchain's and the dependencies' sources: public, fine to name.
fn is_public(path: &str) -> bool {
    path.contains("/.rustup/toolchains/")
        || path.contains("/rustlib/src/")
        || path.contains("/.cargo/registry/src/")
        || path.contains("/.cargo/git/checkouts/")
        || path.starts_with("/rustc/")
}

fn slashes(path: &Path) -> String {
    path.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/")
}

/// The path shown for a span: its place, or a word saying what kind of file it is.
fn shown(place: &Place) -> &str {
    match place {
        Place::Generated(path) | Place::Crate(path) => path,
        Place::Outside => "(a file outside the crate: a dependency or the standard library)",
        Place::Hidden { .. } => "(a file you may not read)",
    }
}

/// One diagnostic as rustc shows it, with the model's paths:
///
/// ```text
/// error[E0609]: no field `nmae` on type `User`
///  --> user_json.rs:3:22
///   |
/// 3 |     format!("{}", user.nmae)
///   |                        ^^^^ unknown field
///   = help: a field with a similar name exists
/// ```
pub(crate) fn render(diagnostic: &Diagnostic, map: &PathMap) -> String {
    let mut out = String::new();
    let code = diagnostic.code.as_ref().map(|c| format!("[{}]", c.code)).unwrap_or_default();
    // Even the message of an error in a file the model may not read can quote that file
    // (`expected item, found `API_KEY``): withhold it all.
    if let Some(Place::Hidden { shown, why }) =
        diagnostic.spans.iter().find(|s| s.is_primary).map(|s| map.place(&s.file_name))
    {
        return format!(
            "{}{code}: (withheld: this error points into `{shown}`, a file you may not read, because {why})\n",
            diagnostic.level
        );
    }
    out.push_str(&format!("{}{code}: {}\n", diagnostic.level, diagnostic.message));
    // Primary spans first, then the others that say something.
    let mut spans: Vec<&Span> = diagnostic.spans.iter().filter(|s| s.is_primary).collect();
    spans.extend(diagnostic.spans.iter().filter(|s| !s.is_primary && s.label.is_some()));
    for span in spans {
        render_span(span, map, &mut out);
    }
    for child in &diagnostic.children {
        let span = child.spans.iter().find(|s| s.is_primary);
        if span.is_some_and(|s| matches!(map.place(&s.file_name), Place::Hidden { .. })) {
            out.push_str(&format!("  = {}: (withheld: it points into a file you may not read)\n", child.level));
            continue;
        }
        let suggestion = span
            .and_then(|s| s.suggested_replacement.as_deref())
            .map(|text| format!(": `{}`", text.trim()))
            .unwrap_or_default();
        let at = span
            .map(|s| format!(" ({}:{}:{})", shown(&map.place(&s.file_name)), s.line_start, s.column_start))
            .unwrap_or_default();
        out.push_str(&format!("  = {}: {}{suggestion}{at}\n", child.level, child.message));
    }
    out
}

/// The compiler's errors a check blames on its step: rendered for the model, each once (with
/// several targets, one error comes once per target that compiles its file), with known
/// secrets withheld and the text trimmed; and the same errors as findings.
pub(crate) fn compiler_errors<'a>(
    errors: impl IntoIterator<Item = &'a Diagnostic>,
    map: &PathMap,
    redactor: &Redactor,
) -> Diagnostics {
    let mut seen = HashSet::new();
    let (mut text, mut found) = (Vec::new(), Vec::new());
    for diagnostic in errors {
        let rendered = render(diagnostic, map);
        if seen.insert(rendered.clone()) {
            text.push(rendered);
            found.push(finding(diagnostic, map, redactor));
        }
    }
    Diagnostics {
        text: trim_diagnostics(&redactor.withhold(&text.join("\n"))),
        findings: Findings { errors: found, failed_tests: Vec::new() },
    }
}

/// `diagnostic` as a finding: its code, its message (none when it is withheld), and where its
/// primary span is, by the path the model knows (none for a file outside the crate).
fn finding(diagnostic: &Diagnostic, map: &PathMap, redactor: &Redactor) -> Finding {
    let primary = diagnostic.spans.iter().find(|s| s.is_primary);
    let place = primary.map(|span| (map.place(&span.file_name), span));
    let withheld = matches!(place, Some((Place::Hidden { .. }, _)));
    let (file, line, column) = match place {
        Some((Place::Generated(path) | Place::Crate(path), span)) => {
            (Some(path), u32::try_from(span.line_start).ok(), u32::try_from(span.column_start).ok())
        }
        _ => (None, None, None),
    };
    Finding {
        code: diagnostic.code.as_ref().map(|c| c.code.clone()),
        message: if withheld { String::new() } else { redactor.withhold(&diagnostic.message) },
        file,
        line,
        column,
        withheld,
    }
}

fn render_span(span: &Span, map: &PathMap, out: &mut String) {
    let place = map.place(&span.file_name);
    if matches!(place, Place::Hidden { .. }) {
        out.push_str(" --> (a file you may not read)\n");
        return;
    }
    out.push_str(&format!(" --> {}:{}:{}\n", shown(&place), span.line_start, span.column_start));
    if place == Place::Outside {
        if let Some(label) = &span.label {
            out.push_str(&format!("  = {label}\n"));
        }
        return;
    }
    let width = (span.line_start + span.text.len()).to_string().len();
    let gutter = " ".repeat(width);
    out.push_str(&format!("{gutter} |\n"));
    let marker = if span.is_primary { '^' } else { '-' };
    let last = span.text.len().saturating_sub(1);
    for (index, line) in span.text.iter().enumerate() {
        out.push_str(&format!("{:>width$} | {}\n", span.line_start + index, line.text));
        let start = line.highlight_start.max(1) - 1;
        let length = line.highlight_end.saturating_sub(line.highlight_start).max(1);
        let label = if index == last { span.label.as_deref().unwrap_or("") } else { "" };
        let underline = format!("{}{}", " ".repeat(start), marker.to_string().repeat(length));
        out.push_str(format!("{gutter} | {underline} {label}").trim_end());
        out.push('\n');
    }
}

/// A test that failed, and what it printed (its panic message, the assertion's values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FailedTest {
    pub name: String,
    pub output: String,
}

/// The failing tests in the test harness's output: the names of the `test NAME ... FAILED`
/// lines, each with its `---- NAME stdout ----` section (without the backtrace hint).
pub(crate) fn failed_tests(lines: &[String]) -> Vec<FailedTest> {
    let mut failed: Vec<FailedTest> = Vec::new();
    for line in lines {
        if let Some(rest) = line.strip_prefix("test ")
            && let Some(name) = rest.strip_suffix(" ... FAILED")
        {
            failed.push(FailedTest { name: name.to_string(), output: String::new() });
        }
    }
    let mut current: Option<usize> = None;
    for line in lines {
        if let Some(name) = line.strip_prefix("---- ").and_then(|l| l.strip_suffix(" stdout ----")) {
            current = failed.iter().position(|t| t.name == name);
            continue;
        }
        if line == "failures:" || line.starts_with("test result:") {
            current = None;
            continue;
        }
        if let Some(index) = current
            && !line.starts_with("note: run with `RUST_BACKTRACE=1`")
        {
            let output = &mut failed[index].output;
            output.push_str(line);
            output.push('\n');
        }
    }
    for test in &mut failed {
        test.output = test.output.trim().to_string();
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> PathMap {
        PathMap {
            generated_root: Some(PathBuf::from("/t/debug/build/pkg-1/out/promptgen")),
            package_dir: PathBuf::from("/w/pkg"),
            relative_to: PathBuf::from("/w"),
            readable: vec!["src".into(), "tests".into(), "Cargo.toml".into()],
        }
    }

    #[test]
    fn paths_become_the_ones_the_model_knows() {
        let map = map();
        assert_eq!(
            map.place("/t/debug/build/pkg-1/out/promptgen/user_json.rs"),
            Place::Generated("user_json.rs".into())
        );
        assert_eq!(map.place("pkg/src/main.rs"), Place::Crate("src/main.rs".into()));
        assert_eq!(map.place("/w/pkg/tests/it.rs"), Place::Crate("tests/it.rs".into()));
        assert_eq!(map.place("/root/.cargo/registry/src/x/serde-1.0/src/de.rs"), Place::Outside);
        assert!(matches!(map.place("/w/pkg/target/debug/build/x/out/y.rs"), Place::Hidden { .. }));
        assert!(matches!(map.place("/w/pkg/.env"), Place::Hidden { .. }));
        assert!(matches!(map.place("/w/pkg/notes/plan.md"), Place::Hidden { .. }));
        assert!(matches!(map.place("/etc/passwd"), Place::Hidden { .. }));
        let fallback = PathMap { generated_root: None, ..map };
        assert_eq!(fallback.place("/t/debug/build/pkg-9/out/promptgen/a/b.rs"), Place::Generated("a/b.rs".into()));
    }

    #[test]
    fn a_diagnostic_is_shown_with_its_line_its_marker_and_its_help() {
        let error = serde_json::json!({"reason": "compiler-message", "package_id": "path+file:///w/pkg#0.1.0", "message": {
            "message": "no field `nmae` on type `User`", "code": {"code": "E0609", "explanation": null}, "level": "error",
            "spans": [{"file_name": "/t/debug/build/pkg-1/out/promptgen/user_json.rs", "line_start": 3, "line_end": 3,
              "column_start": 23, "column_end": 27, "is_primary": true, "label": "unknown field",
              "text": [{"text": "    format!(\"{}\", user.nmae)", "highlight_start": 23, "highlight_end": 27}]}],
            "children": [{"message": "a field with a similar name exists", "code": null, "level": "help", "children": [],
              "spans": [{"file_name": "/t/debug/build/pkg-1/out/promptgen/user_json.rs", "line_start": 3, "line_end": 3,
                "column_start": 23, "column_end": 27, "is_primary": true, "label": null, "text": [],
                "suggested_replacement": "name"}]}],
            "rendered": "..."}});
        let json = format!(
            "{error}\n{}\n{}\nrunning 1 test",
            r#"{"reason":"compiler-message","package_id":"path+file:///w/pkg#0.1.0","message":{"message":"aborting due to 1 previous error","code":null,"level":"error","spans":[],"children":[]}}"#,
            r#"{"reason":"build-script-executed","package_id":"path+file:///w/pkg#0.1.0","out_dir":"/t/debug/build/pkg-1/out","linked_libs":[]}"#,
        );
        let json = json.as_str();
        let output = read_cargo_output(json, Path::new("/w/pkg"));
        assert_eq!(output.errors.len(), 1, "the summary is not an error");
        assert_eq!(output.out_dir.as_deref(), Some(Path::new("/t/debug/build/pkg-1/out")));
        assert_eq!(output.other_lines, ["running 1 test"]);
        assert_eq!(
            render(&output.errors[0], &map()),
            "error[E0609]: no field `nmae` on type `User`\n --> user_json.rs:3:23\n  |\n3 |     format!(\"{}\", user.nmae)\n  |                       ^^^^ unknown field\n  = help: a field with a similar name exists: `name` (user_json.rs:3:23)\n"
        );
    }

    #[test]
    fn another_package_with_a_longer_path_is_not_ours() {
        let json = r#"{"reason":"build-script-executed","package_id":"path+file:///w/pkg-other#0.1.0","out_dir":"/elsewhere/out"}"#;
        assert_eq!(read_cargo_output(json, Path::new("/w/pkg")).out_dir, None);
    }

    #[test]
    fn failing_tests_are_named_with_what_they_printed() {
        let text = "running 2 tests\ntest tests::ok ... ok\ntest tests::greets ... FAILED\n\nfailures:\n\n---- tests::greets stdout ----\n\nthread 'tests::greets' panicked at src/main.rs:9:9:\nassertion `left == right` failed\n  left: \"Hi\"\n right: \"Hello\"\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n\n\nfailures:\n    tests::greets\n\ntest result: FAILED. 1 passed; 1 failed";
        let lines: Vec<String> = text.lines().map(String::from).collect();
        let failed = failed_tests(&lines);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].name, "tests::greets");
        assert_eq!(
            failed[0].output,
            "thread 'tests::greets' panicked at src/main.rs:9:9:\nassertion `left == right` failed\n  left: \"Hi\"\n right: \"Hello\""
        );
    }

    #[test]
    fn an_error_in_a_file_the_model_may_not_read_is_withheld_whole() {
        let secret = serde_json::json!({"message": "expected item, found `API_KEY`", "code": null, "level": "error",
            "spans": [{"file_name": "/w/pkg/.env", "line_start": 1, "column_start": 1, "is_primary": true,
              "label": "expected item", "text": [{"text": "API_KEY=sk-live-secret", "highlight_start": 1, "highlight_end": 8}]}],
            "children": []});
        let diagnostic: Diagnostic = serde_json::from_value(secret).unwrap();
        let shown = render(&diagnostic, &map());
        assert!(!shown.contains("API_KEY") && !shown.contains("sk-live"), "{shown}");
        assert!(shown.contains("withheld") && shown.contains("`.env`") && shown.contains("protected"), "{shown}");
        // An error in the crate whose note points at such a file keeps its own text, not the note's.
        let mixed = serde_json::json!({"message": "mismatched types", "code": {"code": "E0308"}, "level": "error",
            "spans": [{"file_name": "/t/debug/build/pkg-1/out/promptgen/a.rs", "line_start": 2, "column_start": 5,
              "is_primary": true, "label": "expected `u8`", "text": [{"text": "    include_str!(\"/etc/x\")", "highlight_start": 5, "highlight_end": 9}]},
              {"file_name": "/etc/x", "line_start": 1, "column_start": 1, "is_primary": false, "label": "the secret line",
              "text": [{"text": "root:secret", "highlight_start": 1, "highlight_end": 5}]}],
            "children": [{"message": "root:secret is here", "code": null, "level": "note", "children": [],
              "spans": [{"file_name": "/etc/x", "line_start": 1, "column_start": 1, "is_primary": true, "label": null, "text": []}]}]});
        let diagnostic: Diagnostic = serde_json::from_value(mixed).unwrap();
        let shown = render(&diagnostic, &map());
        assert!(
            shown.contains("a.rs:2:5") && !shown.contains("root:secret") && !shown.contains("the secret line"),
            "{shown}"
        );
        assert!(shown.contains("(a file you may not read)"), "{shown}");
    }
}
