//! What an evaluation keeps, under `<target>/promptgen/eval/<run>/`:
//!
//! - `run.json`: what was asked ([`RunPlan`]), written before the first trial;
//! - `trials.jsonl`: one [`TrialRecord`] per finished trial, appended as each finishes, so an
//!   interrupted run resumes where it stopped (a torn last line is ignored);
//! - `transcripts/<trial>.jsonl`: each trial's transcript with its timings, which `cargo
//!   promptgen log --eval <run>` shows;
//! - `trees/<trial>/`: the tree each trial's check judged, its dependencies' files and its
//!   own, which `--replay` checks again;
//! - `summary.json`: the rows, written when the run ends.

use std::io::Write;
use std::path::{Path, PathBuf};

use codegen_core::{Constrain, ToolProtocol};
use serde::{Deserialize, Serialize};

use super::error::EvalError;
use crate::config::Regenerate;
use crate::record::layout::Layout;
use crate::record::lock::LockedFile;

/// How a trial did against one part of its check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// It ran and passed.
    Passed,
    /// It ran and failed.
    Failed,
    /// It never ran: the model never got that far, or (tests) the code did not compile.
    NotRun,
}

/// What an evaluation run was asked to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunPlan {
    /// The package.
    pub package: String,
    /// `--chain`: each trial runs the whole chain fresh.
    pub chain: bool,
    /// The steps evaluated, in the chain's order.
    pub steps: Vec<String>,
    /// The models, in the order given.
    pub models: Vec<String>,
    /// The protocols (`--protocol`), in the order given; empty for each step's configured one.
    /// Absent from the plans of runs made before the flag, which then resume as they were.
    #[serde(default)]
    pub protocols: Vec<ToolProtocol>,
    /// Whether the server is asked to enforce the protocol (`--constrain`), in the order given;
    /// empty for each step's configured `constrain`.
    #[serde(default)]
    pub constrain: Vec<Constrain>,
    /// How the trials start (`--regenerate`), in the order given: by edit from the step's
    /// recorded outputs, or from nothing. Empty when the run does not vary it: its trials then
    /// start from nothing, as every trial did before the flag.
    #[serde(default)]
    pub regenerate: Vec<Regenerate>,
    /// Trials per step × variant: seeds `seed .. seed + seeds`.
    pub seeds: u32,
    /// `--temperature`, when it replaced the configured one.
    pub temperature: Option<f64>,
    /// Each evaluated step's key when the run began, so that a resumed run does not mix
    /// trials of two versions of a prompt.
    pub keys: Vec<(String, String)>,
    /// The run these trials were judged again from (`--replay`).
    pub replay_of: Option<String>,
    /// Seconds since the Unix epoch when the run began.
    pub started_at: u64,
}

impl RunPlan {
    /// Whether the run varies the protocol or the constraint (`--protocol`, `--constrain`).
    pub fn varies_decoding(&self) -> bool {
        !self.protocols.is_empty() || !self.constrain.is_empty()
    }

    /// Whether the run compares trials by edit with trials from nothing (`--regenerate`).
    pub fn varies_regenerate(&self) -> bool {
        !self.regenerate.is_empty()
    }

    /// What the run compares besides its steps, in the order of its rows: each model, and for
    /// each, every protocol, then every `constrain` value, then every `regenerate` mode the
    /// run varies.
    pub fn variants(&self) -> Vec<Variant> {
        let protocols = each_or_default(&self.protocols);
        let constrain = each_or_default(&self.constrain);
        let regenerate = each_or_default(&self.regenerate);
        let mut variants = Vec::new();
        for (index, model) in self.models.iter().enumerate() {
            for &protocol in &protocols {
                for &constrain in &constrain {
                    for &regenerate in &regenerate {
                        variants.push(Variant {
                            model_index: index,
                            model: model.clone(),
                            protocol,
                            constrain,
                            regenerate,
                        });
                    }
                }
            }
        }
        variants
    }
}

/// Each value a run varies, or when it varies none a single `None`, which the trials read as
/// their default (the step's configured protocol and constraint; a start from nothing).
fn each_or_default<T: Copy>(values: &[T]) -> Vec<Option<T>> {
    if values.is_empty() { vec![None] } else { values.iter().copied().map(Some).collect() }
}

/// What a trial runs with besides its step and seed: a model and, where the run varies them,
/// a protocol, whether the server is asked to enforce it, and whether the trial starts from
/// the step's recorded outputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variant {
    /// The model's place in [`RunPlan::models`], which trial names use (`m0`, `m1`, ...).
    pub model_index: usize,
    /// The model.
    pub model: String,
    /// The protocol the trial runs in; `None`: the step's configured one (`--protocol` not
    /// given).
    pub protocol: Option<ToolProtocol>,
    /// Whether its requests are constrained; `None`: the step's configured `constrain`.
    pub constrain: Option<Constrain>,
    /// Whether its trials start by edit from the step's recorded outputs or from nothing;
    /// `None`: from nothing (`--regenerate` not given), as eval always did.
    pub regenerate: Option<Regenerate>,
}

impl Variant {
    /// Its part of a trial's name: `m0`, and then the protocol, `on`/`off` and `edit`/`fresh`
    /// where the run varies them (`m0.json.on.edit`). Without any it is the name trials had
    /// before those flags existed, so that those runs still resume.
    pub fn tag(&self) -> String {
        let mut tag = format!("m{}", self.model_index);
        if let Some(protocol) = self.protocol {
            tag.push('.');
            tag.push_str(protocol.as_str());
        }
        if let Some(constrain) = self.constrain {
            tag.push('.');
            tag.push_str(on_off(constrain));
        }
        if let Some(regenerate) = self.regenerate {
            tag.push('.');
            tag.push_str(regenerate.as_str());
        }
        tag
    }

    /// How its trials start: by edit only when the run asks for it.
    pub fn mode(&self) -> Regenerate {
        self.regenerate.unwrap_or(Regenerate::Fresh)
    }

    /// Whether `trial` ran with this variant. A dimension the run does not vary matches any
    /// trial, since its trials all ran with their step's configured value (and trials of runs
    /// made before the flags record none).
    pub fn holds(&self, trial: &TrialRecord) -> bool {
        ran_with(trial, &self.model, self.protocol, self.constrain, self.regenerate)
    }

    /// How rows name it: the model alone when the run varies none of the protocol, the
    /// constraint and how trials start (as before the flags); `model · protocol · constrained`
    /// (or `unconstrained`) when it varies the protocol or the constraint, and then ` · by
    /// edit` or ` · fresh` when it varies how trials start. Of the protocol and the constraint,
    /// one the run does not vary is the one `trials` share, which is their step's configured
    /// one.
    pub fn label(&self, trials: &[&TrialRecord]) -> String {
        let decoding = self.decoding_label(trials);
        match self.regenerate {
            None => decoding,
            Some(Regenerate::Edit) => format!("{decoding} · by edit"),
            Some(Regenerate::Fresh) => format!("{decoding} · fresh"),
        }
    }

    /// The model, and its protocol and constraint where the run varies either.
    fn decoding_label(&self, trials: &[&TrialRecord]) -> String {
        if self.protocol.is_none() && self.constrain.is_none() {
            return self.model.clone();
        }
        let shared = |of: &dyn Fn(&TrialRecord) -> String| {
            let first = of(trials.first()?);
            trials.iter().all(|t| of(t) == first).then_some(first).filter(|value| !value.is_empty())
        };
        let protocol = match self.protocol {
            Some(protocol) => protocol.as_str().to_string(),
            None => shared(&|t| t.protocol.clone()).unwrap_or_else(|| "configured protocol".into()),
        };
        let constraint = match self.constrain.or_else(|| {
            let first = trials.first()?.constrain;
            trials.iter().all(|t| t.constrain == first).then_some(first)
        }) {
            Some(Constrain::Auto) => "constrained",
            Some(Constrain::Off) => "unconstrained",
            None => "configured constraint",
        };
        format!("{} · {protocol} · {constraint}", self.model)
    }
}

/// Whether `trial` ran with `model` and, where given, `protocol`, `constrain` and `regenerate`.
pub(super) fn ran_with(
    trial: &TrialRecord,
    model: &str,
    protocol: Option<ToolProtocol>,
    constrain: Option<Constrain>,
    regenerate: Option<Regenerate>,
) -> bool {
    trial.model == model
        && protocol.is_none_or(|protocol| trial.protocol == protocol.as_str())
        && constrain.is_none_or(|constrain| trial.constrain == constrain)
        && regenerate.is_none_or(|regenerate| trial.regenerate == regenerate)
}

/// How trials of runs made before `--regenerate` started, and those of runs without it.
fn from_nothing() -> Regenerate {
    Regenerate::Fresh
}

/// `--constrain`'s spelling of a value: `on` for [`Constrain::Auto`] (constrained wherever the
/// server can enforce the protocol), `off` for [`Constrain::Off`].
pub fn on_off(constrain: Constrain) -> &'static str {
    match constrain {
        Constrain::Auto => "on",
        Constrain::Off => "off",
    }
}

/// One finished trial: a step × variant (model, protocol, constraint, regenerate) × seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialRecord {
    /// Its name within the run: `<step>.<variant>.s<seed>` (with `--chain`,
    /// `chain<n>.<variant>.<step>`), used for its files; the variant is `m<model index>`, then
    /// the protocol, `on`/`off` and `edit`/`fresh` where the run varies them ([`Variant::tag`]).
    pub trial: String,
    /// The step.
    pub step: String,
    /// The model.
    pub model: String,
    /// The protocol asked for (`native`, `json`, `blocks`): the step's own or `--protocol`'s.
    /// A `native` step may run in `json` where only a JSON schema can be enforced; its
    /// transcript says so. Empty in trials of runs made before it was recorded.
    #[serde(default)]
    pub protocol: String,
    /// Whether the server was asked to enforce the protocol: the step's `constrain` or
    /// `--constrain`'s (`auto` for trials of runs made before it was recorded).
    #[serde(default)]
    pub constrain: Constrain,
    /// Whether the server really enforced something: the step's transcript says its requests
    /// were constrained, and at least one model call went out so. (A server that refuses the
    /// constraint leaves the step unconstrained, having generated nothing under it.)
    #[serde(default)]
    pub constrained: bool,
    /// How the trial started: `edit`, from the step's recorded outputs (those in
    /// `made_from`), or `fresh`, from nothing. Trials of runs that do not vary it (and of runs
    /// made before `--regenerate`) started from nothing.
    #[serde(default = "from_nothing")]
    pub regenerate: Regenerate,
    /// The recorded files the trial started from, each with its hash: empty for a trial from
    /// nothing, and for a trial by edit of a step that has nothing recorded, which then started
    /// from nothing too.
    #[serde(default)]
    pub made_from: Vec<LockedFile>,
    /// The size of the diff between the step's recorded outputs (an empty tree when it has
    /// none) and the outputs the trial ended with: lines added plus lines removed, over every
    /// output it declares. `None` for a skipped trial, and in trials of runs made before it
    /// was recorded.
    #[serde(default)]
    pub diff_lines: Option<u64>,
    /// The model's replies (model calls answered).
    #[serde(default)]
    pub replies: u32,
    /// Those replies that were exactly one tool call the loop could run.
    #[serde(default)]
    pub runnable_replies: u32,
    /// The seed sent (none when the step configures none and it is the first trial... never:
    /// eval always sends one).
    pub seed: u64,
    /// The temperature sent, if any.
    pub temperature: Option<f64>,
    /// Whether it passed: the step finished with its check (tests included) passing.
    pub passed: bool,
    /// With `--chain`: it did not run because a step it runs after failed in this chain trial.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skipped: bool,
    /// The check (for `cargo test`: that the crate compiles).
    pub check: Verdict,
    /// The crate's tests, when the check runs them.
    pub tests: Option<Verdict>,
    /// Why it failed (see `score::classify`).
    pub classes: Vec<String>,
    /// The error, as `cargo promptgen` would report it.
    pub error: Option<String>,
    /// Whether the model asked to finish at least once (so that a check judged its files).
    pub finish_asked: bool,
    /// Model calls made.
    pub model_calls: u32,
    /// Prompt tokens, as the server counted them.
    pub prompt_tokens: u64,
    /// Completion tokens, as the server counted them.
    pub completion_tokens: u64,
    /// Wall time of the trial, check included.
    pub wall_ms: u64,
    /// The transcript, relative to the run folder.
    pub transcript: Option<String>,
    /// The hash of the trial's own files (paths and contents), if it wrote any.
    pub output_hash: Option<String>,
    /// Its own files.
    pub files: Vec<LockedFile>,
}

/// One evaluation run's folder.
#[derive(Debug, Clone)]
pub struct RunDir {
    /// The package evaluated.
    pub package: String,
    /// Its name (`<package>-<UTC date>-<time>`).
    pub name: String,
    /// The folder.
    pub dir: PathBuf,
}

impl RunDir {
    /// A new run folder for `package`, named after the time (UTC) it began.
    pub fn create(layout: &Layout, package: &str, now: u64) -> Result<RunDir, EvalError> {
        let base = format!("{package}-{}", utc_stamp(now));
        let runs = layout.eval_dir();
        codegen_core::fs::create_dir_all(&runs)?;
        for n in 1u32.. {
            let name = if n == 1 { base.clone() } else { format!("{base}-{n}") };
            let dir = runs.join(&name);
            match std::fs::create_dir(&dir) {
                Ok(()) => return Ok(RunDir { package: package.to_string(), name, dir }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(source) => return Err(codegen_core::FsError::new("create folder", &dir, source).into()),
            }
        }
        unreachable!("some name is free")
    }

    /// The run `name` of `layout`'s target folder, or (`None`) the latest run of `package`.
    pub fn open(layout: &Layout, package: &str, name: Option<&str>) -> Result<RunDir, EvalError> {
        let runs = layout.eval_dir();
        let name = match name {
            Some(name) => name.to_string(),
            None => latest(&runs, package).ok_or_else(|| EvalError::Unusable {
                package: package.to_string(),
                problem: format!("there is no evaluation run of {package} under `{}` to resume", runs.display()),
            })?,
        };
        let dir = runs.join(&name);
        if !dir.join("run.json").is_file() {
            let known = list(&runs, package);
            return Err(EvalError::Unusable {
                package: package.to_string(),
                problem: format!(
                    "there is no evaluation run `{name}` under `{}`{}",
                    runs.display(),
                    if known.is_empty() { String::new() } else { format!("; its runs are: {}", known.join(", ")) }
                ),
            });
        }
        Ok(RunDir { package: package.to_string(), name, dir })
    }

    /// `run.json`.
    pub fn read_plan(&self) -> Result<RunPlan, EvalError> {
        let path = self.dir.join("run.json");
        let text = codegen_core::fs::read_to_string(&path)?;
        serde_json::from_str(&text).map_err(|e| self.damaged(&path, e))
    }

    /// Writes `run.json`.
    pub fn write_plan(&self, plan: &RunPlan) -> Result<(), EvalError> {
        let text = serde_json::to_string_pretty(plan).expect("a plan serializes");
        Ok(codegen_core::fs::write_atomic(&self.dir.join("run.json"), text.as_bytes())?)
    }

    /// The finished trials, in the order they finished. A last line cut short (the run was
    /// killed while writing it) is dropped: that trial runs again.
    pub fn read_trials(&self) -> Result<Vec<TrialRecord>, EvalError> {
        let path = self.dir.join("trials.jsonl");
        if !path.exists() {
            return Ok(Vec::new());
        }
        let text = codegen_core::fs::read_to_string(&path)?;
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let mut trials = Vec::new();
        for (n, line) in lines.iter().enumerate() {
            match serde_json::from_str(line) {
                Ok(trial) => trials.push(trial),
                Err(_) if n + 1 == lines.len() && !text.ends_with('\n') => break,
                Err(e) => return Err(self.damaged(&path, e)),
            }
        }
        Ok(trials)
    }

    /// Appends one trial to `trials.jsonl`, whole, and flushes it to the disk.
    pub fn append_trial(&self, trial: &TrialRecord) -> Result<(), EvalError> {
        let path = self.dir.join("trials.jsonl");
        let line = format!("{}\n", serde_json::to_string(trial).expect("a trial serializes"));
        let append = || -> std::io::Result<()> {
            let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
            file.write_all(line.as_bytes())?;
            file.sync_data()
        };
        append().map_err(|source| codegen_core::FsError::new("append to", &path, source).into())
    }

    /// Writes a trial's transcript; its path relative to the run folder.
    pub fn write_transcript(&self, trial: &str, jsonl: &str) -> Result<String, EvalError> {
        let relative = format!("transcripts/{trial}.jsonl");
        codegen_core::fs::create_dir_all(&self.dir.join("transcripts"))?;
        codegen_core::fs::write_atomic(&self.dir.join(&relative), jsonl.as_bytes())?;
        Ok(relative)
    }

    /// The folder that keeps the tree a trial's check judged.
    pub fn tree_dir(&self, trial: &str) -> PathBuf {
        self.dir.join("trees").join(trial)
    }

    /// Writes `summary.json`.
    pub fn write_summary(&self, summary: &serde_json::Value) -> Result<(), EvalError> {
        let text = serde_json::to_string_pretty(summary).expect("a summary serializes");
        Ok(codegen_core::fs::write_atomic(&self.dir.join("summary.json"), text.as_bytes())?)
    }

    fn damaged(&self, path: &Path, error: serde_json::Error) -> EvalError {
        EvalError::Unusable {
            package: self.package.clone(),
            problem: format!(
                "`{}` is damaged ({error}); delete the run folder `{}` and start a new run",
                path.display(),
                self.dir.display()
            ),
        }
    }
}

/// The runs of `package` under `runs`, oldest first (names sort by time).
fn list(runs: &Path, package: &str) -> Vec<String> {
    let prefix = format!("{package}-");
    let mut names: Vec<String> = std::fs::read_dir(runs)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| name.strip_prefix(&prefix).is_some_and(is_stamp) && runs.join(name).join("run.json").is_file())
        .collect();
    names.sort_by_key(|name| sortable(name));
    names
}

/// Whether `rest` is what [`RunDir::create`] puts after the package's name: `20261201-105043`,
/// maybe with `-<n>` (so that package `app-2`'s runs are not taken for `app`'s).
fn is_stamp(rest: &str) -> bool {
    let parts: Vec<&str> = rest.split('-').collect();
    let digits = |part: &str, len: Option<usize>| {
        !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) && len.is_none_or(|len| part.len() == len)
    };
    match parts.as_slice() {
        [date, time] => digits(date, Some(8)) && digits(time, Some(6)),
        [date, time, n] => digits(date, Some(8)) && digits(time, Some(6)) && digits(n, None),
        _ => false,
    }
}

/// `name` with a missing `-<n>` suffix read as 1, so that `x-2` sorts after `x`.
fn sortable(name: &str) -> (String, u32) {
    let parts: Vec<&str> = name.rsplitn(2, '-').collect();
    match parts.as_slice() {
        [n, base] if n.len() < 4 && n.parse::<u32>().is_ok() => (base.to_string(), n.parse().unwrap_or(1)),
        _ => (name.to_string(), 1),
    }
}

fn latest(runs: &Path, package: &str) -> Option<String> {
    list(runs, package).pop()
}

/// `20261201-105043` for a time in seconds since the Unix epoch, in UTC.
pub fn utc_stamp(seconds: u64) -> String {
    let days = (seconds / 86_400) as i64;
    let rest = seconds % 86_400;
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}{month:02}{day:02}-{:02}{:02}{:02}", rest / 3600, rest % 3600 / 60, rest % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_are_utc_dates() {
        assert_eq!(utc_stamp(0), "19700101-000000");
        // 2026-12-01 10:50:43 UTC.
        assert_eq!(utc_stamp(1_796_122_243), "20261201-105043");
        assert_eq!(utc_stamp(951_825_600), "20000229-120000");
    }

    #[test]
    fn a_run_belongs_to_the_package_whose_name_is_followed_by_a_stamp() {
        assert!(is_stamp("20261201-105043") && is_stamp("20261201-105043-2"));
        // `app-2-20261201-105043` is package `app-2`'s, not `app`'s.
        assert!(!is_stamp("2-20261201-105043"));
        assert!(!is_stamp("20261201") && !is_stamp("20261201-10504x"));
    }

    #[test]
    fn plans_and_trials_of_runs_made_before_the_decoding_flags_still_read_and_keep_their_names() {
        let plan: RunPlan = serde_json::from_str(
            r#"{"package":"p","chain":false,"steps":["01"],"models":["m","n"],"seeds":5,"temperature":null,
                "keys":[["01","k"]],"replay_of":null,"started_at":1}"#,
        )
        .unwrap();
        assert!(plan.protocols.is_empty() && plan.constrain.is_empty() && !plan.varies_decoding());
        let tags: Vec<String> = plan.variants().iter().map(Variant::tag).collect();
        assert_eq!(tags, ["m0", "m1"], "the names trials had before");
        let trial: TrialRecord = serde_json::from_str(
            r#"{"trial":"01.m0.s3","step":"01","model":"m","seed":3,"temperature":null,"passed":true,
                "check":"passed","tests":null,"classes":[],"error":null,"finish_asked":true,"model_calls":2,
                "prompt_tokens":1,"completion_tokens":1,"wall_ms":5,"transcript":null,"output_hash":null,"files":[]}"#,
        )
        .unwrap();
        assert_eq!((trial.protocol.as_str(), trial.replies, trial.runnable_replies), ("", 0, 0));
        assert!(!trial.constrained);
        let variant = &plan.variants()[0];
        assert!(variant.holds(&trial) && !plan.variants()[1].holds(&trial));
        assert_eq!(variant.label(&[&trial]), "m");
    }

    #[test]
    fn variants_go_model_then_protocol_then_constraint_and_name_what_they_vary() {
        let mut plan: RunPlan = serde_json::from_str(
            r#"{"package":"p","chain":false,"steps":["01"],"models":["m"],"seeds":1,"temperature":null,
                "keys":[],"replay_of":null,"started_at":1,"protocols":["json","blocks"],"constrain":["auto","off"]}"#,
        )
        .unwrap();
        let variants = plan.variants();
        let tags: Vec<String> = variants.iter().map(Variant::tag).collect();
        assert_eq!(tags, ["m0.json.on", "m0.json.off", "m0.blocks.on", "m0.blocks.off"]);
        let labels: Vec<String> = variants.iter().map(|v| v.label(&[])).collect();
        assert_eq!(
            labels,
            [
                "m · json · constrained",
                "m · json · unconstrained",
                "m · blocks · constrained",
                "m · blocks · unconstrained"
            ]
        );
        // Only the constraint varied: the protocol is the step's, which its trials recorded.
        plan.protocols.clear();
        plan.constrain = vec![Constrain::Off];
        let variant = &plan.variants()[0];
        assert_eq!(variant.tag(), "m0.off");
        let mut trial: TrialRecord = serde_json::from_str(
            r#"{"trial":"01.m0.off.s0","step":"01","model":"m","seed":0,"temperature":null,"passed":true,
                "check":"passed","tests":null,"classes":[],"error":null,"finish_asked":true,"model_calls":2,
                "prompt_tokens":1,"completion_tokens":1,"wall_ms":5,"transcript":null,"output_hash":null,"files":[],
                "protocol":"native","constrain":"off"}"#,
        )
        .unwrap();
        assert!(variant.holds(&trial));
        assert_eq!(variant.label(&[&trial]), "m · native · unconstrained");
        assert_eq!(variant.label(&[]), "m · configured protocol · unconstrained");
        trial.constrain = Constrain::Auto;
        assert!(!variant.holds(&trial), "a constrained trial is not of the `off` variant");
    }

    #[test]
    fn a_run_that_varies_how_trials_start_names_it_last_and_keeps_it_in_its_records() {
        let plan: RunPlan = serde_json::from_str(
            r#"{"package":"p","chain":false,"steps":["01"],"models":["m"],"seeds":1,"temperature":null,
                "keys":[],"replay_of":null,"started_at":1,"constrain":["off"],"regenerate":["edit","fresh"]}"#,
        )
        .unwrap();
        assert!(plan.varies_regenerate() && plan.varies_decoding());
        let written = serde_json::to_value(&plan).unwrap();
        assert_eq!(written["regenerate"], serde_json::json!(["edit", "fresh"]));
        let variants = plan.variants();
        let tags: Vec<String> = variants.iter().map(Variant::tag).collect();
        assert_eq!(tags, ["m0.off.edit", "m0.off.fresh"]);
        assert_eq!(variants[0].label(&[]), "m · configured protocol · unconstrained · by edit");
        let only_regenerate = Variant { constrain: None, ..variants[1].clone() };
        assert_eq!((only_regenerate.tag().as_str(), only_regenerate.label(&[]).as_str()), ("m0.fresh", "m · fresh"));

        // A trial of a run made before the flag started from nothing, from no recorded file.
        let old = r#"{"trial":"01.m0.s0","step":"01","model":"m","seed":0,"temperature":null,"passed":true,
            "check":"passed","tests":null,"classes":[],"error":null,"finish_asked":true,"model_calls":2,
            "prompt_tokens":1,"completion_tokens":1,"wall_ms":5,"transcript":null,"output_hash":null,"files":[]}"#;
        let mut trial: TrialRecord = serde_json::from_str(old).unwrap();
        assert_eq!((trial.regenerate, trial.made_from.len(), trial.diff_lines), (Regenerate::Fresh, 0, None));
        let edit_only = Variant { regenerate: Some(Regenerate::Edit), ..only_regenerate.clone() };
        assert!(
            only_regenerate.holds(&trial) && !edit_only.holds(&trial),
            "it is of the fresh rows, not the edit ones"
        );
        trial.regenerate = Regenerate::Edit;
        trial.made_from = vec![LockedFile { path: "a.rs".into(), sha256: "0".repeat(64) }];
        trial.diff_lines = Some(2);
        let line = serde_json::to_string(&trial).unwrap();
        assert!(line.contains(r#""regenerate":"edit""#) && line.contains(r#""diff_lines":2"#), "{line}");
        assert_eq!(serde_json::from_str::<TrialRecord>(&line).unwrap(), trial);
    }

    #[test]
    fn numbered_runs_sort_after_their_base() {
        let mut names = vec!["app-20261201-105043-2", "app-20261201-105043", "app-20261130-090000"];
        names.sort_by_key(|n| sortable(n));
        assert_eq!(names, ["app-20261130-090000", "app-20261201-105043", "app-20261201-105043-2"]);
    }
}
