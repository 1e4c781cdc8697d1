//! What `log` reads: each step's transcripts wherever they are kept (recorded in the store or
//! the cache, waiting in the pending area, or a failed or interrupted attempt under the target
//! folder), parsed into events a person can be shown.

use std::path::Path;

use anyhow::Context;
use cargo_promptgen::__private::Chain;
use cargo_promptgen::__private::Layout;
use cargo_promptgen::__private::LockedStep;
use cargo_promptgen::__private::Records;
use cargo_promptgen::__private::attempts::{self, Attempt, Outcome, PartialReply};
use cargo_promptgen::__private::{Files, Storage};
use codegen_core::chat::Arguments;
use codegen_core::transcript::Transcript;
pub use codegen_core::transcript::{Event, Line};

/// Where a transcript comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Kind {
    /// Recorded in the lock and the store.
    Recorded,
    /// Made by a build, waiting for `accept`.
    Pending,
    /// The last attempt that failed.
    Failed,
    /// The last attempt that was interrupted.
    Interrupted,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Recorded => "recorded",
            Kind::Pending => "pending",
            Kind::Failed => "failed",
            Kind::Interrupted => "interrupted",
        }
    }
}

/// Parses a transcript's JSON Lines: the events of codegen-core's one transcript type, and
/// the kinds of those a newer version wrote, which `log` says it cannot show.
pub fn parse(text: &str, origin: &str) -> anyhow::Result<Vec<Line>> {
    Transcript::read_jsonl(text)
        .map_err(|e| anyhow::anyhow!("{origin}:{}: not a transcript event: {}", e.line, e.detail))
}

/// A transcript chosen to be shown, and what else is kept for its step.
#[derive(Debug, Clone)]
pub struct Shown {
    pub kind: Kind,
    /// Where it was read.
    pub origin: String,
    pub events: Vec<Line>,
    /// Whether its events carry timings (a transcript in the store leaves them out; `log`
    /// finds them in the last successful attempt when it is the same conversation).
    pub timed: bool,
    /// Why the attempt failed or stopped.
    pub error: Option<String>,
    /// The reply under way when it was interrupted.
    pub partial: Option<PartialReply>,
}

/// One step's history.
#[derive(Debug, Clone)]
pub struct StepHistory {
    pub id: String,
    /// The transcript shown.
    pub shown: Option<Shown>,
    /// Every kind of transcript kept for the step.
    pub available: Vec<Kind>,
    /// Its state in the chain: fresh, pending, stale.
    pub state: String,
    /// The lock's (or the pending lock's) entry of its result.
    pub entry: Option<LockedStep>,
    /// The files of its result (recorded or pending), or, for an attempt that failed or
    /// stopped, the last content it wrote to each path.
    pub files: Files,
}

/// The history of every step of `chain` (or only `only`), each showing `which` kind of
/// transcript, or by default the newest: the last attempt when it failed or was interrupted
/// after the result was made, else the pending result, else the recorded one.
pub fn collect(
    chain: &Chain,
    layout: &Layout,
    only: Option<&str>,
    which: Option<Kind>,
) -> anyhow::Result<Vec<StepHistory>> {
    let records = Records::read(layout)?;
    let plan = cargo_promptgen::__private::plan(chain, &records)?;
    let mut out = Vec::new();
    for (step, assessed) in chain.steps.iter().zip(&plan) {
        if only.is_some_and(|id| id != step.id) {
            continue;
        }
        out.push(step_history(layout, &records, &step.id, assessed, which)?);
    }
    Ok(out)
}

/// The trials of evaluation run `run` (only those of step `only`, or the trial so named), each
/// showing its transcript: passed ones as recorded, the others as failed.
pub fn eval_trials(chain: &Chain, layout: &Layout, run: &str, only: Option<&str>) -> anyhow::Result<Vec<StepHistory>> {
    use cargo_promptgen::__private::eval::RunDir;
    let run = RunDir::open(layout, &chain.package_name, Some(run))?;
    let mut out = Vec::new();
    for trial in run.read_trials()? {
        if only.is_some_and(|wanted| wanted != trial.step && wanted != trial.trial) {
            continue;
        }
        let kind = if trial.passed { Kind::Recorded } else { Kind::Failed };
        let shown = match &trial.transcript {
            Some(relative) => {
                let path = run.dir.join(relative);
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read the transcript `{}`", path.display()))?;
                let origin = display(&path, layout);
                let events = parse(&text, &origin)?;
                Some(Shown { kind, origin, events, timed: true, error: trial.error.clone(), partial: None })
            }
            None => None,
        };
        let mut files = Files::new();
        for file in &trial.files {
            if let Ok(bytes) = std::fs::read(run.tree_dir(&trial.trial).join(&file.path)) {
                files.insert(file.path.clone(), bytes);
            }
        }
        let state = match (trial.skipped, trial.passed) {
            (true, _) => "skipped".to_string(),
            (false, true) => format!("passed, {} seed {}", trial.model, trial.seed),
            (false, false) => format!("failed ({}), {} seed {}", trial.classes.join(", "), trial.model, trial.seed),
        };
        out.push(StepHistory { id: trial.trial.clone(), shown, available: vec![kind], state, entry: None, files });
    }
    Ok(out)
}

fn step_history(
    layout: &Layout,
    records: &Records,
    id: &str,
    assessed: &cargo_promptgen::__private::Assessed,
    which: Option<Kind>,
) -> anyhow::Result<StepHistory> {
    use cargo_promptgen::__private::StepState;
    let recorded = records.lock.step(id);
    let pending = records
        .pending
        .as_ref()
        .and_then(|lock| lock.step(id))
        .filter(|entry| recorded.is_none_or(|r| r.key != entry.key));
    let failed = attempts::read(layout, id, Outcome::Failed)?;
    let interrupted = attempts::read(layout, id, Outcome::Interrupted)?;
    let succeeded = attempts::read(layout, id, Outcome::Succeeded)?;

    let mut available = Vec::new();
    let recorded_text = match recorded {
        Some(entry) => verified(records.store.transcript(entry), id)?
            .map(|text| (text, store_origin(&records.store, layout, entry))),
        None => None,
    };
    let pending_store = Storage::Folder(records.pending_store.clone());
    let pending_text = match pending {
        Some(entry) => verified(pending_store.transcript(entry), id)?
            .map(|text| (text, display(&records.pending_store.transcript_path(id), layout))),
        None => None,
    };
    for (kind, present) in [
        (Kind::Recorded, recorded_text.is_some()),
        (Kind::Pending, pending_text.is_some()),
        (Kind::Failed, failed.is_some()),
        (Kind::Interrupted, interrupted.is_some()),
    ] {
        if present {
            available.push(kind);
        }
    }
    let newest_attempt = [&failed, &interrupted, &succeeded]
        .into_iter()
        .flatten()
        // `ended_at` is in seconds: within one second the file written last is the newest.
        .max_by_key(|a| (a.header.ended_at, std::fs::metadata(&a.path).and_then(|m| m.modified()).ok()))
        .map(|a| a.header.outcome);
    let kind = which.or_else(|| match newest_attempt {
        Some(Outcome::Failed) => Some(Kind::Failed),
        Some(Outcome::Interrupted) => Some(Kind::Interrupted),
        _ if pending_text.is_some() => Some(Kind::Pending),
        _ if recorded_text.is_some() => Some(Kind::Recorded),
        _ => None,
    });
    let shown = match kind {
        None => None,
        Some(kind @ (Kind::Recorded | Kind::Pending)) => {
            let text = if kind == Kind::Recorded { &recorded_text } else { &pending_text };
            match text {
                Some((text, origin)) => Some(with_timings(kind, text, origin, succeeded.as_ref())?),
                None => None,
            }
        }
        Some(kind) => {
            let attempt = if kind == Kind::Failed { &failed } else { &interrupted };
            match attempt {
                Some(attempt) => Some(from_attempt(kind, attempt, layout)?),
                None => None,
            }
        }
    };
    if let (Some(which), None) = (which, &shown) {
        anyhow::bail!("step {id} has no {} transcript; it has: {}", which.as_str(), list(&available));
    }
    let (entry, files) = match (&shown, &assessed.state) {
        (Some(s), _) if matches!(s.kind, Kind::Failed | Kind::Interrupted) => (None, written_files(&s.events)),
        (Some(s), _) if s.kind == Kind::Pending => {
            let entry = pending.cloned();
            let files = entry.as_ref().and_then(|e| records.pending_store.load(e).ok()).unwrap_or_default();
            (entry, files)
        }
        _ => {
            let entry = recorded.cloned();
            let files = entry.as_ref().and_then(|e| records.store.load(e).ok()).unwrap_or_default();
            (entry, files)
        }
    };
    let state = match &assessed.state {
        StepState::Fresh => "fresh",
        StepState::Pending => "pending",
        StepState::Stale(_) => "stale",
    };
    Ok(StepHistory { id: id.to_string(), shown, available, state: state.to_string(), entry, files })
}

/// `recorded, failed`, or `none`.
pub fn list(kinds: &[Kind]) -> String {
    if kinds.is_empty() {
        return "none".into();
    }
    kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
}

fn store_origin(store: &Storage, layout: &Layout, entry: &LockedStep) -> String {
    match store {
        Storage::Folder(folder) => display(&folder.transcript_path(&entry.id), layout),
        Storage::Cache { cache, .. } => {
            cache.transcript_path(&entry.key).map_or_else(|| "the cache".into(), |p| p.display().to_string())
        }
    }
}

/// A path relative to the package when it is inside it.
fn display(path: &Path, layout: &Layout) -> String {
    path.strip_prefix(&layout.package_dir).unwrap_or(path).display().to_string()
}

/// A recorded or pending transcript, with the timings of the last successful attempt when
/// that attempt is the same conversation (the store's copy leaves the timings out).
fn with_timings(kind: Kind, text: &str, origin: &str, succeeded: Option<&Attempt>) -> anyhow::Result<Shown> {
    let timed = succeeded.filter(|attempt| same_conversation(&attempt.transcript, text));
    let events = match timed {
        Some(attempt) => parse(&attempt.transcript, &attempt.path.display().to_string())?,
        None => parse(text, origin)?,
    };
    Ok(Shown { kind, origin: origin.to_string(), events, timed: timed.is_some(), error: None, partial: None })
}

fn from_attempt(kind: Kind, attempt: &Attempt, layout: &Layout) -> anyhow::Result<Shown> {
    let origin = display(&attempt.path, layout);
    Ok(Shown {
        kind,
        events: parse(&attempt.transcript, &origin)?,
        origin,
        timed: true,
        error: attempt.header.error.clone(),
        partial: attempt.header.partial.clone(),
    })
}

/// A stored transcript, or none when it is not the one the lock records: never shown as the
/// conversation that made the files, and said so.
fn verified(transcript: Result<Option<String>, cargo_promptgen::Error>, id: &str) -> anyhow::Result<Option<String>> {
    match transcript {
        Ok(text) => Ok(text),
        Err(error @ cargo_promptgen::Error::DamagedStore { .. }) => {
            eprintln!("warning: step {id}: {error}");
            Ok(None)
        }
        Err(error) => Err(error.into()),
    }
}

/// Whether `timed` is `plain` with volatile fields added: the same events otherwise.
fn same_conversation(timed: &str, plain: &str) -> bool {
    let strip = |text: &str| -> Option<Vec<serde_json::Value>> {
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|line| {
                let mut value: serde_json::Value = serde_json::from_str(line).ok()?;
                if let Some(object) = value.as_object_mut() {
                    object.remove("volatile");
                }
                Some(value)
            })
            .collect()
    };
    matches!((strip(timed), strip(plain)), (Some(a), Some(b)) if a == b)
}

/// The last content each `write_file` call that ran gave each path.
fn written_files(events: &[Line]) -> Files {
    let mut files = Files::new();
    for event in events {
        if let Line::Event(Event::ToolRun { tool, arguments: Arguments::Object(args), ok: true, .. }) = event
            && tool == "write_file"
            && let (Some(path), Some(content)) =
                (args.get("path").and_then(|v| v.as_str()), args.get("content").and_then(|v| v.as_str()))
        {
            files.insert(path.to_string(), content.as_bytes().to_vec());
        }
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_are_taken_only_from_the_same_conversation() {
        let plain = "{\"event\":\"model_call\",\"number\":1}\n";
        let timed = "{\"event\":\"model_call\",\"number\":1,\"volatile\":{\"duration_ms\":5}}\n";
        assert!(same_conversation(timed, plain));
        assert!(!same_conversation("{\"event\":\"model_call\",\"number\":2,\"volatile\":{}}\n", plain));
        assert!(!same_conversation("not json", plain));
    }

    #[test]
    fn unknown_events_are_kept_and_known_ones_read() {
        let text = "{\"event\":\"something_new\",\"x\":1}\n{\"event\":\"repair\",\"model_call\":1,\"problem\":\"p\"}\n";
        let events = parse(text, "t").unwrap();
        assert!(matches!(&events[0], Line::Unknown(kind) if kind == "something_new"));
        assert!(matches!(&events[1], Line::Event(Event::Repair { problem, .. }) if problem == "p"));
        let err = parse("{\"event\":\"repair\"}\n", "t.jsonl").unwrap_err();
        assert!(err.to_string().contains("t.jsonl:1"), "{err}");
    }
}
