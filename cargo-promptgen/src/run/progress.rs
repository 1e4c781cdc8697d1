//! What a running chain reports as it goes, for the live lines of `cargo promptgen` and the
//! build script's notes.

use std::time::Duration;

use crate::record::lock::LockedStep;

/// What a running chain reports, for progress displays.
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    /// A step starts running.
    StepStarted {
        /// The step.
        id: String,
        /// Why it runs.
        reasons: Vec<String>,
        /// The recorded files it starts from, in a re-run by edit; empty when it runs from
        /// nothing.
        starts_from: Vec<String>,
        /// Its budget of model calls.
        max_model_calls: u32,
        /// The last of the steps it runs after (in the graph's order) and that step's state
        /// now: `regenerated` (in this run), `recorded` or `pending`; `None` for the first.
        after: Option<(String, &'static str)>,
    },
    /// A run of the step failed, and it runs again with another seed (`seed_retries`).
    Retry {
        /// The step.
        id: String,
        /// The run about to start (2 for the first retry).
        run: u32,
        /// Its seed.
        seed: u64,
        /// Why the last run failed.
        reason: String,
    },
    /// The reply to a model call of a running step is streaming in: sent after each piece
    /// of it (about one token each; Ollama sends a tool call whole, in one piece).
    Streaming {
        /// The step.
        id: String,
        /// The number of the call under way.
        call: u32,
        /// The step's budget of model calls.
        max_model_calls: u32,
        /// Pieces of the reply so far.
        pieces: u64,
        /// Characters of the reply so far, text and tool-call arguments.
        chars: u64,
        /// The tool the model is calling, once its name has arrived.
        tool: Option<String>,
        /// Time since the request was sent.
        call_elapsed: Duration,
    },
    /// A model call of the running step returned.
    ModelCall {
        /// The step.
        id: String,
        /// The call's number within the step.
        number: u32,
        /// The step's budget of model calls.
        max_model_calls: u32,
        /// Tokens so far in this step (prompt + completion).
        tokens: u64,
        /// Completion tokens so far in this step, as the server counted them.
        completion_tokens: u64,
        /// This call's completion tokens, when the server counted them.
        call_tokens: Option<u64>,
        /// This call's time, from the request to the whole reply.
        call_time: Option<Duration>,
        /// Time since the step started.
        elapsed: Duration,
    },
    /// A tool call of the running step was carried out, or refused.
    ToolRan {
        /// The step.
        id: String,
        /// The tool, as the model named it.
        tool: String,
        /// Whether it ran (a refusal goes back to the model as a repair).
        ok: bool,
    },
    /// The running step's check starts (at `finish`, or when the model asks for it).
    Checking {
        /// The step.
        id: String,
        /// The check, e.g. `rustc`.
        check: String,
    },
    /// A step failed: nothing of it is recorded, and the steps after it will not run.
    StepFailed {
        /// The step.
        id: String,
        /// Why, with its causes.
        error: String,
    },
    /// A step finished and was recorded.
    StepDone {
        /// The step.
        id: String,
        /// Its lock entry.
        entry: Box<LockedStep>,
        /// Notes from the loop (e.g. a protocol fallback).
        notes: Vec<String>,
        /// Wall time.
        elapsed: Duration,
    },
    /// A step failed or was interrupted; nothing of it was recorded (the error follows).
    StepStopped {
        /// The step.
        id: String,
        /// Whether it was interrupted rather than failed.
        interrupted: bool,
    },
}
