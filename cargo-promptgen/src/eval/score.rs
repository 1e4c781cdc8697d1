//! Scoring trials: what each trial's end says (check, tests, failure classes), how far its
//! files are from the recorded ones, and the statistics of a row of trials (pass@1 with its
//! Wilson interval, pass^k, means, medians and percentiles). Pure functions: nothing here
//! runs anything.

use std::collections::{BTreeMap, BTreeSet};

use codegen_core::backend::BackendError;
use codegen_core::check::Findings;
use codegen_core::transcript::{Event, Transcript};
use codegen_core::{Constrain, ToolProtocol};
use serde::{Deserialize, Serialize};

use super::record::{TrialRecord, Variant, Verdict, ran_with};
use crate::config::Regenerate;
use crate::files::Files;

/// What a trial's end says, as the row statistics need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scored {
    /// The crate (or other) check: for `cargo test`, that every target compiles.
    pub check: Verdict,
    /// The crate's tests, for steps whose check is `cargo test`; `None` for other checks.
    pub tests: Option<Verdict>,
    /// Why it failed, one entry per kind of reason (see [`classify`]); empty when it passed.
    pub classes: Vec<String>,
}

/// The failure classes that a failed check's findings show: each failing test by name, else
/// each compiler error code (`compiler error (no code)` for an error without one that the
/// model was shown), else `check failed` (a check whose output is free text).
pub fn diagnostic_classes(findings: &Findings) -> Vec<String> {
    if !findings.failed_tests.is_empty() {
        return findings.failed_tests.iter().map(|name| format!("failing test `{name}`")).collect();
    }
    let codes: BTreeSet<String> = findings
        .errors
        .iter()
        .filter_map(|error| match &error.code {
            Some(code) => Some(format!("compiler error {code}")),
            None if !error.withheld => Some("compiler error (no code)".into()),
            None => None,
        })
        .collect();
    if codes.is_empty() { vec!["check failed".into()] } else { codes.into_iter().collect() }
}

/// The check and tests verdicts that the findings of a failed check imply: tests failed
/// only where the crate compiled.
fn verdicts_of_failure(findings: &Findings, with_tests: bool) -> (Verdict, Option<Verdict>) {
    match (with_tests, !findings.failed_tests.is_empty()) {
        (true, true) => (Verdict::Passed, Some(Verdict::Failed)),
        (true, false) => (Verdict::Failed, Some(Verdict::NotRun)),
        (false, _) => (Verdict::Failed, None),
    }
}

/// A trial whose loop ended with the step done: its check passed (in part when put off, in
/// which case tests did not run).
pub fn passed(transcript: &Transcript, with_tests: bool) -> Scored {
    let put_off = transcript.events.iter().rev().find_map(|e| match e {
        Event::Check { asked_by_model: false, put_off, .. } => Some(put_off.is_some()),
        _ => None,
    });
    let tests = with_tests.then_some(if put_off == Some(true) { Verdict::NotRun } else { Verdict::Passed });
    let classes = if tests == Some(Verdict::NotRun) { vec!["tests put off".to_string()] } else { Vec::new() };
    Scored { check: Verdict::Passed, tests, classes }
}

/// What a check's own outcome says, when a trial is judged again on its files (`--replay`):
/// `failed` holds the findings of a check that failed.
pub fn rechecked(failed: Option<&Findings>, put_off: bool, with_tests: bool) -> Scored {
    match failed {
        None => {
            let tests = with_tests.then_some(if put_off { Verdict::NotRun } else { Verdict::Passed });
            let classes = if put_off && with_tests { vec!["tests put off".to_string()] } else { Vec::new() };
            Scored { check: Verdict::Passed, tests, classes }
        }
        Some(findings) => {
            let (check, tests) = verdicts_of_failure(findings, with_tests);
            Scored { check, tests, classes: diagnostic_classes(findings) }
        }
    }
}

/// A trial whose loop failed: its classes, and how far its files got.
///
/// - The server: `timeout` (no reply, or a stalled one, within the limits), `no server`
///   (nothing answers at its address), `context overflow`, `reply too large` (it ignored the
///   output cap), else `server error`.
/// - The check never passed: the compiler error codes and failing tests of its last run.
/// - The budget ran out without a failed check: `broken tool calls` when at least half of the
///   model calls were answered with a repair about the call itself (bad JSON, an unknown tool,
///   a refused path), `no finish` when the model last replied without calling a tool, else
///   `budget spent`.
pub fn classify(error: &codegen_core::Error, transcript: &Transcript, with_tests: bool) -> Scored {
    // The last check's findings when it failed (`Some(None)` when it passed).
    let last_check = transcript.events.iter().rev().find_map(|e| match e {
        Event::Check { diagnostics, findings, .. } => Some(diagnostics.as_ref().map(|_| findings)),
        _ => None,
    });
    let (check, tests) = match last_check {
        Some(Some(findings)) => verdicts_of_failure(findings, with_tests),
        // A check passed, and then the run failed (a server error on the next call, say).
        Some(None) => (Verdict::Passed, with_tests.then_some(Verdict::Passed)),
        None => (Verdict::NotRun, with_tests.then_some(Verdict::NotRun)),
    };
    let classes = match error {
        // Apart, because the fixes differ: a slow model wants a longer limit, a dead server a start.
        codegen_core::Error::Backend(BackendError::Timeout { .. } | BackendError::Stalled { .. }) => {
            vec!["timeout".to_string()]
        }
        codegen_core::Error::Backend(BackendError::Unreachable { .. }) => vec!["no server".to_string()],
        codegen_core::Error::Backend(BackendError::ContextOverflow { .. }) => vec!["context overflow".to_string()],
        codegen_core::Error::Backend(BackendError::ReplyTooLarge { .. }) => vec!["reply too large".to_string()],
        codegen_core::Error::Backend(_) => vec!["server error".to_string()],
        codegen_core::Error::CheckFailed { diagnostics, .. } => diagnostic_classes(&diagnostics.findings),
        codegen_core::Error::CheckCouldNotRun(_) => vec!["check could not run".to_string()],
        codegen_core::Error::BudgetExhausted { .. } => match last_check {
            Some(Some(findings)) => diagnostic_classes(findings),
            _ => vec![budget_class(transcript).to_string()],
        },
        codegen_core::Error::Interrupted { .. } => vec!["interrupted".to_string()],
        _ => vec!["other".to_string()],
    };
    Scored { check, tests, classes }
}

/// Repairs the loop gives about the course of the work rather than a broken call.
const WORK_REPAIRS: [&str; 3] =
    ["You replied without calling a tool", "You stopped without calling", "`finish` refused"];

fn budget_class(transcript: &Transcript) -> &'static str {
    let mut calls = 0u32;
    let mut broken_calls = BTreeSet::new();
    let mut last_repair = None;
    for event in &transcript.events {
        match event {
            Event::ModelCall { .. } => calls += 1,
            Event::Repair { model_call, problem } => {
                if !WORK_REPAIRS.iter().any(|prefix| problem.starts_with(prefix)) {
                    broken_calls.insert(*model_call);
                }
                last_repair = Some(problem.as_str());
            }
            _ => {}
        }
    }
    if !broken_calls.is_empty() && broken_calls.len() * 2 >= calls as usize {
        "broken tool calls"
    } else if last_repair.is_some_and(|p| p.starts_with(WORK_REPAIRS[0])) {
        "no finish"
    } else {
        "budget spent"
    }
}

/// The size of the diff from `recorded` to `ended`: lines added plus lines removed, file by
/// file over the paths of both (a file only in one of them counts all its lines). Bytes that
/// are not UTF-8 are read lossily: a line that differs still differs.
pub fn diff_lines(recorded: &Files, ended: &Files) -> u64 {
    let paths: BTreeSet<&String> = recorded.keys().chain(ended.keys()).collect();
    let mut changed = 0u64;
    for path in paths {
        let text = |files: &Files| String::from_utf8_lossy(files.get(path).map_or(&[][..], Vec::as_slice)).into_owned();
        let (before, after) = (text(recorded), text(ended));
        if before == after {
            continue;
        }
        let diff = similar::TextDiff::from_lines(&before, &after);
        changed += diff.iter_all_changes().filter(|change| change.tag() != similar::ChangeTag::Equal).count() as u64;
    }
    changed
}

/// The arithmetic mean, `None` of nothing.
pub fn mean(values: &[u64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<u64>() as f64 / values.len() as f64)
}

/// The 95 % Wilson score interval of `passed` successes in `trials`: unlike the plain
/// p ± 1.96·sqrt(p(1-p)/n), it stays within [0, 1] and is not empty at 0 or n successes,
/// which is where small evaluations live.
pub fn wilson(passed: usize, trials: usize) -> (f64, f64) {
    if trials == 0 {
        return (0.0, 1.0);
    }
    const Z: f64 = 1.959_963_984_540_054;
    let n = trials as f64;
    let p = passed as f64 / n;
    let z2 = Z * Z;
    let denominator = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denominator;
    let half = Z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denominator;
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// pass^k: the chance that `k` trials drawn without replacement from these all pass,
/// C(passed, k) / C(trials, k) (τ-bench's estimator). `None` when there are fewer than `k`
/// trials.
pub fn pass_hat_k(passed: usize, trials: usize, k: usize) -> Option<f64> {
    if k == 0 || trials < k {
        return None;
    }
    let mut chance = 1.0;
    for i in 0..k {
        chance *= passed.saturating_sub(i) as f64 / (trials - i) as f64;
    }
    Some(chance)
}

/// The `p`-th percentile (0 < p ≤ 1) by nearest rank: a value that occurred.
pub fn percentile<T: Copy + Ord>(values: &[T], p: f64) -> Option<T> {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied()
}

/// One step × variant (or the whole chain × variant) over its trials.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The step's id, or `chain` for the chain as a whole (`--chain`).
    pub step: String,
    /// The model.
    pub model: String,
    /// How the table names the row's variant: the model, and where the run varies them the
    /// protocol and the constraint (`qwen · json · constrained`); see [`Variant::label`].
    pub variant: String,
    /// The protocol of the row's trials, where the run varies it (`--protocol`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<ToolProtocol>,
    /// Whether the row's trials asked for constrained decoding, where the run varies it
    /// (`--constrain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constrain: Option<Constrain>,
    /// How the row's trials started (`edit` or `fresh`), where the run varies it
    /// (`--regenerate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regenerate: Option<Regenerate>,
    /// Trials that ran (skipped ones excluded).
    pub trials: usize,
    /// Trials whose files passed the check (for `cargo test`: compiled).
    pub passed_check: usize,
    /// Trials whose files passed the crate's tests; `None` when the check runs no tests.
    pub passed_tests: Option<usize>,
    /// Trials that passed: the step finished with its check (tests included) passing.
    pub passed: usize,
    /// `passed / trials`.
    pub pass_at_1: f64,
    /// The 95 % Wilson interval of `pass_at_1`.
    pub interval: (f64, f64),
    /// `k` of `pass_hat_k`.
    pub k: usize,
    /// The chance that `k` trials all pass; `None` with fewer than `k` trials.
    pub pass_hat_k: Option<f64>,
    /// Distinct outputs among the trials that wrote files, by the hash of their files.
    pub distinct_outputs: usize,
    /// The model's replies over the row's trials.
    #[serde(default)]
    pub replies: u64,
    /// Those replies that were exactly one tool call the loop could run: what constrained
    /// decoding is meant to make all of them.
    #[serde(default)]
    pub runnable_replies: u64,
    /// Median model calls per trial.
    pub median_calls: u32,
    /// Median tokens per trial (prompt + completion).
    pub median_tokens: u64,
    /// Tokens the model generated (completion tokens, as the server counted them), per trial
    /// on average: what a re-run by edit is meant to save.
    #[serde(default)]
    pub mean_generated_tokens: f64,
    /// The diff from the step's recorded outputs to each passing trial's (lines added plus
    /// removed), on average: what a reviewer would read had the trial been recorded. `None`
    /// when no trial passed (or the trials, of runs made before it, did not record it).
    #[serde(default)]
    pub mean_diff_lines: Option<f64>,
    /// Wall time per trial, median and 95th percentile, in milliseconds.
    pub wall_ms_p50: u64,
    /// See `wall_ms_p50`.
    pub wall_ms_p95: u64,
    /// Trials skipped because a step they run after failed in the same chain trial.
    pub skipped: usize,
    /// Failure classes and the number of trials that showed each, most common first.
    pub failures: Vec<(String, usize)>,
    /// The pass rate this row must reach, if one is set.
    pub min_pass_rate: Option<f64>,
}

impl Row {
    /// Whether the row reaches its threshold (always, without one).
    pub fn meets_threshold(&self) -> bool {
        self.min_pass_rate.is_none_or(|min| self.trials > 0 && self.pass_at_1 + 1e-9 >= min)
    }

    /// Whether `trial` is one of the row's (skipped or not): of its step, with its variant.
    pub fn holds(&self, trial: &TrialRecord) -> bool {
        trial.step == self.step && ran_with(trial, &self.model, self.protocol, self.constrain, self.regenerate)
    }
}

/// The rows of `trials`, one per step × variant in the order given, with `k` for pass^k and
/// the thresholds `min_pass_rate` gives per step.
pub fn rows(
    trials: &[TrialRecord],
    steps: &[String],
    variants: &[Variant],
    k: usize,
    min_pass_rate: &dyn Fn(&str) -> Option<f64>,
) -> Vec<Row> {
    let mut rows = Vec::new();
    for step in steps {
        for variant in variants {
            let of_row: Vec<&TrialRecord> = trials.iter().filter(|t| &t.step == step && variant.holds(t)).collect();
            rows.push(row(step, variant, &of_row, k, min_pass_rate(step)));
        }
    }
    rows
}

fn row(step: &str, variant: &Variant, trials: &[&TrialRecord], k: usize, min_pass_rate: Option<f64>) -> Row {
    let skipped = trials.iter().filter(|t| t.skipped).count();
    let ran: Vec<&TrialRecord> = trials.iter().copied().filter(|t| !t.skipped).collect();
    let n = ran.len();
    let passed = ran.iter().filter(|t| t.passed).count();
    let with_tests = ran.iter().any(|t| t.tests.is_some());
    let mut failures: BTreeMap<&str, usize> = BTreeMap::new();
    for trial in &ran {
        for class in trial.classes.iter().collect::<BTreeSet<_>>() {
            *failures.entry(class).or_default() += 1;
        }
    }
    let mut failures: Vec<(String, usize)> = failures.into_iter().map(|(c, n)| (c.to_string(), n)).collect();
    failures.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let outputs: BTreeSet<&str> = ran.iter().filter_map(|t| t.output_hash.as_deref()).collect();
    let calls: Vec<u32> = ran.iter().map(|t| t.model_calls).collect();
    let tokens: Vec<u64> = ran.iter().map(|t| t.prompt_tokens + t.completion_tokens).collect();
    let wall: Vec<u64> = ran.iter().map(|t| t.wall_ms).collect();
    let generated: Vec<u64> = ran.iter().map(|t| t.completion_tokens).collect();
    // Only a passing trial would have been recorded, so only its diff is one a reviewer reads;
    // a failed one, stopped half-way or never started, would only blur it.
    let diffs: Vec<u64> = ran.iter().filter(|t| t.passed).filter_map(|t| t.diff_lines).collect();
    Row {
        step: step.to_string(),
        model: variant.model.clone(),
        variant: variant.label(trials),
        protocol: variant.protocol,
        constrain: variant.constrain,
        regenerate: variant.regenerate,
        trials: n,
        passed_check: ran.iter().filter(|t| t.check == Verdict::Passed).count(),
        passed_tests: with_tests.then(|| ran.iter().filter(|t| t.tests == Some(Verdict::Passed)).count()),
        passed,
        pass_at_1: if n == 0 { 0.0 } else { passed as f64 / n as f64 },
        interval: wilson(passed, n),
        k,
        pass_hat_k: pass_hat_k(passed, n, k),
        distinct_outputs: outputs.len(),
        replies: ran.iter().map(|t| u64::from(t.replies)).sum(),
        runnable_replies: ran.iter().map(|t| u64::from(t.runnable_replies)).sum(),
        median_calls: percentile(&calls, 0.5).unwrap_or(0),
        median_tokens: percentile(&tokens, 0.5).unwrap_or(0),
        mean_generated_tokens: mean(&generated).unwrap_or(0.0),
        mean_diff_lines: mean(&diffs),
        wall_ms_p50: percentile(&wall, 0.5).unwrap_or(0),
        wall_ms_p95: percentile(&wall, 0.95).unwrap_or(0),
        skipped,
        failures,
        min_pass_rate,
    }
}

#[cfg(test)]
mod tests {
    use codegen_core::check::Finding;

    use super::*;

    #[test]
    fn wilson_matches_known_values() {
        // Reference values (Wilson 1927; e.g. Newcombe 1998, table I: 81/263 -> 0.2553..0.3662).
        let (low, high) = wilson(81, 263);
        assert!((low - 0.2553).abs() < 1e-3 && (high - 0.3662).abs() < 1e-3, "{low} {high}");
        let (low, high) = wilson(0, 5);
        assert_eq!(low, 0.0);
        assert!((high - 0.4345).abs() < 1e-3, "{high}");
        let (low, high) = wilson(5, 5);
        assert!((low - 0.5655).abs() < 1e-3 && high == 1.0, "{low} {high}");
        assert_eq!(wilson(0, 0), (0.0, 1.0));
    }

    #[test]
    fn pass_hat_k_is_the_chance_that_k_draws_all_pass() {
        assert_eq!(pass_hat_k(3, 5, 1), Some(0.6));
        // C(3,2)/C(5,2) = 3/10.
        assert!((pass_hat_k(3, 5, 2).unwrap() - 0.3).abs() < 1e-12);
        assert_eq!(pass_hat_k(5, 5, 5), Some(1.0));
        assert_eq!(pass_hat_k(4, 5, 5), Some(0.0));
        assert_eq!(pass_hat_k(1, 2, 3), None);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        assert_eq!(percentile(&[5u64, 1, 3, 2, 4], 0.5), Some(3));
        assert_eq!(percentile(&[1u64, 2, 3, 4], 0.5), Some(2));
        assert_eq!(percentile(&(1..=20u64).collect::<Vec<_>>(), 0.95), Some(19));
        assert_eq!(percentile::<u64>(&[], 0.5), None);
    }

    #[test]
    fn diagnostics_become_codes_and_test_names() {
        let error = |code: Option<&str>, withheld: bool| Finding {
            code: code.map(String::from),
            message: if withheld { String::new() } else { "mismatched types".into() },
            withheld,
            ..Finding::default()
        };
        let compile = Findings {
            errors: vec![error(Some("E0308"), false), error(Some("E0425"), false), error(Some("E0308"), false)],
            failed_tests: Vec::new(),
        };
        assert_eq!(diagnostic_classes(&compile), ["compiler error E0308", "compiler error E0425"]);
        let tests = Findings { errors: Vec::new(), failed_tests: vec!["tests::a".into(), "tests::b".into()] };
        assert_eq!(diagnostic_classes(&tests), ["failing test `tests::a`", "failing test `tests::b`"]);
        assert_eq!(verdicts_of_failure(&tests, true), (Verdict::Passed, Some(Verdict::Failed)));
        assert_eq!(verdicts_of_failure(&compile, true), (Verdict::Failed, Some(Verdict::NotRun)));
        // A command check's output is free text: nothing is known as data.
        assert_eq!(diagnostic_classes(&Findings::default()), ["check failed"]);
        let uncoded = Findings { errors: vec![error(None, false), error(None, true)], failed_tests: Vec::new() };
        assert_eq!(
            diagnostic_classes(&uncoded),
            ["compiler error (no code)"],
            "a withheld error without a code is no class"
        );
    }

    fn trial(protocol: ToolProtocol, constrain: Constrain, replies: u32, runnable_replies: u32) -> TrialRecord {
        TrialRecord {
            trial: format!("01.m0.{protocol}.{}.s0", super::super::record::on_off(constrain)),
            step: "01".into(),
            model: "m".into(),
            protocol: protocol.as_str().into(),
            constrain,
            regenerate: Regenerate::Fresh,
            made_from: Vec::new(),
            diff_lines: None,
            constrained: constrain == Constrain::Auto,
            replies,
            runnable_replies,
            seed: 0,
            temperature: None,
            passed: replies == runnable_replies,
            skipped: false,
            check: Verdict::Passed,
            tests: None,
            classes: Vec::new(),
            error: None,
            finish_asked: true,
            model_calls: replies,
            prompt_tokens: 0,
            completion_tokens: 0,
            wall_ms: 0,
            transcript: None,
            output_hash: None,
            files: Vec::new(),
        }
    }

    #[test]
    fn a_row_per_variant_sums_the_replies_of_its_own_trials() {
        let variant = |protocol, constrain| Variant {
            model_index: 0,
            model: "m".into(),
            protocol: Some(protocol),
            constrain: Some(constrain),
            regenerate: None,
        };
        let variants = [variant(ToolProtocol::Json, Constrain::Auto), variant(ToolProtocol::Json, Constrain::Off)];
        let trials = [
            trial(ToolProtocol::Json, Constrain::Auto, 2, 2),
            trial(ToolProtocol::Json, Constrain::Off, 3, 2),
            trial(ToolProtocol::Json, Constrain::Auto, 2, 2),
            trial(ToolProtocol::Json, Constrain::Off, 4, 2),
            // Of no variant of the run: not counted anywhere.
            trial(ToolProtocol::Blocks, Constrain::Auto, 9, 9),
        ];
        let rows = rows(&trials, &["01".into()], &variants, 1, &|_| None);
        let shown: Vec<(&str, usize, u64, u64)> =
            rows.iter().map(|r| (r.variant.as_str(), r.trials, r.runnable_replies, r.replies)).collect();
        assert_eq!(shown, [("m · json · constrained", 2, 4, 4), ("m · json · unconstrained", 2, 4, 7)]);
        assert_eq!(
            (rows[1].passed, rows[1].protocol, rows[1].constrain),
            (0, Some(ToolProtocol::Json), Some(Constrain::Off))
        );
        assert!(rows[0].holds(&trials[0]) && !rows[0].holds(&trials[1]) && !rows[0].holds(&trials[4]));
    }

    fn files(entries: &[(&str, &str)]) -> Files {
        entries.iter().map(|(path, text)| (path.to_string(), text.as_bytes().to_vec())).collect()
    }

    #[test]
    fn the_diff_counts_lines_added_and_removed_in_every_file_of_either_tree() {
        let recorded = files(&[("a.rs", "fn a() {\n    1\n}\n"), ("b.rs", "b\n")]);
        assert_eq!(diff_lines(&recorded, &recorded), 0);
        // One line replaced: one removed, one added.
        let edited = files(&[("a.rs", "fn a() {\n    2\n}\n"), ("b.rs", "b\n")]);
        assert_eq!(diff_lines(&recorded, &edited), 2);
        // A file gone counts each of its lines removed, a new one each of its lines added.
        let moved = files(&[("a.rs", "fn a() {\n    1\n}\n"), ("c.rs", "c\nc\n")]);
        assert_eq!(diff_lines(&recorded, &moved), 1 + 2);
        // Against an empty tree (nothing recorded), every line is added.
        assert_eq!(diff_lines(&Files::new(), &recorded), 4);
        // A last line that loses its newline is a changed line.
        assert_eq!(diff_lines(&files(&[("b.rs", "b\n")]), &files(&[("b.rs", "b")])), 2);
    }

    #[test]
    fn a_row_averages_generated_tokens_over_its_trials_and_diffs_over_the_passing_ones() {
        assert_eq!(mean(&[]), None);
        assert_eq!(mean(&[1, 2]), Some(1.5));
        let variant = |regenerate| Variant {
            model_index: 0,
            model: "m".into(),
            protocol: None,
            constrain: None,
            regenerate: Some(regenerate),
        };
        let started = |regenerate, passed, completion_tokens, diff_lines| TrialRecord {
            regenerate,
            passed,
            completion_tokens,
            diff_lines,
            ..trial(ToolProtocol::Native, Constrain::Auto, 2, 2)
        };
        let trials = [
            started(Regenerate::Edit, true, 10, Some(2)),
            started(Regenerate::Edit, true, 20, Some(4)),
            // Failed half-way: its tokens were spent, its diff would never be read.
            started(Regenerate::Edit, false, 30, Some(40)),
            started(Regenerate::Fresh, false, 90, Some(9)),
        ];
        let rows =
            rows(&trials, &["01".into()], &[variant(Regenerate::Edit), variant(Regenerate::Fresh)], 1, &|_| None);
        let shown: Vec<(&str, usize, f64, Option<f64>)> =
            rows.iter().map(|r| (r.variant.as_str(), r.trials, r.mean_generated_tokens, r.mean_diff_lines)).collect();
        assert_eq!(shown, [("m · by edit", 3, 20.0, Some(3.0)), ("m · fresh", 1, 90.0, None)]);
        assert_eq!(rows[0].regenerate, Some(Regenerate::Edit));
        assert!(rows[0].holds(&trials[2]) && !rows[0].holds(&trials[3]));
        let json = serde_json::to_value(&rows[1]).unwrap();
        assert_eq!(
            (&json["regenerate"], &json["mean_diff_lines"]),
            (&serde_json::json!("fresh"), &serde_json::Value::Null)
        );
        let back: Row = serde_json::from_value(json).unwrap();
        assert_eq!(back, rows[1]);
    }

    #[test]
    fn a_slow_server_and_a_missing_one_are_told_apart() {
        use codegen_core::backend::BackendKind;
        let url = || "http://127.0.0.1:8080/v1/chat/completions".to_string();
        let nothing = Transcript { events: Vec::new() };
        let class = |error: BackendError| classify(&codegen_core::Error::Backend(error), &nothing, false).classes;
        let timeout = BackendError::Timeout {
            backend: BackendKind::OpenAi,
            url: url(),
            timeout: std::time::Duration::from_secs(600),
            detail: "operation timed out".into(),
        };
        assert_eq!(class(timeout), ["timeout"]);
        let refused = BackendError::Unreachable {
            backend: BackendKind::OpenAi,
            url: url(),
            detail: "connection refused".into(),
            attempts: 3,
        };
        assert_eq!(class(refused), ["no server"]);
    }
}
