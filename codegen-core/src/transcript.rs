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

use crate::backend::{BackendKind, Delivery, PromptCache, RetryRecord, Usage};
use crate::chat::{Arguments, Message};
use crate::check::Findings;
#[cfg(doc)]
use crate::constrain::Constraint;
use crate::constrain::ConstraintKind;
use crate::protocol::ToolProtocol;

/// The record of one step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Transcript {
    /// Everything that happened, in order.
    pub events: Vec<Event>,
}

/// One thing that happened during a step. Written and read back by the same type: a
/// transcript without its volatile fields ([`Volatility::Omit`]) reads as one whose events
/// have none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
        #[serde(default, skip_serializing_if = "Option::is_none")]
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
        /// The digest of the constraint the request carried ([`Constraint::digest`]); absent
        /// when it carried none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        constraint: Option<String>,
        /// Timing and retries.
        #[serde(default, skip_serializing_if = "Option::is_none")]
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
        /// Its diagnostics when it failed, as the model was told them; absent when it passed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        diagnostics: Option<String>,
        /// What those diagnostics show as data (error codes and places, failing tests), for
        /// checks that know it; absent for free text and when it passed.
        #[serde(default, skip_serializing_if = "Findings::is_empty")]
        findings: Findings,
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
    /// The step's requests are constrained from here on (see [`crate::constrain`]).
    Constrained {
        /// The protocol the step runs in (`json` for a `native` step the server cannot
        /// constrain natively).
        protocol: ToolProtocol,
        /// What constrains each request.
        by: ConstraintKind,
        /// The server, as identified.
        server: String,
    },
    /// The server rejected the constraint: the step goes on without it.
    Unconstrained {
        /// The server's answer.
        reason: String,
    },
    /// The step ended.
    End {
        /// How it ended.
        outcome: EndOutcome,
        /// The model's summary, when it called `finish`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        summary: Option<String>,
        /// Wall time of the whole step.
        #[serde(default, skip_serializing_if = "Option::is_none")]
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

impl EndOutcome {
    /// The outcome as transcripts spell it: `finished`, `no_tool_call`, `failed`, `interrupted`.
    pub fn as_str(self) -> &'static str {
        match self {
            EndOutcome::Finished => "finished",
            EndOutcome::NoToolCall => "no_tool_call",
            EndOutcome::Failed => "failed",
            EndOutcome::Interrupted => "interrupted",
        }
    }

    /// Whether the step ended done (by `finish`, or a reply without a call).
    pub fn is_done(self) -> bool {
        matches!(self, EndOutcome::Finished | EndOutcome::NoToolCall)
    }
}

/// The run-dependent part of [`Event::Start`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StartVolatile {
    /// Where the backend is.
    pub location: String,
}

/// The run-dependent part of [`Event::ModelCall`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CallVolatile {
    /// Time from sending the request to having the whole reply, retries included.
    #[serde(with = "crate::backend::http::duration_ms", rename = "duration_ms")]
    pub duration: Duration,
    /// Retries that were needed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retries: Vec<RetryRecord>,
    /// Whether the reply streamed, and why not when a streamed request failed.
    pub delivery: Delivery,
    /// What the server read of the prompt and took from its cache, when it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cache: Option<PromptCache>,
}

/// The run-dependent part of [`Event::End`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EndVolatile {
    /// Wall time of the step.
    #[serde(with = "crate::backend::http::duration_ms", rename = "wall_ms")]
    pub wall_time: Duration,
}

impl Event {
    /// The event's kind, as its `event` field names it.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::Start { .. } => "start",
            Event::Message { .. } => "message",
            Event::ModelCall { .. } => "model_call",
            Event::ToolRun { .. } => "tool_run",
            Event::Repair { .. } => "repair",
            Event::Check { .. } => "check",
            Event::Fallback { .. } => "fallback",
            Event::Constrained { .. } => "constrained",
            Event::Unconstrained { .. } => "unconstrained",
            Event::End { .. } => "end",
        }
    }
}

/// The model's replies in a transcript, and how many were one runnable tool call
/// ([`Transcript::replies`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replies {
    /// Replies received (model calls made).
    pub sent: u32,
    /// Those that were exactly one call the loop could run.
    pub runnable: u32,
}

/// Every kind of [`Event`], as the `event` field names it.
pub const EVENT_KINDS: [&str; 10] = [
    "start",
    "message",
    "model_call",
    "tool_run",
    "repair",
    "check",
    "fallback",
    "constrained",
    "unconstrained",
    "end",
];

/// One line of a transcript, read back.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    /// An event.
    Event(Event),
    /// An event of a kind this version does not know (a newer version wrote it): its kind.
    /// Readers show that it is there rather than leave it out unsaid.
    Unknown(String),
}

/// A transcript line that is not an event of this version's format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {detail}")]
pub struct ReadError {
    /// The line, 1-based.
    pub line: usize,
    /// What is wrong with it.
    pub detail: String,
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

    /// How many of the model's replies were one tool call the loop could run: exactly one
    /// call, read, of a known tool, with arguments the tool and the sandbox accept. A `finish`
    /// refused by a failed check counts as run (its content failed, not its shape); one
    /// refused because an output is missing does not (it could not succeed then).
    pub fn replies(&self) -> Replies {
        let mut replies = Replies::default();
        for event in &self.events {
            let Event::ModelCall { number, .. } = event else { continue };
            replies.sent += 1;
            let runs: Vec<(&str, bool)> = self
                .events
                .iter()
                .filter_map(|e| match e {
                    Event::ToolRun { model_call, tool, ok, .. } if model_call == number => Some((tool.as_str(), *ok)),
                    _ => None,
                })
                .collect();
            let check_failed = self.events.iter().any(|e| {
                matches!(e, Event::Check { model_call, asked_by_model: false, diagnostics: Some(_), .. } if model_call == number)
            });
            if let [(tool, ok)] = runs.as_slice()
                && (*ok || (*tool == "finish" && check_failed))
            {
                replies.runnable += 1;
            }
        }
        replies
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

    /// Reads the JSON Lines [`Transcript::write_jsonl`] writes, with or without the volatile
    /// fields; blank lines are skipped. An event of a kind this version does not know is a
    /// [`Line::Unknown`]; one of a known kind that does not read (a field missing, renamed or of
    /// another type) is an error, never a line left out.
    pub fn read_jsonl(text: &str) -> Result<Vec<Line>, ReadError> {
        let mut lines = Vec::new();
        for (index, line) in text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty()) {
            let failed = |detail: String| ReadError { line: index + 1, detail };
            match serde_json::from_str::<Event>(line) {
                Ok(event) => lines.push(Line::Event(event)),
                Err(error) => {
                    let value: serde_json::Value = serde_json::from_str(line).map_err(|e| failed(e.to_string()))?;
                    match value.get("event").and_then(|kind| kind.as_str()) {
                        Some(kind) if !EVENT_KINDS.contains(&kind) => lines.push(Line::Unknown(kind.to_string())),
                        Some(kind) => return Err(failed(format!("not a `{kind}` event of this version: {error}"))),
                        None => return Err(failed("not an event: it has no `event` field".into())),
                    }
                }
            }
        }
        Ok(lines)
    }

    /// The JSON Lines text of [`Transcript::write_jsonl`].
    pub fn to_jsonl(&self, volatility: Volatility) -> String {
        let mut out = Vec::new();
        self.write_jsonl(&mut out, volatility).expect("writing to a Vec cannot fail");
        String::from_utf8(out).expect("serde_json writes UTF-8")
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::chat::ToolCall;
    use crate::check::Finding;

    /// One event of every kind, every optional field set.
    fn every_event() -> Vec<Event> {
        let call = ToolCall {
            id: "call_1".into(),
            name: "write_file".into(),
            arguments: Arguments::from_value(json!({"path": "a.rs", "content": "fn a() {}\n"})),
        };
        vec![
            Event::Start {
                model: "m".into(),
                backend: BackendKind::OpenAi,
                protocol: ToolProtocol::Json,
                seed: Some(7),
                temperature: Some(0.5),
                max_model_calls: 8,
                volatile: Some(StartVolatile { location: "http://127.0.0.1:1/v1".into() }),
            },
            Event::Message { index: 0, message: Message::assistant("text", vec![call]) },
            Event::ModelCall {
                number: 1,
                messages_sent: 2,
                usage: Usage { prompt_tokens: Some(10), completion_tokens: Some(3) },
                finish_reason: Some("stop".into()),
                constraint: Some("sha256:0123456789abcdef".into()),
                volatile: Some(CallVolatile {
                    duration: Duration::from_millis(1234),
                    retries: vec![RetryRecord {
                        attempt: 1,
                        reason: "HTTP 503".into(),
                        waited: Duration::from_millis(500),
                    }],
                    delivery: Delivery::Fallback("the stream ended early".into()),
                    prompt_cache: Some(PromptCache { read: 7, reused: Some(3) }),
                }),
            },
            Event::ToolRun {
                model_call: 1,
                via: CallSource::Text,
                tool: "read_file".into(),
                arguments: Arguments::Malformed { raw: "{".into(), error: "EOF".into() },
                ok: false,
            },
            Event::Repair { model_call: 1, problem: "bad JSON".into() },
            Event::Check {
                model_call: 2,
                asked_by_model: true,
                diagnostics: Some("error[E0308]: mismatched types".into()),
                findings: Findings {
                    errors: vec![Finding {
                        code: Some("E0308".into()),
                        message: "mismatched types".into(),
                        file: Some("a.rs".into()),
                        line: Some(1),
                        column: Some(9),
                        withheld: true,
                    }],
                    failed_tests: vec!["tests::a".into()],
                },
                put_off: Some("step 02 writes b.rs".into()),
            },
            Event::Fallback { from: ToolProtocol::Native, to: ToolProtocol::Json, reason: "no tools".into() },
            Event::Constrained {
                protocol: ToolProtocol::Json,
                by: ConstraintKind::JsonSchema,
                server: "llama-server".into(),
            },
            Event::Unconstrained { reason: "HTTP 400: grammar".into() },
            Event::End {
                outcome: EndOutcome::Finished,
                summary: Some("done".into()),
                volatile: Some(EndVolatile { wall_time: Duration::from_millis(2000) }),
            },
        ]
    }

    #[test]
    fn every_event_kind_reads_back_as_it_was_written() {
        let events = every_event();
        let kinds: Vec<&str> = events.iter().map(Event::kind).collect();
        assert_eq!(kinds, EVENT_KINDS, "one event of every kind, in EVENT_KINDS' order");
        let transcript = Transcript { events };
        let text = transcript.to_jsonl(Volatility::Keep);
        for (line, event) in text.lines().zip(&transcript.events) {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(value["event"], event.kind(), "{line}");
        }
        let back: Vec<Line> = Transcript::read_jsonl(&text).unwrap();
        assert_eq!(back, transcript.events.iter().cloned().map(Line::Event).collect::<Vec<_>>());
    }

    #[test]
    fn a_transcript_without_its_volatile_fields_reads_as_events_without_them() {
        let transcript = Transcript { events: every_event() };
        let back = Transcript::read_jsonl(&transcript.to_jsonl(Volatility::Omit)).unwrap();
        let volatile_free: Vec<Line> = transcript
            .events
            .into_iter()
            .map(|event| {
                Line::Event(match event {
                    Event::Start { model, backend, protocol, seed, temperature, max_model_calls, .. } => {
                        Event::Start { model, backend, protocol, seed, temperature, max_model_calls, volatile: None }
                    }
                    Event::ModelCall { number, messages_sent, usage, finish_reason, constraint, .. } => {
                        Event::ModelCall { number, messages_sent, usage, finish_reason, constraint, volatile: None }
                    }
                    Event::End { outcome, summary, .. } => Event::End { outcome, summary, volatile: None },
                    other => other,
                })
            })
            .collect();
        assert_eq!(back, volatile_free);
    }

    #[test]
    fn unknown_kinds_are_kept_and_a_known_event_that_does_not_read_is_an_error() {
        let text =
            "{\"event\":\"something_new\",\"x\":1}\n\n{\"event\":\"repair\",\"model_call\":1,\"problem\":\"p\"}\n";
        let lines = Transcript::read_jsonl(text).unwrap();
        assert_eq!(lines[0], Line::Unknown("something_new".into()));
        assert_eq!(lines[1], Line::Event(Event::Repair { model_call: 1, problem: "p".into() }));
        // A renamed field is not dropped silently.
        let renamed = "{\"event\":\"repair\",\"model_call\":1,\"issue\":\"p\"}\n";
        let error = Transcript::read_jsonl(renamed).unwrap_err();
        assert_eq!(error.line, 1);
        assert!(error.detail.contains("`repair`") && error.detail.contains("problem"), "{error}");
        assert_eq!(Transcript::read_jsonl("{\"x\":1}\n").unwrap_err().detail, "not an event: it has no `event` field");
        assert!(Transcript::read_jsonl("not json\n").is_err());
    }
}
