//! The loop: one prompt, run to completion against a model that works through tools.

use std::path::Path;
use std::time::Instant;

use crate::backend::{Backend, BackendError, ChatRequest, Delivery, Progress};
use crate::cancel::Cancel;
use crate::chat::{Arguments, Message, ToolCall, ToolSpec};
use crate::check::{Check, CheckError, CheckOutcome, Diagnostics};
use crate::constrain::{self, Admissible, Constrain, Constraint, ConstraintKind, Enforcement};
use crate::protocol::ToolProtocol;
use crate::protocol::blocks::{self, BlockCommand};
use crate::protocol::text::{self, TextCalls};
use crate::sandbox::{Sandbox, SandboxError};
use crate::tools::{self, ToolOutcome};
use crate::transcript::{CallSource, CallVolatile, EndOutcome, EndVolatile, Event, StartVolatile, Transcript};

/// One prompt to run: the model, its sampling settings, its budget and its contract.
///
/// Setters take and return `&mut Step`, so a step can be configured in one expression or
/// bit by bit:
///
/// ```no_run
/// # use codegen_core::{Step, ToolProtocol};
/// let mut step = Step::new("qwen2.5-coder:7b", "Write the file hello.rs ...");
/// step.seed(123).temperature(0.0).max_model_calls(8).protocol(ToolProtocol::Native);
/// step.expect_output("hello.rs");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub(crate) model: String,
    pub(crate) prompt: String,
    pub(crate) system_prompt: Option<String>,
    pub(crate) seed: Option<u64>,
    pub(crate) temperature: Option<f64>,
    pub(crate) max_model_calls: u32,
    pub(crate) protocol: ToolProtocol,
    pub(crate) outputs: Vec<String>,
    pub(crate) check_rounds: u32,
    pub(crate) constrain: Constrain,
    pub(crate) cancel: Option<Cancel>,
}

impl Step {
    /// Model calls a step may make when nothing else is said, repairs included.
    pub const DEFAULT_MAX_MODEL_CALLS: u32 = 8;

    /// Failed checks a step may answer with a repair round before it fails.
    pub const DEFAULT_CHECK_ROUNDS: u32 = 3;

    /// A step that sends `prompt` to `model`, with the defaults: no system prompt of the
    /// user's, the server's default seed and temperature, [`Step::DEFAULT_MAX_MODEL_CALLS`] model
    /// calls, the [`ToolProtocol::Native`] protocol, no declared outputs, and
    /// [`Constrain::Auto`].
    pub fn new(model: impl Into<String>, prompt: impl Into<String>) -> Step {
        Step {
            model: model.into(),
            prompt: prompt.into(),
            system_prompt: None,
            seed: None,
            temperature: None,
            max_model_calls: Step::DEFAULT_MAX_MODEL_CALLS,
            protocol: ToolProtocol::Native,
            outputs: Vec::new(),
            check_rounds: Step::DEFAULT_CHECK_ROUNDS,
            constrain: Constrain::Auto,
            cancel: None,
        }
    }

    /// Instructions sent before the prompt, ahead of the loop's own (which explain the tools).
    pub fn system_prompt(&mut self, text: impl Into<String>) -> &mut Step {
        self.system_prompt = Some(text.into());
        self
    }

    /// The sampling seed, for servers that honour one.
    pub fn seed(&mut self, seed: u64) -> &mut Step {
        self.seed = Some(seed);
        self
    }

    /// The sampling temperature; 0 for the most repeatable output.
    pub fn temperature(&mut self, temperature: f64) -> &mut Step {
        self.temperature = Some(temperature);
        self
    }

    /// The budget of model calls, repairs included. Reaching it is an error.
    pub fn max_model_calls(&mut self, max_model_calls: u32) -> &mut Step {
        self.max_model_calls = max_model_calls;
        self
    }

    /// How the model calls tools.
    pub fn protocol(&mut self, protocol: ToolProtocol) -> &mut Step {
        self.protocol = protocol;
        self
    }

    /// Declares a file (relative to the output root) the step must produce: `finish` is
    /// refused while it is missing, and the model is told so. A step that declares outputs
    /// writes only those: `write_file` to any other path is refused with the list.
    pub fn expect_output(&mut self, path: impl Into<String>) -> &mut Step {
        self.outputs.push(path.into());
        self
    }

    /// How many times a failing [`Check`] is sent back to the model before the step fails
    /// (each round also counts against `max_model_calls`).
    pub fn check_rounds(&mut self, rounds: u32) -> &mut Step {
        self.check_rounds = rounds;
        self
    }

    /// Whether the server is asked to enforce the protocol (see [`crate::constrain`]):
    /// [`Constrain::Auto`] by default.
    pub fn constrain(&mut self, constrain: Constrain) -> &mut Step {
        self.constrain = constrain;
        self
    }

    /// Stops the step when `cancel` is set: before its next model call, or at once when the
    /// backend was opened with the same handle ([`BackendConfig::cancel`](crate::backend::BackendConfig::cancel)),
    /// which abandons the request in flight. The step then fails with [`Error::Interrupted`],
    /// its transcript ending in [`EndOutcome::Interrupted`].
    pub fn cancel_on(&mut self, cancel: Cancel) -> &mut Step {
        self.cancel = Some(cancel);
        self
    }

    /// Runs the step to completion.
    pub fn run(&self, backend: &mut dyn Backend, sandbox: &mut Sandbox) -> Result<StepOutput, StepFailure> {
        self.run_observed(backend, sandbox, &mut |_| {})
    }

    /// Runs the step, showing `observer` each [`Event`] as it is recorded (for progress).
    pub fn run_observed(
        &self,
        backend: &mut dyn Backend,
        sandbox: &mut Sandbox,
        mut observer: &mut dyn FnMut(&Event),
    ) -> Result<StepOutput, StepFailure> {
        Run::new(self, backend, sandbox, None, &mut observer).go()
    }

    /// Runs the step with a [`Check`] that its output must pass before it may finish. The
    /// model also gets a `check` tool to run it by itself.
    pub fn run_checked(
        &self,
        backend: &mut dyn Backend,
        sandbox: &mut Sandbox,
        check: &mut dyn Check,
        mut observer: &mut dyn FnMut(&Event),
    ) -> Result<StepOutput, StepFailure> {
        Run::new(self, backend, sandbox, Some(check), &mut observer).go()
    }

    /// Runs the step, with a [`Check`] when one is given, showing `observer` each [`Event`] as
    /// it is recorded and each streamed reply as it arrives ([`Observer::progress`]).
    pub fn run_with(
        &self,
        backend: &mut dyn Backend,
        sandbox: &mut Sandbox,
        check: Option<&mut dyn Check>,
        observer: &mut dyn Observer,
    ) -> Result<StepOutput, StepFailure> {
        // Shortens the check's lifetime to the others' (`Option` does not do it by itself).
        let check = check.map(|check| check as &mut dyn Check);
        Run::new(self, backend, sandbox, check, observer).go()
    }
}

/// What a running step shows: each [`Event`] as it is recorded, and each model reply as it
/// streams in.
///
/// A closure taking `&Event` is an observer that ignores the streaming:
///
/// ```
/// # use codegen_core::transcript::Event;
/// # use codegen_core::Observer;
/// fn takes(_: &mut dyn Observer) {}
/// takes(&mut |event: &Event| println!("{event:?}"));
/// ```
pub trait Observer {
    /// An event was recorded in the transcript.
    fn event(&mut self, event: &Event);

    /// The reply to the model call under way has grown: what arrived, and counts so far. It
    /// is called between the pieces of a reply, so it should return quickly. Nothing of it is
    /// recorded: the transcript's [`Event::ModelCall`] follows once the reply is whole. The
    /// default shows nothing.
    fn progress(&mut self, progress: &Progress<'_>) {
        let _ = progress;
    }
}

impl<F: FnMut(&Event)> Observer for F {
    fn event(&mut self, event: &Event) {
        self(event)
    }
}

/// Runs `prompt` with `model` and default settings, writing under `output_root` (which it
/// creates) and reading only there: the one-call form of [`Step`] and [`Sandbox`].
pub fn run_prompt(
    backend: &mut dyn Backend,
    model: &str,
    prompt: &str,
    output_root: &Path,
) -> Result<StepOutput, StepFailure> {
    let mut sandbox = Sandbox::builder(output_root)
        .build()
        .map_err(|e| StepFailure { error: Error::Sandbox(e), transcript: Transcript::default() })?;
    Step::new(model, prompt).run(backend, &mut sandbox)
}

/// What the loop tells every model, ahead of the protocol's own instructions.
const LOOP_INSTRUCTIONS: &str = "You work on a project through tools: read the files you need, write every file the \
    task asks for with its complete content, change a few lines of a file that exists by editing it, and finish when \
    you are done. Paths are relative and use forward slashes.";

fn protocol_instructions(protocol: ToolProtocol, with_check: bool) -> Option<String> {
    match protocol {
        ToolProtocol::Native => None,
        ToolProtocol::Json => Some(text::json_protocol_instructions(&tools::specs_for(with_check))),
        ToolProtocol::Blocks => Some(blocks::blocks_protocol_instructions()),
    }
}

/// Everything besides a step's own prompts that shapes what a model writes under `protocol`
/// (with or without a [`Check`]): the loop's instructions and the tool definitions.
/// `cargo-promptgen` hashes it into each step's key, so that a change to this wording makes
/// recorded steps stale.
pub fn contract(protocol: ToolProtocol, with_check: bool) -> String {
    let specs = serde_json::to_string(&tools::specs_for(with_check)).unwrap_or_default();
    let protocol_text = protocol_instructions(protocol, with_check).unwrap_or_default();
    format!("{LOOP_INSTRUCTIONS}\n\n{protocol_text}\n\n{specs}")
}

/// A step that completed.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct StepOutput {
    /// Whether the model called `finish` or simply stopped calling tools.
    pub end: EndOutcome,
    /// The model's `finish` summary.
    pub summary: Option<String>,
    /// Files written, as paths relative to the output root, in first-write order.
    pub written: Vec<String>,
    /// The protocol the step ended on (differs from the one asked for after a fallback).
    pub protocol: ToolProtocol,
    /// Things the user should know, e.g. a protocol fallback.
    pub notes: Vec<String>,
    /// The record of the step.
    pub transcript: Transcript,
}

/// Why a step failed, and what it did up to then. It shows as its [`Error`], whose causes
/// are its own.
#[derive(Debug)]
pub struct StepFailure {
    /// What went wrong.
    pub error: Error,
    /// Everything recorded before the failure.
    pub transcript: Transcript,
}

impl std::fmt::Display for StepFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for StepFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

/// Why a step failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The model could not be called.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The budget of model calls ran out.
    #[error("the step used all {max_model_calls} model calls of its budget (`max_model_calls`) without finishing{}{}\nRaise `max_model_calls`, make the prompt more explicit, or try another protocol; the transcript shows each turn.",
        missing_text(missing_outputs),
        last_problem.as_deref().map(|p| format!("; the last problem told to the model was: {p}")).unwrap_or_default())]
    BudgetExhausted {
        /// The budget.
        max_model_calls: u32,
        /// Declared outputs that were still missing.
        missing_outputs: Vec<String>,
        /// The last repair the model was given, if any.
        last_problem: Option<String>,
    },
    /// The sandbox could not be set up.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// The first prompt leaves too little of the server's context for a reply; nothing was
    /// sent to the model.
    #[error(
        "the prompt is {prompt_tokens} tokens and the server's context holds {context}, which leaves less than \
         `max_output_tokens` ({max_output_tokens}) for the reply; nothing was sent to the model.\nShorten the \
         prompt or the step's inputs, lower `max_output_tokens`, or start the server with a larger context \
         (llama-server's --ctx-size)"
    )]
    PromptTooLarge {
        /// Tokens of the prompt, as the server counts them.
        prompt_tokens: u64,
        /// Tokens the server's context holds.
        context: u64,
        /// The reply cap.
        max_output_tokens: u32,
    },
    /// The output never passed its check.
    #[error("the files still fail `{check}` after {rounds} repair round{}; its last messages:\n{diagnostics}", if *rounds == 1 { "" } else { "s" })]
    CheckFailed {
        /// The check's name.
        check: String,
        /// Repair rounds allowed.
        rounds: u32,
        /// The check's last diagnostics.
        diagnostics: Box<Diagnostics>,
    },
    /// The check could not run at all.
    #[error(transparent)]
    CheckCouldNotRun(#[from] CheckError),
    /// The step was cancelled ([`Step::cancel_on`]); the reply under way, if any, was abandoned.
    #[error("the step was interrupted {}", if *model_calls == 0 { "before its first model call".to_string() } else if *during_call { format!("during model call {model_calls}") } else { format!("after model call {model_calls}") })]
    Interrupted {
        /// The model call under way (when `during_call`), or the last one made.
        model_calls: u32,
        /// Whether a model call was under way and was abandoned.
        during_call: bool,
    },
}

/// Whether an error status to a constrained request may be the server refusing the
/// constraint (a schema or grammar it cannot compile, a field it does not know): a client
/// error or a server error, except the ones that say something else (authentication, a model
/// it does not serve, a timeout, a conflict, a rate limit).
fn rejects_a_constraint(status: u16) -> bool {
    (400..600).contains(&status) && ![401, 403, 404, 408, 409, 429].contains(&status)
}

fn missing_text(missing: &[String]) -> String {
    if missing.is_empty() { String::new() } else { format!("; still missing: {}", missing.join(", ")) }
}

/// The state of one run of a [`Step`].
struct Run<'a> {
    step: &'a Step,
    backend: &'a mut dyn Backend,
    sandbox: &'a mut Sandbox,
    observer: &'a mut dyn Observer,
    protocol: ToolProtocol,
    history: Vec<Message>,
    transcript: Transcript,
    notes: Vec<String>,
    model_calls: u32,
    last_problem: Option<String>,
    started: Instant,
    check: Option<&'a mut dyn Check>,
    check_failures: u32,
    /// What constrains each request, once the plan is made (`None`: nothing).
    constrained_by: Option<ConstraintKind>,
    /// The reply cap the server was opened with, which bounds a constrained file's length.
    max_output_tokens: Option<u32>,
    /// The files `write_file` wrote whole in this run (edits excepted), first write first.
    written_whole: Vec<String>,
}

/// One tool call to run, wherever it came from.
struct PendingCall {
    id: String,
    name: String,
    arguments: Arguments,
    via: CallSource,
    /// For `@@@` commands: how the result is labelled back to the model.
    label: String,
}

/// The outcome of handling one reply.
enum Turn {
    Continue,
    Finished(Option<String>),
    Stopped,
}

impl<'a> Run<'a> {
    fn new(
        step: &'a Step,
        backend: &'a mut dyn Backend,
        sandbox: &'a mut Sandbox,
        check: Option<&'a mut dyn Check>,
        observer: &'a mut dyn Observer,
    ) -> Run<'a> {
        Run {
            step,
            backend,
            sandbox,
            observer,
            protocol: step.protocol,
            history: Vec::new(),
            transcript: Transcript::default(),
            notes: Vec::new(),
            model_calls: 0,
            last_problem: None,
            started: Instant::now(),
            check,
            check_failures: 0,
            constrained_by: None,
            max_output_tokens: None,
            written_whole: Vec::new(),
        }
    }

    fn record(&mut self, event: Event) {
        self.observer.event(&event);
        self.transcript.events.push(event);
    }

    fn push_message(&mut self, message: Message) {
        let index = self.history.len();
        self.history.push(message.clone());
        self.record(Event::Message { index, message });
    }

    fn repair(&mut self, problem: String) {
        self.last_problem = Some(problem.clone());
        self.record(Event::Repair { model_call: self.model_calls, problem });
    }

    fn go(mut self) -> Result<StepOutput, StepFailure> {
        self.record(Event::Start {
            model: self.step.model.clone(),
            backend: self.backend.kind(),
            protocol: self.step.protocol,
            seed: self.step.seed,
            temperature: self.step.temperature,
            max_model_calls: self.step.max_model_calls,
            volatile: Some(StartVolatile { location: self.backend.location() }),
        });
        if self.step.constrain == Constrain::Auto {
            let enforcement = self.backend.enforcement();
            self.plan_constraint(&enforcement);
        }
        let system = self.system_prompt();
        self.push_message(Message::system(system));
        self.push_message(Message::user(self.step.prompt.clone()));
        let result = match self.drive() {
            // Whatever else went wrong once the flag was set (a check killed by the same Ctrl-C,
            // say) is the interruption.
            Err(error) if self.cancelled() && !matches!(error, Error::Interrupted { .. }) => {
                Err(Error::Interrupted { model_calls: self.model_calls, during_call: false })
            }
            result => result,
        };
        let (outcome, summary) = match &result {
            Ok(Turn::Finished(summary)) => (EndOutcome::Finished, summary.clone()),
            Ok(_) => (EndOutcome::NoToolCall, None),
            Err(Error::Interrupted { .. }) => (EndOutcome::Interrupted, None),
            Err(_) => (EndOutcome::Failed, None),
        };
        let wall_time = self.started.elapsed();
        self.record(Event::End { outcome, summary: summary.clone(), volatile: Some(EndVolatile { wall_time }) });
        match result {
            Ok(_) => Ok(StepOutput {
                end: outcome,
                summary,
                written: self.sandbox.written().to_vec(),
                protocol: self.protocol,
                notes: self.notes,
                transcript: self.transcript,
            }),
            Err(error) => Err(StepFailure { error, transcript: self.transcript }),
        }
    }

    fn cancelled(&self) -> bool {
        self.step.cancel.as_ref().is_some_and(Cancel::is_cancelled)
    }

    fn drive(&mut self) -> Result<Turn, Error> {
        loop {
            if self.cancelled() {
                return Err(Error::Interrupted { model_calls: self.model_calls, during_call: false });
            }
            if self.model_calls >= self.step.max_model_calls {
                return Err(Error::BudgetExhausted {
                    max_model_calls: self.step.max_model_calls,
                    missing_outputs: self.missing_outputs(),
                    last_problem: self.last_problem.clone(),
                });
            }
            let constraint = self.constraint();
            let specs: Vec<ToolSpec> = match (self.protocol, &constraint) {
                (ToolProtocol::Native, Some(Constraint::ToolCall)) => self.admissible().tools(),
                (ToolProtocol::Native, _) => tools::specs_for(self.check.is_some()),
                _ => Vec::new(),
            };
            let request = ChatRequest {
                model: &self.step.model,
                messages: &self.history,
                tools: &specs,
                seed: self.step.seed,
                temperature: self.step.temperature,
                constraint: constraint.as_ref(),
            };
            // The first prompt is refused before it is sent when the server says it leaves less
            // than the reply cap in its context: the server would refuse it, or cut the reply
            // short without saying why.
            if self.model_calls == 0
                && let Some(size) = self.backend.prompt_size(&request)
                && size.tokens + u64::from(size.max_output_tokens) > size.context
            {
                return Err(Error::PromptTooLarge {
                    prompt_tokens: size.tokens,
                    context: size.context,
                    max_output_tokens: size.max_output_tokens,
                });
            }
            let sent_at = Instant::now();
            let observer = &mut *self.observer;
            let response = match self.backend.chat_observed(&request, &mut |progress| observer.progress(progress)) {
                Ok(response) => response,
                Err(BackendError::ToolsUnsupported { model, server_message, .. })
                    if self.protocol == ToolProtocol::Native =>
                {
                    self.fall_back_to_json(&model, server_message);
                    continue;
                }
                Err(BackendError::Status { status, server_message, .. })
                    if constraint.is_some() && rejects_a_constraint(status) =>
                {
                    self.unconstrain(status, server_message);
                    continue;
                }
                Err(BackendError::Cancelled { .. }) => {
                    return Err(Error::Interrupted { model_calls: self.model_calls + 1, during_call: true });
                }
                Err(_) if self.cancelled() => {
                    return Err(Error::Interrupted { model_calls: self.model_calls + 1, during_call: true });
                }
                Err(err) => return Err(err.into()),
            };
            self.model_calls += 1;
            let messages_sent = self.history.len();
            if let Delivery::Fallback(reason) = &response.delivery {
                let note = format!("{} could not stream a reply: {reason}", self.backend.location());
                if !self.notes.contains(&note) {
                    self.notes.push(note);
                }
            }
            self.record(Event::ModelCall {
                number: self.model_calls,
                messages_sent,
                usage: response.usage,
                finish_reason: response.finish_reason.clone(),
                constraint: constraint.as_ref().map(Constraint::digest),
                volatile: Some(CallVolatile {
                    duration: sent_at.elapsed(),
                    retries: response.retries,
                    delivery: response.delivery,
                    prompt_cache: response.prompt_cache,
                }),
            });
            let cut_off = response.finish_reason.as_deref() == Some("length");
            match self.handle_reply(response.message, cut_off)? {
                Turn::Continue => {}
                ended => return Ok(ended),
            }
        }
    }

    /// Decides how the step is constrained against a server that enforces `enforcement`, and
    /// records it.
    fn plan_constraint(&mut self, enforcement: &Enforcement) {
        let plan = constrain::plan(self.protocol, enforcement);
        self.protocol = plan.protocol;
        self.constrained_by = plan.kind;
        self.max_output_tokens = enforcement.max_output_tokens;
        if let Some(note) = plan.note {
            self.notes.push(note);
        }
        if let Some(by) = plan.kind {
            self.record(Event::Constrained { protocol: plan.protocol, by, server: enforcement.server.clone() });
        }
    }

    /// This turn's constraint: the plan's kind, made of what may be called now.
    fn constraint(&self) -> Option<Constraint> {
        Some(match self.constrained_by? {
            ConstraintKind::JsonSchema => Constraint::JsonSchema(self.admissible().json_schema()),
            ConstraintKind::Grammar => Constraint::Grammar(self.admissible().grammar(self.protocol)),
            ConstraintKind::ToolCall => Constraint::ToolCall,
        })
    }

    /// What the loop would accept now.
    fn admissible(&self) -> Admissible {
        let readable = match self.sandbox.list_files(None) {
            Ok(files) if files.len() <= Admissible::MAX_LISTED => Some(files),
            _ => None,
        };
        let cap = self.max_output_tokens.unwrap_or(crate::backend::BackendConfig::DEFAULT_MAX_OUTPUT_TOKENS);
        let written = &self.written_whole;
        Admissible {
            writable: self.step.outputs.clone(),
            editable: self.step.outputs.iter().filter(|output| self.sandbox.output_exists(output)).cloned().collect(),
            readable,
            finish: self.missing_outputs().is_empty(),
            check: self.check.is_some(),
            only_finish: self.check.is_none()
                && !self.step.outputs.is_empty()
                && self.step.outputs.iter().all(|output| written.iter().any(|w| w == output)),
            max_content_chars: Admissible::content_chars_for(cap),
        }
    }

    /// The server refused a constrained request: go on without the constraint, and say so.
    /// The refused request generated nothing, so it does not count as a call.
    fn unconstrain(&mut self, status: u16, server_message: String) {
        let by = self.constrained_by.take().map(ConstraintKind::describe).unwrap_or("a constraint");
        self.notes.push(format!(
            "{} answered HTTP {status} to a request constrained by {by}, so this step went on unconstrained; set \
             `constrain = \"off\"` to skip the refused request. The server said: {}",
            self.backend.location(),
            crate::report::excerpt(&server_message, 200)
        ));
        self.record(Event::Unconstrained { reason: format!("HTTP {status}: {server_message}") });
    }

    /// The server rejected native tools: describe them in the system prompt instead, and
    /// say so. The rejected request made no generation, so it does not count as a call.
    fn fall_back_to_json(&mut self, model: &str, reason: String) {
        self.protocol = ToolProtocol::Json;
        self.notes.push(format!(
            "model `{model}` does not support native tool calls, so this step fell back to the `json` \
             protocol; set `protocol = \"json\"` to skip the failed request"
        ));
        self.record(Event::Fallback { from: ToolProtocol::Native, to: ToolProtocol::Json, reason });
        let system = self.system_prompt();
        self.history[0] = Message::system(system.clone());
        self.record(Event::Message { index: 0, message: Message::system(system) });
    }

    fn system_prompt(&self) -> String {
        let mut parts = Vec::new();
        if let Some(user) = &self.step.system_prompt {
            parts.push(user.trim_end().to_string());
        }
        parts.push(LOOP_INSTRUCTIONS.to_string());
        if !self.step.outputs.is_empty() {
            parts.push(format!("This task must produce these files: {}.", self.step.outputs.join(", ")));
        }
        if let Some(check) = &self.check {
            parts.push(format!(
                "Before the step can finish, the files must pass the check `{}`. When it fails you get its \
                 messages: fix the files and finish again.",
                check.name()
            ));
        }
        parts.extend(protocol_instructions(self.protocol, self.check.is_some()));
        parts.join("\n\n")
    }

    /// Why `call` may not run when it writes a file the step does not declare: a step that
    /// declares outputs writes those and nothing else, whatever the spelling of the path (it
    /// is normalised first; a name made of look-alike characters is just another name).
    fn undeclared_write(&self, call: &PendingCall) -> Option<String> {
        if ![tools::WRITE_FILE, tools::EDIT_FILE].contains(&call.name.as_str()) || self.step.outputs.is_empty() {
            return None;
        }
        let Arguments::Object(args) = &call.arguments else { return None };
        let path = args.get("path")?.as_str()?;
        let normal = crate::sandbox::normalized(path).ok()?;
        if self.step.outputs.iter().any(|output| crate::sandbox::normalized(output).as_deref() == Ok(&normal)) {
            return None;
        }
        let declared: Vec<String> = self.step.outputs.iter().map(|o| format!("`{o}`")).collect();
        Some(format!(
            "`{}` is not one of the files this step writes, and was not {}. Write only its declared output{}: {}.",
            crate::report::excerpt(&normal, 200),
            if call.name == tools::EDIT_FILE { "changed" } else { "written" },
            if declared.len() == 1 { "" } else { "s" },
            declared.join(", ")
        ))
    }

    fn missing_outputs(&self) -> Vec<String> {
        self.step.outputs.iter().filter(|path| !self.sandbox.output_exists(path)).cloned().collect()
    }

    /// Turns the reply into tool calls and problems, runs the calls, and answers the model.
    fn handle_reply(&mut self, reply: Message, cut_off: bool) -> Result<Turn, Error> {
        let (calls, mut problems) = self.calls_in(&reply);
        // A cut reply that left something to answer (a broken call, a missing file) is told
        // why; one that was only prose ends like any reply without a call.
        let missing = self.missing_outputs();
        if cut_off && (!calls.is_empty() || !problems.is_empty() || !missing.is_empty()) {
            let still =
                if missing.is_empty() { String::new() } else { format!(" Still missing: {}.", missing.join(", ")) };
            problems.push(format!(
                "Your reply was cut off at the server's output limit, so anything after the cut was lost.{still} \
                 Keep replies short: one tool call per reply, and write long files in full but without commentary."
            ));
        }
        let native = !reply.tool_calls.is_empty();
        self.push_message(reply);

        let mut answers = Vec::new();
        let mut finished = None;
        for call in calls {
            if finished.is_some() {
                let note = format!("`{}` was not run: it came after `finish`.", call.name);
                answers.push((call, note));
                continue;
            }
            let outcome = if call.name == tools::CHECK && self.check.is_some() {
                match self.run_check(true)? {
                    None => ToolOutcome::Ran("The check passed.".to_string()),
                    Some(diagnostics) => ToolOutcome::Ran(format!("The check failed:\n{diagnostics}")),
                }
            } else if let Some(problem) = self.undeclared_write(&call) {
                ToolOutcome::Refused(problem)
            } else {
                tools::execute(&call.name, &call.arguments, self.sandbox)
            };
            let (ok, text) = match outcome {
                ToolOutcome::Ran(text) => (true, text),
                ToolOutcome::Refused(problem) => (false, problem),
                ToolOutcome::Finish(summary) => {
                    let missing = self.missing_outputs();
                    if missing.is_empty() {
                        match self.run_check(false)? {
                            None => {
                                finished = Some(summary);
                                (true, "Finished.".to_string())
                            }
                            Some(diagnostics) => (false, self.check_round("`finish` refused", diagnostics)?),
                        }
                    } else {
                        let problem = format!(
                            "`finish` refused: the task must produce {} and {} not written yet. Write {} with write_file, then call finish.",
                            missing.join(", "),
                            if missing.len() == 1 { "it is" } else { "they are" },
                            if missing.len() == 1 { "it" } else { "them" },
                        );
                        (false, problem)
                    }
                }
            };
            if ok
                && call.name == tools::WRITE_FILE
                && let Arguments::Object(args) = &call.arguments
                && let Some(path) =
                    args.get("path").and_then(|p| p.as_str()).and_then(|p| crate::sandbox::normalized(p).ok())
                && !self.written_whole.contains(&path)
            {
                self.written_whole.push(path);
            }
            self.record(Event::ToolRun {
                model_call: self.model_calls,
                via: call.via,
                tool: call.name.clone(),
                arguments: call.arguments.clone(),
                ok,
            });
            if !ok {
                self.repair(text.clone());
            }
            answers.push((call, text));
        }
        for problem in &problems {
            self.repair(problem.clone());
        }

        if native {
            for (call, text) in &answers {
                let echo = ToolCall { id: call.id.clone(), name: call.name.clone(), arguments: call.arguments.clone() };
                self.push_message(Message::tool_result(&echo, text.clone()));
            }
            if !problems.is_empty() {
                self.push_message(Message::user(problems.join("\n")));
            }
        } else if !answers.is_empty() || !problems.is_empty() {
            let message = self.render_text_answers(&answers, &problems);
            self.push_message(Message::user(message));
        }

        if let Some(summary) = finished {
            return Ok(Turn::Finished(Some(summary)));
        }
        if answers.is_empty() && problems.is_empty() {
            let missing = self.missing_outputs();
            if missing.is_empty() {
                // A reply without a call ends the step only if the files pass the check, as
                // `finish` would: no step is recorded with files that never passed it.
                return match self.run_check(false)? {
                    None => Ok(Turn::Stopped),
                    Some(diagnostics) => {
                        let problem = self.check_round(
                            "You stopped without calling `finish`, but the step is not done",
                            diagnostics,
                        )?;
                        self.repair(problem.clone());
                        self.push_message(Message::user(problem));
                        Ok(Turn::Continue)
                    }
                };
            }
            let problem = format!(
                "You replied without calling a tool, but the task is not done: {} still missing. {}",
                missing.join(", "),
                self.how_to_write()
            );
            self.repair(problem.clone());
            self.push_message(Message::user(problem));
        }
        Ok(Turn::Continue)
    }

    /// Runs the check, if there is one: `None` when it passes (or there is none), the
    /// diagnostics when it fails.
    fn run_check(&mut self, asked_by_model: bool) -> Result<Option<Diagnostics>, Error> {
        let Some(check) = self.check.as_mut() else { return Ok(None) };
        let outcome = check.run(self.sandbox.output_root())?;
        let (diagnostics, put_off) = match outcome {
            CheckOutcome::Passed => (None, None),
            CheckOutcome::PutOff(why) => (None, Some(why)),
            CheckOutcome::Failed(diagnostics) => (Some(diagnostics), None),
        };
        if let Some(why) = &put_off
            && !asked_by_model
        {
            self.notes.push(format!("part of the check `{}` was put off: {why}", check.name()));
        }
        self.record(Event::Check {
            model_call: self.model_calls,
            asked_by_model,
            diagnostics: diagnostics.as_ref().map(|d| d.text.clone()),
            findings: diagnostics.as_ref().map(|d| d.findings.clone()).unwrap_or_default(),
            put_off,
        });
        Ok(diagnostics)
    }

    /// Counts a failed check against the step's repair rounds: the step fails once they are
    /// spent, else the model gets `opening`, the round's number and the diagnostics.
    fn check_round(&mut self, opening: &str, diagnostics: Diagnostics) -> Result<String, Error> {
        self.check_failures += 1;
        let name = self.check.as_ref().map(|c| c.name()).unwrap_or_default();
        if self.check_failures > self.step.check_rounds {
            return Err(Error::CheckFailed {
                check: name,
                rounds: self.step.check_rounds,
                diagnostics: Box::new(diagnostics),
            });
        }
        Ok(format!(
            "{opening}: the files do not pass `{name}` (repair round {} of {}). {} then call finish \
             again.\n\n{diagnostics}",
            self.check_failures,
            self.step.check_rounds,
            self.how_to_repair(&diagnostics)
        ))
    }

    /// How to fix what a check found: by edit, where the first error is in a file of the
    /// step's, naming it and its line.
    fn how_to_repair(&self, diagnostics: &Diagnostics) -> String {
        let edit = self.protocol.edit_named();
        let first = diagnostics.findings.errors.iter().find_map(|finding| {
            let file = finding.file.as_ref()?;
            let normal = crate::sandbox::normalized(file).ok()?;
            self.step.outputs.iter().any(|o| crate::sandbox::normalized(o).as_deref() == Ok(&normal)).then(|| {
                match finding.line {
                    Some(line) => format!("{normal} line {line}"),
                    None => normal.clone(),
                }
            })
        });
        match first {
            Some(place) => format!(
                "The first error is at {place}: change the lines there with {edit} (the exact lines as `old`, \
                 the fix as `new`), or write a file whole again if most of it must change,"
            ),
            None => format!("Fix them: change the lines at fault with {edit}, or write a file whole again,"),
        }
    }

    fn how_to_write(&self) -> &'static str {
        match self.protocol {
            ToolProtocol::Native => "Call write_file for each missing file, then finish.",
            ToolProtocol::Json => {
                "Answer with a JSON object such as {\"tool\": \"write_file\", \"arguments\": {\"path\": ..., \"content\": ...}}."
            }
            ToolProtocol::Blocks => {
                "Write each missing file between @@@write_begin(path) and @@@write_end, then @@@done."
            }
        }
    }

    /// The calls a reply makes, in the step's protocol, and what could not be read.
    fn calls_in(&self, reply: &Message) -> (Vec<PendingCall>, Vec<String>) {
        if !reply.tool_calls.is_empty() {
            let calls = reply
                .tool_calls
                .iter()
                .map(|call| PendingCall {
                    id: call.id.clone(),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                    via: CallSource::Native,
                    label: call.name.clone(),
                })
                .collect();
            return (calls, Vec::new());
        }
        match self.protocol {
            ToolProtocol::Native | ToolProtocol::Json => match text::calls_in_text(&reply.content) {
                TextCalls::None => (Vec::new(), Vec::new()),
                TextCalls::Malformed(problem) => (Vec::new(), vec![problem]),
                TextCalls::Found(found) => {
                    let calls = found
                        .into_iter()
                        .enumerate()
                        .map(|(i, call)| PendingCall {
                            id: format!("text_{}_{}", self.model_calls, i + 1),
                            label: call.name.clone(),
                            name: call.name,
                            arguments: call.arguments,
                            via: CallSource::Text,
                        })
                        .collect();
                    (calls, Vec::new())
                }
            },
            ToolProtocol::Blocks => {
                let parsed = blocks::parse_blocks(&reply.content);
                let calls = parsed
                    .commands
                    .into_iter()
                    .enumerate()
                    .map(|(i, command)| PendingCall {
                        id: format!("block_{}_{}", self.model_calls, i + 1),
                        name: command.tool_name().to_string(),
                        label: command.label(),
                        arguments: Arguments::Object(block_arguments(command)),
                        via: CallSource::Block,
                    })
                    .collect();
                (calls, parsed.problems)
            }
        }
    }

    /// One user turn answering every call and problem of a text-protocol reply.
    fn render_text_answers(&self, answers: &[(PendingCall, String)], problems: &[String]) -> String {
        let mut parts: Vec<String> = Vec::new();
        for (call, text) in answers {
            parts.push(match self.protocol {
                ToolProtocol::Blocks => blocks::render_result(&call.label, text),
                _ => format!("Result of {} {}:\n{}", call.name, shown_arguments(&call.arguments), text),
            });
        }
        for problem in problems {
            parts.push(format!("Problem: {problem}"));
        }
        parts.join("\n\n")
    }
}

/// A call's arguments as the line naming its result shows them: without the `content` of a
/// write, which the model has just sent and which would otherwise go back to it whole (and
/// then again on every later call), and with malformed arguments cut short.
fn shown_arguments(arguments: &Arguments) -> String {
    match arguments {
        Arguments::Object(map) if ["content", "old", "new", "edits"].iter().any(|key| map.contains_key(*key)) => {
            let mut shown = map.clone();
            for key in ["content", "old", "new", "edits"] {
                shown.remove(key);
            }
            serde_json::Value::Object(shown).to_string()
        }
        Arguments::Object(_) => arguments.to_json_text(),
        Arguments::Malformed { raw, .. } => crate::report::excerpt(raw, 200),
    }
}

/// The arguments of the tool an `@@@` command stands for.
fn block_arguments(command: BlockCommand) -> serde_json::Map<String, serde_json::Value> {
    let mut args = serde_json::Map::new();
    match command {
        BlockCommand::Read { path } => {
            args.insert("path".into(), path.into());
        }
        BlockCommand::Write { path, content } => {
            args.insert("path".into(), path.into());
            args.insert("content".into(), content.into());
        }
        BlockCommand::Edit { path, mut edits } => {
            args.insert("path".into(), path.into());
            if edits.len() == 1 {
                let (old, new) = edits.remove(0);
                args.insert("old".into(), old.into());
                args.insert("new".into(), new.into());
            } else {
                let list: Vec<serde_json::Value> =
                    edits.into_iter().map(|(old, new)| serde_json::json!({"old": old, "new": new})).collect();
                args.insert("edits".into(), list.into());
            }
        }
        BlockCommand::List { dir } => {
            if let Some(dir) = dir {
                args.insert("dir".into(), dir.into());
            }
        }
        BlockCommand::Done { summary } => {
            args.insert("summary".into(), summary.into());
        }
    }
    args
}
