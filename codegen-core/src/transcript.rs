//! What happened during a step: every message, model call, tool run, repair and fallback.
//!
//! A transcript is a list of [`Event`]s. Each request to the model is the first
//! `messages_sent` [`Event::Message`]s, so the history is stored once rather than once per
//! call. What varies from run to run without the model's output changing (durations,
//! retries, the server's URL) sits in each event's `volatile` part, which
//! [`Volatility::Omit`] leaves out: a committed transcript then changes only when the
//! conversation does.

use std::io::{self, Write};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backend::{BackendKind, Delivery, RetryRecord, Usage};
use crate::chat::{Arguments, Message};
use crate::protocol::ToolProtocol;

/// The record of one step.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Transcript {
    /// Everything that happened, in order.
    pub events: Vec<Event>,
}

/// One thing that happened during a step.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Event {
    /// The step began.
    Start {
        /// The model asked for.
        model: String,
        /// The backend's kind.
        backend: BackendKind,
        /// The tool protocol asked for.
        protocol: ToolProtocol,
        /// The sampling seed.
        seed: Option<u64>,
        /// The sampling temperature.
        temperature: Option<f64>,
        /// The budget of model calls.
        max_model_calls: u32,
        /// Where the backend is (URL or script path).
        #[serde(skip_serializing_if = "Option::is_none")]
        volatile: Option<StartVolatile>,
    },
    /// A message was added to the history (index = its position in it).
    Message {
        /// Position in the history.
        index: usize,
        /// The message.
        message: Message,
    },
    /// The model was called with the first `messages_sent` messages and replied.
    ModelCall {
        /// 1-based number of the call within the step.
        number: u32,
        /// How many messages of the history were sent.
        messages_sent: usize,
        /// Tokens, as the server reports them.
        usage: Usage,
        /// Why the model stopped, as the server says it.
        finish_reason: Option<String>,
        /// Timing and retries.
        #[serde(skip_serializing_if = "Option::is_none")]
        volatile: Option<CallVolatile>,
    },
    /// A tool call was carried out (or refused).
    ToolRun {
        /// The model call whose reply held it.
        model_call: u32,
        /// How the model expressed it.
        via: CallSource,
        /// The tool's name, as the model wrote it.
        tool: String,
        /// Its arguments.
        arguments: Arguments,
        /// Whether it ran; a refusal is also recorded as a [`Event::Repair`].
        ok: bool,
    },
    /// The model broke the contract and was told how to do better.
    Repair {
        /// The model call whose reply was at fault.
        model_call: u32,
        /// What was wrong, as told to the model.
        problem: String,
    },
    /// The step's check ran.
    Check {
        /// The model call after which it ran.
        model_call: u32,
        /// Whether the model asked for it with the `check` tool (else `finish` triggered it).
        asked_by_model: bool,
        /// Its diagnostics when it failed; absent when it passed.
        #[serde(skip_serializing_if = "Option::is_none")]
        diagnostics: Option<String>,
        /// When it passed only in part: what was put off, and why.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        put_off: Option<String>,
    },
    /// The loop switched tool protocols by itself.
    Fallback {
        /// The protocol that failed.
        from: ToolProtocol,
        /// The protocol used from then on.
        to: ToolProtocol,
        /// Why, in the server's words.
        reason: String,
    },
    /// The step ended.
    End {
        /// How it ended.
        outcome: EndOutcome,
        /// The model's summary, when it called `finish`.
        #[serde(skip_serializing_if = "Option::is_none")]
        summary: Option<String>,
        /// Wall time of the whole step.
        #[serde(skip_serializing_if = "Option::is_none")]
        volatile: Option<EndVolatile>,
    },
}

/// How a tool call reached us.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CallSource {
    /// The protocol's `tool_calls` field.
    Native,
    /// JSON written in the reply's text.
    Text,
    /// An `@@@` command.
    Block,
}

/// How a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EndOutcome {
    /// The model called `finish` and every declared output existed.
    Finished,
    /// The model replied without a tool call and every declared output existed.
    NoToolCall,
    /// The step failed; the error says why.
    Failed,
    /// The step was cancelled before it ended ([`crate::Step::cancel_on`]).
    Interrupted,
}

/// The run-dependent part of [`Event::Start`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct StartVolatile {
    /// Where the backend is.
    pub location: String,
}

/// The run-dependent part of [`Event::ModelCall`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct CallVolatile {
    /// Time from sending the request to having the whole reply, retries included.
    #[serde(with = "crate::backend::http::duration_ms", rename = "duration_ms")]
    pub duration: Duration,
    /// Retries that were needed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub retries: Vec<RetryRecord>,
    /// Whether the reply streamed, and why not when a streamed request failed.
    pub delivery: Delivery,
}

/// The run-dependent part of [`Event::End`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct EndVolatile {
    /// Wall time of the step.
    #[serde(with = "crate::backend::http::duration_ms", rename = "wall_ms")]
    pub wall_time: Duration,
}

/// Whether [`Transcript::write_jsonl`] keeps the run-dependent fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Volatility {
    /// Keep them: for logs and debugging.
    Keep,
    /// Leave them out: for committed files that must not churn.
    Omit,
}

/// Sums over a transcript.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Totals {
    /// Model calls made (each counts against `max_model_calls`).
    pub model_calls: u32,
    /// Prompt tokens, summed over the calls that reported them.
    pub prompt_tokens: u64,
    /// Completion tokens, summed over the calls that reported them.
    pub completion_tokens: u64,
    /// Repair turns.
    pub repairs: u32,
    /// Checks that failed when the model called `finish`: each was answered with a repair
    /// round, or ended the step.
    pub check_rounds: u32,
    /// Time spent waiting for the model (volatile).
    #[serde(skip)]
    pub model_time: Duration,
    /// Wall time of the step, when it ended (volatile).
    #[serde(skip)]
    pub wall_time: Duration,
}

impl Transcript {
    /// The messages of the history, in order.
    pub fn messages(&self) -> impl Iterator<Item = &Message> {
        self.events.iter().filter_map(|e| match e {
            Event::Message { message, .. } => Some(message),
            _ => None,
        })
    }

    /// The repair problems told to the model, in order.
    pub fn repairs(&self) -> impl Iterator<Item = &str> {
        self.events.iter().filter_map(|e| match e {
            Event::Repair { problem, .. } => Some(problem.as_str()),
            _ => None,
        })
    }

    /// Model calls, tokens, repairs and times.
    pub fn totals(&self) -> Totals {
        let mut totals = Totals::default();
        for event in &self.events {
            match event {
                Event::ModelCall { usage, volatile, .. } => {
                    totals.model_calls += 1;
                    totals.prompt_tokens += usage.prompt_tokens.unwrap_or(0);
                    totals.completion_tokens += usage.completion_tokens.unwrap_or(0);
                    if let Some(v) = volatile {
                        totals.model_time += v.duration;
                    }
                }
                Event::Repair { .. } => totals.repairs += 1,
                Event::Check { diagnostics: Some(_), asked_by_model: false, .. } => totals.check_rounds += 1,
                Event::End { volatile: Some(v), .. } => totals.wall_time = v.wall_time,
                _ => {}
            }
        }
        totals
    }

    /// Writes one JSON object per event and line.
    pub fn write_jsonl(&self, out: &mut dyn Write, volatility: Volatility) -> io::Result<()> {
        for event in &self.events {
            let mut value = serde_json::to_value(event).map_err(io::Error::other)?;
            if volatility == Volatility::Omit
                && let Some(object) = value.as_object_mut()
            {
                object.remove("volatile");
            }
            serde_json::to_writer(&mut *out, &value).map_err(io::Error::other)?;
            out.write_all(b"\n")?;
        }
        Ok(())
    }

    /// The JSON Lines text of [`Transcript::write_jsonl`].
    pub fn to_jsonl(&self, volatility: Volatility) -> String {
        let mut out = Vec::new();
        self.write_jsonl(&mut out, volatility).expect("writing to a Vec cannot fail");
        String::from_utf8(out).expect("serde_json writes UTF-8")
    }
}
