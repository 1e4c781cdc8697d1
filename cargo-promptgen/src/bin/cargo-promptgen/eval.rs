//! `cargo promptgen eval`: runs trials (see the library's `eval` module), prints the table in
//! the format asked for, and exits 1 when a step × variant (model, protocol, constraint,
//! regenerate) falls below its threshold.

use std::fmt::Write as _;
use std::num::NonZeroU32;
use std::ops::RangeInclusive;
use std::process::ExitCode;
use std::time::Instant;

use cargo_promptgen::__private::eval::Row;
use cargo_promptgen::__private::eval::TrialRecord;
use cargo_promptgen::__private::eval::{self, Outcome, Pace, Report, Spec};
use cargo_promptgen::__private::{self as internals, Overrides, Regenerate};
use clap::{Args, ValueEnum};
use codegen_core::{Constrain, ToolProtocol};

use crate::live::Verbosity;
use crate::{Output, Package, Selection, interrupt, open};

/// `eval`.
#[derive(Args, Debug, Clone)]
pub struct EvalArgs {
    #[command(flatten)]
    selection: Selection,
    /// Evaluate only this step (repeatable; default: every step).
    #[arg(long = "step", value_name = "ID")]
    steps: Vec<String>,
    /// Evaluate with this model (repeatable, to compare models side by side; default: the
    /// configured one).
    #[arg(long = "model", value_name = "NAME")]
    models: Vec<String>,
    /// Evaluate in these tool-call protocols, comma-separated (repeatable; default: each
    /// step's configured one).
    #[arg(long = "protocol", value_name = "LIST", value_enum, value_delimiter = ',')]
    protocols: Vec<ProtocolArg>,
    /// Evaluate with constrained decoding on, off, or both to compare them (comma-separated,
    /// repeatable; default: each step's configured `constrain`).
    #[arg(long = "constrain", value_name = "LIST", value_enum, value_delimiter = ',')]
    constrain: Vec<ConstrainArg>,
    /// Start each trial by edit from the step's recorded outputs, from nothing (fresh), or
    /// both to compare them (comma-separated, repeatable; default: fresh).
    #[arg(long = "regenerate", value_name = "LIST", value_enum, value_delimiter = ',')]
    regenerate: Vec<RegenerateArg>,
    /// Trials per step and variant: seeds seed, seed+1, ... from the step's seed (0 if none).
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    seeds: u32,
    /// Run the whole chain fresh in each trial, instead of each step on the recorded output
    /// of the steps it runs after.
    #[arg(long, conflicts_with = "steps")]
    chain: bool,
    /// Sample at this temperature (0 to 2) instead of the configured one.
    #[arg(long, value_name = "T", value_parser = number_in(internals::TEMPERATURES, "a temperature"))]
    temperature: Option<f64>,
    /// Run up to N trials at once (beats PROMPTGEN_JOBS and `jobs`; default 1).
    #[arg(short = 'j', long, value_name = "N")]
    jobs: Option<NonZeroU32>,
    /// Model requests in flight at once (default: 1 for Ollama and for a server on this
    /// machine, else --jobs).
    #[arg(long, value_name = "N")]
    requests: Option<NonZeroU32>,
    /// k of pass^k, the chance that k trials all pass.
    #[arg(long, value_name = "K", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    k: u32,
    /// The pass rate every row (step × model, protocol, constraint, regenerate) must reach (beats
    /// `[package.metadata.promptgen.eval]`).
    #[arg(long, value_name = "RATE", value_parser = number_in(internals::PASS_RATES, "a pass rate"))]
    min_pass_rate: Option<f64>,
    /// How to print the results.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Resume an interrupted run (default: the package's latest): its finished trials are kept.
    #[arg(long, value_name = "RUN", num_args = 0..=1, default_missing_value = "", conflicts_with_all = ["replay", "steps", "models", "protocols", "constrain", "regenerate", "chain"])]
    resume: Option<String>,
    /// Judge the trials of RUN again with today's checks and tests, calling no model.
    #[arg(long, value_name = "RUN", conflicts_with_all = ["steps", "models", "protocols", "constrain", "regenerate", "chain"])]
    replay: Option<String>,
    /// Backend for this run (beats PROMPTGEN_BACKEND and the metadata).
    #[arg(long, value_name = "NAME")]
    backend: Option<String>,
    /// Server URL for this run (beats PROMPTGEN_BASE_URL and the metadata).
    #[arg(long, value_name = "URL")]
    base_url: Option<String>,
}

/// `--format`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A table for a terminal.
    Table,
    /// Markdown, e.g. for a pull-request comment.
    Md,
    /// `summary.json`'s content.
    Json,
    /// JUnit XML: a test suite per row (step × model, protocol, constraint, regenerate), a test
    /// case per trial.
    Junit,
}

/// `--protocol`: codegen-core's protocols, spelt as the configuration spells them.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProtocolArg {
    /// The server's own tool calls.
    Native,
    /// A JSON object per reply, described in the system prompt.
    Json,
    /// `@@@` commands in the reply's text.
    Blocks,
}

impl From<ProtocolArg> for ToolProtocol {
    fn from(protocol: ProtocolArg) -> ToolProtocol {
        match protocol {
            ProtocolArg::Native => ToolProtocol::Native,
            ProtocolArg::Json => ToolProtocol::Json,
            ProtocolArg::Blocks => ToolProtocol::Blocks,
        }
    }
}

/// `--constrain`: `on` asks the server to enforce the protocol wherever it can (`constrain =
/// "auto"`), `off` never does.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConstrainArg {
    /// Constrained decoding wherever the server can enforce the protocol.
    On,
    /// The model is only told the protocol.
    Off,
}

impl From<ConstrainArg> for Constrain {
    fn from(constrain: ConstrainArg) -> Constrain {
        match constrain {
            ConstrainArg::On => Constrain::Auto,
            ConstrainArg::Off => Constrain::Off,
        }
    }
}

/// `--regenerate`: how a trial starts, spelt as the manifest's `regenerate` spells it.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegenerateArg {
    /// From the step's recorded outputs, told why the step would run again, changing what that
    /// requires with edit_file.
    Edit,
    /// From nothing, every output written whole.
    Fresh,
}

impl From<RegenerateArg> for Regenerate {
    fn from(regenerate: RegenerateArg) -> Regenerate {
        match regenerate {
            RegenerateArg::Edit => Regenerate::Edit,
            RegenerateArg::Fresh => Regenerate::Fresh,
        }
    }
}

/// A parser of numbers in `range`, so that a value out of it is a usage error (exit 2) that
/// says what `what` must be.
fn number_in(range: RangeInclusive<f64>, what: &'static str) -> impl Fn(&str) -> Result<f64, String> + Clone {
    move |text| match text.parse::<f64>() {
        Ok(n) if range.contains(&n) => Ok(n),
        _ => {
            let (low, high) = (range.start(), range.end());
            Err(format!("{what} is a number from {low} to {high}, e.g. {}", (low + high) / 2.0))
        }
    }
}

pub fn eval(args: &EvalArgs, output: Output) -> anyhow::Result<ExitCode> {
    let overrides = Overrides {
        backend: args.backend.clone(),
        base_url: args.base_url.clone(),
        jobs: args.jobs,
        ..Overrides::default()
    };
    let Package { chain, layout } = open(&args.selection, &overrides)?;
    let quiet = output.verbosity() == Verbosity::Quiet;
    let pace = Pace {
        jobs: chain.jobs,
        requests: args.requests.map(|n| n.get() as usize),
        cancel: interrupt::on_ctrl_c_for("trials")?,
    };
    let started = Instant::now();
    // Known once the run begins (a resumed run varies what its plan says).
    let mut varies = Varies::default();
    let mut show = |report: Report| {
        if quiet {
            return;
        }
        match report {
            Report::Began { run, dir, trials, done, varies_decoding, varies_regenerate } => {
                varies = Varies { decoding: varies_decoding, regenerate: varies_regenerate };
                let resumed = if done > 0 { format!(", {done} done before") } else { String::new() };
                eprintln!(
                    "Evaluating {}: {trials} trials{resumed}; run `{run}` in {}",
                    chain.package_name,
                    dir.display()
                );
            }
            Report::Finished(trial) => eprintln!("  {}", describe_trial(&trial, varies)),
        }
    };
    let outcome = match (&args.replay, &args.resume) {
        (Some(run), _) => eval::replay(&chain, &layout, run, &pace, &mut show)?,
        (None, Some(run)) => {
            eval::resume(&chain, &layout, Some(run.as_str()).filter(|r| !r.is_empty()), &pace, &mut show)?
        }
        (None, None) => {
            let spec = Spec {
                steps: args.steps.clone(),
                models: args.models.clone(),
                protocols: args.protocols.iter().map(|&p| p.into()).collect(),
                constrain: args.constrain.iter().map(|&c| c.into()).collect(),
                regenerate: args.regenerate.iter().map(|&r| r.into()).collect(),
                seeds: args.seeds,
                chain: args.chain,
                temperature: args.temperature,
            };
            eval::start(&chain, &layout, &spec, &pace, &mut show)?
        }
    };
    let thresholds = &chain.eval;
    let min_pass_rate = |step: &str| args.min_pass_rate.or_else(|| thresholds.min_pass_rate_of(step));
    let rows = outcome.rows(args.k as usize, &min_pass_rate);
    outcome.run.write_summary(&outcome.summary(&rows))?;
    let text = match args.format {
        Format::Table => table(&rows),
        Format::Md => markdown(&outcome, &rows),
        Format::Json => format!("{:#}\n", outcome.summary(&rows)),
        Format::Junit => junit(&outcome, &rows),
    };
    print!("{text}");
    let (calls, tokens) = outcome.spent();
    let replayed =
        outcome.plan.replay_of.as_ref().map(|r| format!(" (judged again from run `{r}`: no model was called)"));
    if !quiet {
        for warning in &outcome.warnings {
            eprintln!("warning: {warning}");
        }
        eprintln!(
            "{} trials in {:.1}s: {calls} model calls, {tokens} tokens{}. Records: {}",
            outcome.trials.len(),
            started.elapsed().as_secs_f64(),
            replayed.unwrap_or_default(),
            outcome.run.dir.display()
        );
    }
    if outcome.left > 0 {
        eprintln!(
            "interrupted: {} trials were not run; `cargo promptgen eval --resume {} -p {}` runs them",
            outcome.left, outcome.run.name, chain.package_name
        );
        return Ok(ExitCode::from(130));
    }
    let below: Vec<&Row> = rows.iter().filter(|r| !r.meets_threshold()).collect();
    for row in &below {
        eprintln!(
            "error: step {} with {} passed {} of {} trials ({}), below its min_pass_rate of {}",
            row.step,
            with_what(row),
            row.passed,
            row.trials,
            percent(row.pass_at_1),
            percent(row.min_pass_rate.unwrap_or_default())
        );
    }
    Ok(if below.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn percent(rate: f64) -> String {
    format!("{:.0}%", rate * 100.0)
}

/// ``model `m` `` for a row of a run that compares models only, else ``model `m` · json ·
/// constrained`` (and ` · by edit` or ` · fresh`).
fn with_what(row: &Row) -> String {
    let rest = row.variant.strip_prefix(row.model.as_str()).unwrap_or_default();
    format!("model `{}`{rest}", row.model)
}

/// What a run compares besides models, so that a trial's line names the trial's.
#[derive(Debug, Clone, Copy, Default)]
struct Varies {
    /// Protocols or constraints.
    decoding: bool,
    /// Trials by edit and from nothing.
    regenerate: bool,
}

/// A trial's line as it finishes, naming what the run compares (`varies`).
fn describe_trial(trial: &TrialRecord, varies: Varies) -> String {
    let mut variant = if varies.decoding {
        // What was asked for, as the rows name it: whether the server enforced it is the record's.
        let constraint = if trial.constrain == Constrain::Off { "unconstrained" } else { "constrained" };
        format!("{} · {} · {constraint}", trial.model, trial.protocol)
    } else {
        trial.model.clone()
    };
    let mut diff = String::new();
    if varies.regenerate {
        variant.push_str(match trial.regenerate {
            Regenerate::Edit if trial.made_from.is_empty() => " · by edit (nothing recorded: from nothing)",
            Regenerate::Edit => " · by edit",
            Regenerate::Fresh => " · fresh",
        });
        if let Some(lines) = trial.diff_lines {
            diff = format!(", diff {lines} lines");
        }
    }
    if trial.skipped {
        return format!("{} · {variant} · seed {}: skipped (a step it runs after failed)", trial.step, trial.seed);
    }
    let verdict = if trial.passed { "passed".to_string() } else { format!("failed: {}", trial.classes.join(", ")) };
    format!(
        "{} · {variant} · seed {}: {verdict} ({} calls, {} tokens, {:.1}s{diff})",
        trial.step,
        trial.seed,
        trial.model_calls,
        trial.prompt_tokens + trial.completion_tokens,
        trial.wall_ms as f64 / 1000.0
    )
}

const HEADER: [&str; 15] = [
    "step",
    "model",
    "trials",
    "check",
    "tests",
    "pass@1",
    "95% CI",
    "pass^k",
    "distinct",
    "runnable",
    "calls",
    "tokens",
    "generated",
    "diff lines",
    "wall p50/p95",
];

/// A mean as the table shows it: whole when it is, else to one decimal.
fn mean_cell(mean: f64) -> String {
    if mean.fract() == 0.0 { format!("{mean:.0}") } else { format!("{mean:.1}") }
}

fn cells(row: &Row) -> [String; 15] {
    let of = |n: usize| format!("{n}/{}", row.trials);
    [
        row.step.clone(),
        row.variant.clone(),
        if row.skipped > 0 { format!("{} (+{} skipped)", row.trials, row.skipped) } else { row.trials.to_string() },
        of(row.passed_check),
        row.passed_tests.map_or_else(|| "-".into(), of),
        percent(row.pass_at_1),
        format!("{}–{}", percent(row.interval.0), percent(row.interval.1)),
        row.pass_hat_k.map_or_else(|| format!("- (k={})", row.k), |p| format!("{p:.2} (k={})", row.k)),
        row.distinct_outputs.to_string(),
        format!("{}/{}", row.runnable_replies, row.replies),
        row.median_calls.to_string(),
        row.median_tokens.to_string(),
        mean_cell(row.mean_generated_tokens),
        row.mean_diff_lines.map_or_else(|| "-".into(), mean_cell),
        format!("{:.1}s/{:.1}s", row.wall_ms_p50 as f64 / 1000.0, row.wall_ms_p95 as f64 / 1000.0),
    ]
}

fn threshold_note(row: &Row) -> Option<String> {
    let min = row.min_pass_rate?;
    let verdict = if row.meets_threshold() { "meets" } else { "BELOW" };
    Some(format!(
        "{} · {}: pass@1 {} {verdict} min_pass_rate {}",
        row.step,
        row.variant,
        percent(row.pass_at_1),
        percent(min)
    ))
}

fn failures_of(row: &Row) -> Option<String> {
    if row.failures.is_empty() {
        return None;
    }
    let top: Vec<String> = row.failures.iter().take(5).map(|(class, n)| format!("{class} ({n})")).collect();
    let more = row.failures.len().saturating_sub(5);
    let more = if more > 0 { format!(", and {more} more") } else { String::new() };
    Some(format!("{} · {}: {}{more}", row.step, row.variant, top.join(", ")))
}

fn table(rows: &[Row]) -> String {
    let cells: Vec<[String; 15]> = rows.iter().map(cells).collect();
    let mut widths = HEADER.map(|h| h.chars().count());
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |row: &[String]| {
        let padded: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c}{}", " ".repeat(w.saturating_sub(c.chars().count()))))
            .collect();
        padded.join("  ").trim_end().to_string()
    };
    let mut out = String::new();
    let _ = writeln!(out, "{}", line(&HEADER.map(String::from)));
    for row in &cells {
        let _ = writeln!(out, "{}", line(row));
    }
    let failures: Vec<String> = rows.iter().filter_map(failures_of).collect();
    if !failures.is_empty() {
        let _ = writeln!(out, "\nMost common failures (trials):");
        for failure in failures {
            let _ = writeln!(out, "  {failure}");
        }
    }
    let notes: Vec<String> = rows.iter().filter_map(threshold_note).collect();
    if !notes.is_empty() {
        let _ = writeln!(out, "\nThresholds:");
        for note in notes {
            let _ = writeln!(out, "  {note}");
        }
    }
    out
}

fn markdown(outcome: &Outcome, rows: &[Row]) -> String {
    let mut out = String::new();
    let plan = &outcome.plan;
    let what =
        if plan.chain { "whole chain per trial" } else { "each step on the recorded output of the steps before it" };
    let _ = writeln!(
        out,
        "### promptgen eval: `{}`\n\n{} seeds per step and model, {what}; run `{}`.\n",
        plan.package, plan.seeds, outcome.run.name
    );
    let _ = writeln!(out, "| {} |", HEADER.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(HEADER.len()));
    for row in rows {
        let mut cells = cells(row);
        if !row.meets_threshold() {
            cells[5] = format!("**{}** ❌", cells[5]);
        }
        let cells: Vec<String> = cells.iter().map(|c| c.replace('|', "\\|")).collect();
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    let failures: Vec<String> = rows.iter().filter_map(failures_of).collect();
    if !failures.is_empty() {
        let _ = writeln!(out, "\n**Most common failures** (trials):\n");
        for failure in failures {
            let _ = writeln!(out, "- {}", failure.replace('|', "\\|"));
        }
    }
    let notes: Vec<String> = rows.iter().filter_map(threshold_note).collect();
    if !notes.is_empty() {
        let _ = writeln!(out, "\n**Thresholds**\n");
        for note in notes {
            let _ = writeln!(out, "- {note}");
        }
    }
    for warning in &outcome.warnings {
        let _ = writeln!(out, "\n> ⚠️ {warning}");
    }
    let (calls, tokens) = outcome.spent();
    let _ = writeln!(out, "\nSpent: {calls} model calls, {tokens} tokens.");
    out
}

fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // XML 1.0 has no place for other control characters.
            c if c.is_control() && !matches!(c, '\n' | '\t' | '\r') => {}
            c => out.push(c),
        }
    }
    out
}

fn junit(outcome: &Outcome, rows: &[Row]) -> String {
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let total: usize = rows.iter().map(|r| r.trials).sum();
    let failed: usize = rows.iter().map(|r| r.trials - r.passed).sum();
    let _ = writeln!(
        out,
        "<testsuites name=\"promptgen eval {}\" tests=\"{total}\" failures=\"{failed}\">",
        xml(&outcome.plan.package)
    );
    for row in rows.iter().filter(|r| r.step != "chain") {
        let trials: Vec<&TrialRecord> = outcome.trials.iter().filter(|t| row.holds(t) && !t.skipped).collect();
        let threshold_case = usize::from(row.min_pass_rate.is_some());
        let threshold_failed = usize::from(!row.meets_threshold());
        let _ = writeln!(
            out,
            "  <testsuite name=\"step {} · {}\" tests=\"{}\" failures=\"{}\">",
            xml(&row.step),
            xml(&row.variant),
            trials.len() + threshold_case,
            row.trials - row.passed + threshold_failed
        );
        // JUnit has no place for a row's numbers but a suite's properties.
        let diff = row.mean_diff_lines.map_or_else(|| "-".into(), mean_cell);
        let _ = writeln!(
            out,
            "    <properties><property name=\"runnable\" value=\"{}/{}\"/><property name=\"generated\" \
             value=\"{}\"/><property name=\"diff lines\" value=\"{diff}\"/></properties>",
            row.runnable_replies,
            row.replies,
            mean_cell(row.mean_generated_tokens)
        );
        for trial in trials {
            let _ = write!(
                out,
                "    <testcase classname=\"step {}.{}\" name=\"seed {}\" time=\"{:.3}\"",
                xml(&row.step),
                xml(&row.variant),
                trial.seed,
                trial.wall_ms as f64 / 1000.0
            );
            if trial.passed {
                let _ = writeln!(out, "/>");
                continue;
            }
            let detail = trial.error.clone().unwrap_or_else(|| trial.classes.join("\n"));
            let _ = writeln!(
                out,
                ">\n      <failure message=\"{}\">{}</failure>\n    </testcase>",
                xml(&trial.classes.join(", ")),
                xml(&detail)
            );
        }
        if let Some(min) = row.min_pass_rate {
            let _ = write!(
                out,
                "    <testcase classname=\"step {}.{}\" name=\"min_pass_rate\"",
                xml(&row.step),
                xml(&row.variant)
            );
            if row.meets_threshold() {
                let _ = writeln!(out, "/>");
            } else {
                let _ = writeln!(
                    out,
                    ">\n      <failure message=\"pass@1 {} is below min_pass_rate {}\"/>\n    </testcase>",
                    percent(row.pass_at_1),
                    percent(min)
                );
            }
        }
        let _ = writeln!(out, "  </testsuite>");
    }
    let _ = writeln!(out, "</testsuites>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use cargo_promptgen::__private::eval::Verdict;

    #[test]
    fn xml_escapes_markup_and_drops_control_characters() {
        assert_eq!(xml("a<b & \"c\"\u{1b}[0m"), "a&lt;b &amp; &quot;c&quot;[0m");
    }

    #[test]
    fn a_verdict_is_shown_per_trial() {
        let mut trial = TrialRecord {
            trial: "01.m0.s7".into(),
            step: "01".into(),
            model: "m".into(),
            protocol: "blocks".into(),
            constrain: Constrain::Off,
            regenerate: Regenerate::Fresh,
            made_from: Vec::new(),
            diff_lines: Some(4),
            constrained: false,
            replies: 3,
            runnable_replies: 2,
            seed: 7,
            temperature: None,
            passed: false,
            skipped: false,
            check: Verdict::Failed,
            tests: None,
            classes: vec!["compiler error E0308".into()],
            error: None,
            finish_asked: true,
            model_calls: 3,
            prompt_tokens: 10,
            completion_tokens: 5,
            wall_ms: 1500,
            transcript: None,
            output_hash: None,
            files: Vec::new(),
        };
        let only_models = Varies::default();
        assert_eq!(
            describe_trial(&trial, only_models),
            "01 · m · seed 7: failed: compiler error E0308 (3 calls, 15 tokens, 1.5s)"
        );
        // A run that compares protocols or constraints names the trial's.
        assert_eq!(
            describe_trial(&trial, Varies { decoding: true, regenerate: false }),
            "01 · m · blocks · unconstrained · seed 7: failed: compiler error E0308 (3 calls, 15 tokens, 1.5s)"
        );
        // One that compares ways of starting says how it started, and its diff.
        let by_edit = Varies { decoding: false, regenerate: true };
        assert_eq!(
            describe_trial(&trial, by_edit),
            "01 · m · fresh · seed 7: failed: compiler error E0308 (3 calls, 15 tokens, 1.5s, diff 4 lines)"
        );
        trial.regenerate = Regenerate::Edit;
        assert!(
            describe_trial(&trial, by_edit).starts_with("01 · m · by edit (nothing recorded: from nothing) · seed 7:"),
            "an edit of nothing says so"
        );
        trial.made_from = vec![cargo_promptgen::__private::LockedFile { path: "a.rs".into(), sha256: "0".repeat(64) }];
        assert!(describe_trial(&trial, by_edit).starts_with("01 · m · by edit · seed 7:"));
    }
}
