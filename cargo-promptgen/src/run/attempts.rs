//! The last attempts of each step that the lock does not record, kept under the target
//! folder for `cargo promptgen log`: the last failed one, the last interrupted one, and the
//! last one that succeeded with its timings (the store's transcript leaves them out).
//!
//! ```text
//! <target>/promptgen/attempts/<package>/
//! ├── 01.failed.jsonl        the header line, then the transcript with its volatile fields
//! ├── 01.interrupted.jsonl
//! └── 01.succeeded.jsonl
//! ```
//!
//! Nothing here is ever read by a build or a run: losing the folder loses only history.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use codegen_core::fs::{self, FsError};
use serde::{Deserialize, Serialize};

use crate::record::layout::Layout;

/// A kept attempt that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    /// The file is not a kept attempt (cut short, from another version).
    #[error("`{}` is not a transcript this cargo-promptgen kept ({detail}); delete it", path.display())]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// It could not be read.
    #[error(transparent)]
    Fs(#[from] FsError),
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It failed: its budget, its check, its server.
    Failed,
    /// It was stopped (Ctrl-C) before it ended.
    Interrupted,
    /// It succeeded and was recorded (to the lock and store, or the pending area).
    Succeeded,
}

impl Outcome {
    /// Every outcome, in the order `log` prefers the newest of them.
    pub const ALL: [Outcome; 3] = [Outcome::Failed, Outcome::Interrupted, Outcome::Succeeded];

    /// `failed`, `interrupted`, `succeeded`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Failed => "failed",
            Outcome::Interrupted => "interrupted",
            Outcome::Succeeded => "succeeded",
        }
    }
}

/// The reply that was streaming in when a step was interrupted: never recorded anywhere else.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartialReply {
    /// The model call it answered.
    pub model_call: u32,
    /// Pieces of it that had arrived.
    pub pieces: u64,
    /// Its text so far.
    pub text: String,
    /// The tool it was calling, when its name had arrived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// That call's arguments so far, as text.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub arguments: String,
}

/// The first line of a kept attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// The step.
    pub step: String,
    /// How it ended.
    pub outcome: Outcome,
    /// The key the step had when it ran (the lock's key when it succeeded).
    pub key: String,
    /// Why it failed or stopped, as the error said it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When it ended, in seconds since the Unix epoch.
    pub ended_at: u64,
    /// The reply under way when it was interrupted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<PartialReply>,
}

/// One kept attempt: its header and its transcript (JSON Lines, volatile fields kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// What it was.
    pub header: Header,
    /// The transcript's text.
    pub transcript: String,
    /// The file it was read from.
    pub path: PathBuf,
}

#[derive(Serialize, Deserialize)]
struct HeaderLine {
    attempt: Header,
}

/// Where step `id`'s last attempt with `outcome` is kept.
pub fn path(layout: &Layout, id: &str, outcome: Outcome) -> PathBuf {
    layout.attempts_dir().join(format!("{id}.{}.jsonl", outcome.as_str()))
}

/// The current time as [`Header::ended_at`] has it.
pub fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Keeps `transcript` (JSON Lines) as step `header.step`'s last attempt with its outcome,
/// replacing the one before; atomic, like every write.
pub fn keep(layout: &Layout, header: &Header, transcript: &str) -> Result<PathBuf, FsError> {
    let dir = layout.attempts_dir();
    fs::create_dir_all(&dir)?;
    let mut text = serde_json::to_string(&HeaderLine { attempt: header.clone() }).expect("a header serialises");
    text.push('\n');
    text.push_str(transcript);
    let target = path(layout, &header.step, header.outcome);
    fs::write_atomic(&target, text.as_bytes())?;
    Ok(target)
}

/// Step `id`'s last attempt with `outcome`, if one is kept. A file that is not a kept attempt
/// (cut short, from another version) is [`AttemptError::Damaged`].
pub fn read(layout: &Layout, id: &str, outcome: Outcome) -> Result<Option<Attempt>, AttemptError> {
    let path = path(layout, id, outcome);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.source.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let (first, rest) = text.split_once('\n').unwrap_or((&text, ""));
    match serde_json::from_str::<HeaderLine>(first) {
        Ok(line) => Ok(Some(Attempt { header: line.attempt, transcript: rest.to_string(), path })),
        Err(e) => Err(AttemptError::Damaged { path, detail: e.to_string() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_reads_back_as_it_was_kept() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout {
            package_dir: dir.path().join("pkg"),
            target_area: dir.path().join("target/promptgen"),
            package_name: "pkg".into(),
            store: crate::config::StoreSettings::default(),
        };
        assert_eq!(read(&layout, "01", Outcome::Failed).unwrap(), None);
        let header = Header {
            step: "01".into(),
            outcome: Outcome::Interrupted,
            key: "k".into(),
            error: Some("stopped".into()),
            ended_at: 5,
            partial: Some(PartialReply {
                model_call: 2,
                pieces: 3,
                text: "fn a\n".into(),
                tool: Some("write_file".into()),
                arguments: "{\"path\": \"a".into(),
            }),
        };
        let written = keep(&layout, &header, "{\"event\":\"start\"}\n").unwrap();
        assert_eq!(written, dir.path().join("target/promptgen/attempts/pkg/01.interrupted.jsonl"));
        let attempt = read(&layout, "01", Outcome::Interrupted).unwrap().unwrap();
        assert_eq!(attempt.header, header);
        assert_eq!(attempt.transcript, "{\"event\":\"start\"}\n");
        std::fs::write(&written, "not json\n").unwrap();
        let err = read(&layout, "01", Outcome::Interrupted).unwrap_err();
        assert!(err.to_string().contains("01.interrupted.jsonl"), "{err}");
    }
}
