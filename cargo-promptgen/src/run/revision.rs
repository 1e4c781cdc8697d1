//! A re-run by edit (`regenerate = "edit"`): the recorded outputs a stale step starts from,
//! and what its model is told of them.
//!
//! A model never writes the same bytes twice, so a step run again from nothing turns a
//! one-word change to its prompt into a whole-file diff. Started from its recorded outputs,
//! with the change in front of it, it changes the lines the change needs and keeps the rest,
//! and the diff a reviewer reads is the change. Which step is stale, and why, does not depend
//! on it: the plan is the same in both modes.

use codegen_core::ToolProtocol;
use codegen_core::transcript::{Event, Line, Transcript};

use crate::config::{Regenerate, StepConfig};
use crate::files::Files;
use crate::hash::sha256_hex;
use crate::record::lock::{LockedFile, LockedStep};
use crate::record::records::Records;
use crate::record::store::Storage;

/// Files shown in full in the instructions up to this many bytes in all; beyond it the model
/// reads what it changes.
const SHOWN_BYTES: usize = 8 * 1024;

/// What a re-run by edit starts from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Revision {
    /// The step's recorded outputs that it still declares.
    pub files: Files,
    /// Why the step runs again, as the plan says it.
    pub reasons: Vec<String>,
    /// The prompt those files were made from, when the transcript that made them is kept.
    pub previous_prompt: Option<String>,
}

impl Revision {
    /// What a stale `step` (stale for `reasons`, its key now `key`) starts from under
    /// `regenerate = "edit"`: its pending result, else its committed one, as far as its files
    /// read whole and it still declares them. `None` under `"fresh"`, with nothing recorded,
    /// and for a step forced to run with nothing changed (its record has today's key: there is
    /// no change to make, so it runs as from nothing).
    pub fn of(step: &StepConfig, records: &Records, reasons: &[String], key: &str) -> Option<Revision> {
        if step.regenerate == Regenerate::Fresh {
            return None;
        }
        let (entry, storage, files) = records.recorded_step(&step.id)?;
        if entry.key == key {
            return None;
        }
        let files = still_declared(step, files)?;
        Some(Revision { files, reasons: reasons.to_vec(), previous_prompt: previous_prompt(&storage, entry) })
    }

    /// What an eval trial by edit of `step` starts from: its recorded outputs, found as [`of`]
    /// finds them (the pending result, else the committed one, as far as its files read whole
    /// and it still declares them), whatever the step's `regenerate` says and even when the
    /// record has today's key. A trial measures how a model revises the recorded files, so that
    /// nothing changed is a case to measure too: the model is then told that nothing it depends
    /// on changed, and the best answer is to finish without an edit. `reasons`: why the step is
    /// stale, empty when it is not. `None` when nothing is recorded.
    ///
    /// [`of`]: Revision::of
    pub fn for_trial(step: &StepConfig, records: &Records, reasons: &[String]) -> Option<Revision> {
        let (entry, storage, files) = records.recorded_step(&step.id)?;
        let files = still_declared(step, files)?;
        Some(Revision { files, reasons: reasons.to_vec(), previous_prompt: previous_prompt(&storage, entry) })
    }

    /// The lock's provenance entry: each file started from, with its hash.
    pub fn made_from(&self) -> Vec<LockedFile> {
        self.files.iter().map(|(path, bytes)| LockedFile { path: path.clone(), sha256: sha256_hex(bytes) }).collect()
    }

    /// What the model is told, after the user's system prompt: which files are in place, what
    /// changed (the prompt's diff when the old prompt is known), and to change only what that
    /// requires.
    pub fn instructions(&self, protocol: ToolProtocol, prompt_now: &str) -> String {
        let names: Vec<String> = self
            .files
            .iter()
            .map(|(path, bytes)| format!("{path} ({} lines)", bytes.iter().filter(|&&b| b == b'\n').count()))
            .collect();
        let mut out = format!(
            "This task was done before: its files are in place as that run made them: {}. Since then, {}.",
            names.join(", "),
            sentence_list(&self.reasons)
        );
        if let Some(before) = &self.previous_prompt
            && before != prompt_now
        {
            let diff = similar::TextDiff::from_lines(before.as_str(), prompt_now)
                .unified_diff()
                .context_radius(2)
                .header("the task as the files were made", "the task now")
                .to_string();
            out.push_str(&format!("\n\nThe task's text changed like this:\n{}", fenced(&diff, "diff")));
        }
        let edit = protocol.edit_named();
        out.push_str(&format!(
            "\n\nStart from those files: change the lines this requires with {edit} and keep every other line exactly \
             as it is; write a file whole only when most of it must change. When the files do what the task says now, \
             finish."
        ));
        let total: usize = self.files.values().map(Vec::len).sum();
        if total <= SHOWN_BYTES {
            out.push_str("\n\nThe files now:");
            for (path, bytes) in &self.files {
                out.push_str(&format!("\n\n{path}:\n{}", fenced(&String::from_utf8_lossy(bytes), "")));
            }
        } else {
            out.push_str(" read_file shows each file as it is now.");
        }
        out
    }
}

/// Those of `files` that `step` still declares; `None` when none is left.
fn still_declared(step: &StepConfig, files: Files) -> Option<Files> {
    let files: Files = files.into_iter().filter(|(path, _)| step.outputs.contains(path)).collect();
    (!files.is_empty()).then_some(files)
}

/// The prompt of the run that recorded `entry`: the first user message of its transcript,
/// when one is kept and reads.
fn previous_prompt(storage: &Storage, entry: &LockedStep) -> Option<String> {
    let text = storage.transcript(entry).ok()??;
    Transcript::read_jsonl(&text).ok()?.into_iter().find_map(|line| match line {
        Line::Event(Event::Message { message, .. }) if message.role == codegen_core::chat::Role::User => {
            Some(message.content)
        }
        _ => None,
    })
}

/// `text` in a Markdown fence longer than any run of backticks in it.
fn fenced(text: &str, tag: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    let body = if text.ends_with('\n') { text.to_string() } else { format!("{text}\n") };
    format!("{fence}{tag}\n{body}{fence}")
}

fn sentence_list(reasons: &[String]) -> String {
    match reasons {
        [] => "nothing it depends on changed".into(),
        [one] => one.clone(),
        many => many.join("; "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_instructions_name_the_files_show_the_prompt_diff_and_the_files() {
        let mut files = Files::new();
        files.insert("a.rs".into(), b"fn a() {}\n/// ```\n".to_vec());
        let revision = Revision {
            files,
            reasons: vec!["prompt `p.md` changed".into()],
            previous_prompt: Some("Write a.rs.\nGreet in English.\n".into()),
        };
        let text = revision.instructions(ToolProtocol::Json, "Write a.rs.\nGreet in French.\n");
        assert!(text.starts_with("This task was done before: its files are in place as that run made them: a.rs (2 lines). Since then, prompt `p.md` changed."), "{text}");
        assert!(text.contains("```diff\n--- the task as the files were made\n+++ the task now\n@@ -1,2 +1,2 @@\n Write a.rs.\n-Greet in English.\n+Greet in French.\n```"), "{text}");
        assert!(text.contains("with edit_file and keep every other line"), "{text}");
        // The file holds a fence of three backticks: its own fence is longer.
        assert!(text.ends_with("a.rs:\n````\nfn a() {}\n/// ```\n````"), "{text}");
        assert!(revision.instructions(ToolProtocol::Blocks, "x").contains("an @@@edit_begin block"));
        assert_eq!(
            revision.made_from(),
            [LockedFile { path: "a.rs".into(), sha256: sha256_hex(b"fn a() {}\n/// ```\n") }]
        );
        // The same prompt: no diff.
        assert!(!revision.instructions(ToolProtocol::Json, "Write a.rs.\nGreet in English.\n").contains("```diff"));
    }
}
