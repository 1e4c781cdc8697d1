//! Running steps: each in a scratch copy of the tree the steps before it produced, then
//! recording the result, one step at a time.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use codegen_core::check::{Check, CheckError, CheckOutcome};
use codegen_core::sandbox::{Sandbox, SandboxBuilder};
use codegen_core::transcript::{Event, Volatility};
use codegen_core::{Cancel, Observer};

use crate::attempts::{self, Outcome, PartialReply};

use crate::check::{CheckSetup, Later, check_for};
use crate::config::{Chain, CheckSpec, StepConfig};
use crate::error::Error;
use crate::layout::Layout;
use crate::lock::{sha256_hex, Lock, LockedFile, LockedStep};
use crate::plan::{assess, Assessed, Previous, Records, StepState};
use crate::out_dir::sync_dir;
use crate::store::{Files, Storage};

/// Where regenerated steps are recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// The committed lock and store (`cargo promptgen`).
    Committed,
    /// The pending area (a build script, which must not write the package).
    Pending,
}

/// What a running chain reports, for progress displays.
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    /// A step starts running.
    StepStarted {
        /// The step.
        id: String,
        /// Why it runs.
        reasons: Vec<String>,
        /// Its budget of model calls.
        max_model_calls: u32,
        /// The step it runs after (the one before it in the chain) and that step's state
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

/// The chain after a run: every step's record and the tree they produce together.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainResult {
    /// Each step's usable record, in order.
    pub steps: Vec<(LockedStep, StepState)>,
    /// Steps that ran in this call.
    pub regenerated: Vec<String>,
    /// Steps whose results a build had left pending, recorded by this call.
    pub accepted: Vec<String>,
    /// Steps the lock recorded that the manifest no longer declares, removed by this call.
    pub removed: Vec<String>,
    /// The tree after the last step.
    pub tree: Files,
}

/// Brings every step of the chain up to date at `destination`: stale steps (and those in
/// `forced`) run, each recorded as soon as it succeeds; fresh steps are taken as recorded;
/// and results a build left in the pending area are recorded too when `destination` is
/// [`Destination::Committed`] (as `accept` would). A failing step stops the chain; steps
/// recorded before it stay recorded, and nothing of the failing step is. Setting `cancel`
/// stops the running step at once ([`Error::Interrupted`]), recording nothing of it.
pub fn bring_up_to_date(
    chain: &Chain,
    layout: &Layout,
    forced: &[String],
    destination: Destination,
    cancel: &Cancel,
    progress: &mut dyn FnMut(Progress),
) -> Result<ChainResult, Error> {
    let mut records = Records::read(layout)?;
    let order: Vec<String> = chain.steps.iter().map(|s| s.id.clone()).collect();
    let (target_lock_path, target_store) = match destination {
        Destination::Committed => (layout.lock_path(), layout.committed()?),
        Destination::Pending => (layout.pending_lock_path(), Storage::Folder(layout.pending_store())),
    };
    // The lock being written: the committed one, or the pending one seeded from it.
    let mut target_lock = match destination {
        Destination::Committed => records.lock.clone(),
        Destination::Pending => records.pending.clone().unwrap_or_else(|| records.lock.clone()),
    };
    let mut result = ChainResult {
        steps: Vec::new(),
        regenerated: Vec::new(),
        accepted: Vec::new(),
        removed: Vec::new(),
        tree: Files::new(),
    };
    // Each step's files as recorded now, read when a step first needs the rest of the chain
    // mounted for its check; updated as steps run.
    let mut recorded: Option<BTreeMap<String, Files>> = None;
    // Steps whose check could only run in part, to run in full once the chain is complete.
    let mut put_off = Vec::new();
    for (index, step) in chain.steps.iter().enumerate() {
        let previous = match result.steps.last() {
            None => Previous::First,
            Some((entry, _)) => Previous::Recorded(entry),
        };
        let force = forced.iter().any(|id| id == &step.id);
        let assessed = assess(chain, step, previous, &records, force)?;
        let (entry, files, state) = match assessed.state.clone() {
            StepState::Stale(reasons) => {
                let after = result.steps.last().map(|(entry, state)| {
                    let word = if result.regenerated.contains(&entry.id) {
                        "regenerated"
                    } else if *state == StepState::Pending {
                        "pending"
                    } else {
                        "recorded"
                    };
                    (entry.id.clone(), word)
                });
                progress(Progress::StepStarted {
                    id: step.id.clone(),
                    reasons: reasons.clone(),
                    max_model_calls: step.max_model_calls,
                    after,
                });
                let started = Instant::now();
                let recorded = recorded.get_or_insert_with(|| recorded_files(chain, &records));
                let (mounted, later) = the_rest_of_the_chain(chain, index, recorded);
                let surroundings = Surroundings { tree: &result.tree, mounted, later, cancel };
                let ran = run_step(chain, layout, step, &assessed, surroundings, progress)?;
                recorded.insert(step.id.clone(), ran.files.clone());
                if ran.put_off {
                    put_off.push(step);
                }
                target_store.save(&ran.entry, &ran.files, Some(&ran.transcript))?;
                target_lock.upsert(ran.entry.clone(), &order);
                target_lock.write(&target_lock_path)?;
                result.regenerated.push(step.id.clone());
                progress(Progress::StepDone {
                    id: step.id.clone(),
                    entry: Box::new(ran.entry.clone()),
                    notes: ran.notes,
                    elapsed: started.elapsed(),
                });
                let state = match destination {
                    Destination::Committed => StepState::Fresh,
                    Destination::Pending => StepState::Pending,
                };
                (ran.entry, ran.files, state)
            }
            state => {
                let entry = assessed.entry.clone().expect("a usable step has its entry");
                match (destination, &state) {
                    // Keep the pending lock whole: it is accepted as one.
                    (Destination::Pending, StepState::Fresh) => target_lock.upsert(entry.clone(), &order),
                    // A build already made this result: record it as `accept` would.
                    (Destination::Committed, StepState::Pending) => {
                        records.pending_store.copy_step(&entry, &assessed.files, &target_store)?;
                        target_lock.upsert(entry.clone(), &order);
                        target_lock.write(&target_lock_path)?;
                        result.accepted.push(step.id.clone());
                    }
                    _ => {}
                }
                let state = if destination == Destination::Committed { StepState::Fresh } else { state };
                (entry, assessed.files.clone(), state)
            }
        };
        for (path, bytes) in &files {
            result.tree.insert(path.clone(), bytes.clone());
        }
        result.steps.push((entry, state));
        // Later steps see this step's results when they are assessed.
        if destination == Destination::Pending {
            records.pending = Some(target_lock.clone());
        } else {
            records.lock = target_lock.clone();
        }
    }
    for step in put_off {
        check_in_full(chain, layout, step, &result.tree, cancel)?;
    }
    match destination {
        Destination::Pending if !result.regenerated.is_empty() => {
            target_lock.steps.retain(|s| order.contains(&s.id));
            target_lock.write(&target_lock_path)?;
        }
        Destination::Committed => result.removed = forget_removed_steps(chain, layout, &mut target_lock)?,
        Destination::Pending => {}
    }
    Ok(result)
}

struct Ran {
    entry: LockedStep,
    files: Files,
    transcript: String,
    notes: Vec<String>,
    /// Its check passed only in part: the rest runs once the chain is complete.
    put_off: bool,
}

/// Every step's recorded files that can be read and check out against the lock (pending
/// results first, as a build would use them).
pub fn recorded_files(chain: &Chain, records: &Records) -> BTreeMap<String, Files> {
    let mut recorded = BTreeMap::new();
    for step in &chain.steps {
        let pending = records.pending.as_ref().and_then(|lock| lock.step(&step.id)).and_then(|e| records.pending_store.load(e).ok());
        let files = pending.or_else(|| records.lock.step(&step.id).and_then(|e| records.store.load(e).ok()));
        if let Some(files) = files {
            recorded.insert(step.id.clone(), files);
        }
    }
    recorded
}

/// For the check of step `index`: the recorded files of the steps after it, mounted beneath
/// its candidate tree so that the crate is whole, and what those steps own, so that errors
/// about them are not blamed on this step (a module no step has written yet included).
pub fn the_rest_of_the_chain(chain: &Chain, index: usize, recorded: &BTreeMap<String, Files>) -> (Files, Later) {
    let mut mounted = Files::new();
    let mut later = Later::default();
    for step in &chain.steps[index + 1..] {
        match recorded.get(&step.id) {
            Some(files) => {
                for (path, bytes) in files {
                    mounted.insert(path.clone(), bytes.clone());
                    later.files.insert(path.clone(), step.id.clone());
                }
            }
            None => {
                for output in &step.outputs {
                    if let Some(stem) = output.strip_suffix(".rs") {
                        let module = stem.rsplit('/').next().unwrap_or(stem);
                        later.missing_modules.insert(module.to_string(), step.id.clone());
                    }
                }
            }
        }
    }
    (mounted, later)
}

/// Runs `step`'s check on the whole chain's `tree`, for a step whose check could only run in
/// part when it ran (its tests needed a module a later step wrote).
fn check_in_full(
    chain: &Chain,
    layout: &Layout,
    step: &StepConfig,
    tree: &Files,
    cancel: &Cancel,
) -> Result<(), Error> {
    let work = layout.work_dir();
    codegen_core::__private::fs::create_dir_all(&work)?;
    let scratch = codegen_core::__private::fs::temp_dir_in(&work, &format!("{}-full-", step.id))?;
    let root = scratch.path().join("tree");
    sync_dir(&root, tree)?;
    let setup = CheckSetup {
        chain,
        layout,
        step,
        scratch: scratch.path().join("check"),
        mounted: Files::new(),
        later: Later::default(),
        cancel: cancel.clone(),
    };
    let Some(mut check) = check_for(setup) else { return Ok(()) };
    let failure = match check.run(&root) {
        Ok(CheckOutcome::Failed(diagnostics)) => diagnostics,
        Ok(_) => return Ok(()),
        Err(error) => error.to_string(),
    };
    Err(Error::CheckFailedOnceComplete { id: step.id.clone(), check: check.name(), diagnostics: failure })
}

/// What a step runs among: the tree the steps before it produced, the rest of the chain for
/// its check (`mounted`, `later`), and the flag that stops it.
struct Surroundings<'a> {
    tree: &'a Files,
    mounted: Files,
    later: Later,
    cancel: &'a Cancel,
}

/// Runs one step in a scratch copy of the tree, with the rest of the chain for its check;
/// again with the next seed after a failed run, up to `seed_retries` times. Nothing outside
/// the scratch folders changes, except that each run's transcript is kept under the target
/// folder for `cargo promptgen log` (see [`crate::attempts`]).
fn run_step(
    chain: &Chain,
    layout: &Layout,
    step: &StepConfig,
    assessed: &Assessed,
    surroundings: Surroundings<'_>,
    progress: &mut dyn FnMut(Progress),
) -> Result<Ran, Error> {
    let Surroundings { tree, mounted, later, cancel } = surroundings;
    let work = layout.work_dir();
    codegen_core::__private::fs::create_dir_all(&work)?;
    let mut backend_config = chain.backend_config(step);
    backend_config.cancel = cancel.clone();
    let mut backend = backend_config.open().map_err(|source| Error::Backend { id: step.id.clone(), source })?;
    let prompt = codegen_core::__private::fs::read_to_string(&step.prompt)?;
    let system_prompt = step.system_prompt.as_deref().map(codegen_core::__private::fs::read_to_string).transpose()?;
    let key = assessed.fingerprint.key();
    let progress = RefCell::new(progress);

    let mut transcripts = String::new();
    // The same runs with their timings, kept for `log`.
    let mut timed = String::new();
    let runs = step.seed_retries + 1;
    let mut run = 1;
    loop {
        // The first run uses the configured seed (or none); each retry the next one.
        let seed = if run == 1 { step.seed } else { Some(step.seed.unwrap_or(0) + u64::from(run - 1)) };
        let scratch = codegen_core::__private::fs::temp_dir_in(&work, &format!("{}-", step.id))?;
        let output_root = scratch.path().join("tree");
        sync_dir(&output_root, tree)?;
        let mut sandbox = sandbox_for(chain, step, &output_root)
            .build()
            .map_err(|source| Error::Sandbox { id: step.id.clone(), source })?;

        let mut core_step = codegen_core::Step::new(step.model.clone(), prompt.clone());
        core_step
            .max_model_calls(step.max_model_calls)
            .protocol(step.protocol)
            .check_rounds(step.check_rounds)
            .cancel_on(cancel.clone());
        if let Some(text) = &system_prompt {
            core_step.system_prompt(text.clone());
        }
        if let Some(seed) = seed {
            core_step.seed(seed);
        }
        if let Some(temperature) = step.temperature {
            core_step.temperature(temperature);
        }
        for output in &step.outputs {
            core_step.expect_output(output.clone());
        }

        let mut watch = Watch::new(&step.id, step.max_model_calls, &progress);
        let setup = CheckSetup {
            chain,
            layout,
            step,
            scratch: scratch.path().join("check"),
            mounted: mounted.clone(),
            later: later.clone(),
            cancel: cancel.clone(),
        };
        let mut check = check_for(setup).map(|check| Announced { check, id: &step.id, progress: &progress });
        let outcome =
            core_step.run_with(backend.as_mut(), &mut sandbox, check.as_mut().map(|c| c as &mut dyn Check), &mut watch);
        let partial = watch.partial.take();
        let output = match outcome {
            Ok(output) => output,
            Err(failure) => {
                transcripts.push_str(&failure.transcript.to_jsonl(Volatility::Omit));
                timed.push_str(&failure.transcript.to_jsonl(Volatility::Keep));
                let interrupted = matches!(failure.error, codegen_core::Error::Interrupted { .. });
                let header = attempts::Header {
                    step: step.id.clone(),
                    outcome: if interrupted { Outcome::Interrupted } else { Outcome::Failed },
                    key: key.clone(),
                    error: Some(crate::error::report(&failure)),
                    ended_at: attempts::now(),
                    partial: if interrupted { partial } else { None },
                };
                // Only history: a failure to keep it must not hide why the step failed.
                let kept = attempts::keep(layout, &header, &timed).is_ok();
                (progress.borrow_mut())(Progress::StepStopped { id: step.id.clone(), interrupted });
                if let codegen_core::Error::Interrupted { model_calls, during_call } = failure.error {
                    let during = match (model_calls, during_call) {
                        (0, _) => "before its first model call".to_string(),
                        (n, true) => {
                            format!("during model call {n} of {}, whose reply was abandoned", step.max_model_calls)
                        }
                        (n, false) => format!("after model call {n} of {}", step.max_model_calls),
                    };
                    return Err(Error::Interrupted {
                        id: step.id.clone(),
                        package: chain.package_name.clone(),
                        during,
                        kept,
                    });
                }
                let retry = matches!(
                    failure.error,
                    codegen_core::Error::BudgetExhausted { .. } | codegen_core::Error::CheckFailed { .. }
                );
                if retry && run < runs {
                    run += 1;
                    let seed = step.seed.unwrap_or(0) + u64::from(run - 1);
                    (progress.borrow_mut())(Progress::Retry {
                        id: step.id.clone(),
                        run,
                        seed,
                        reason: failure.error.to_string(),
                    });
                    continue;
                }
                return Err(Error::Step {
                    id: step.id.clone(),
                    package: chain.package_name.clone(),
                    runs: run,
                    kept,
                    source: Box::new(failure),
                });
            }
        };
        transcripts.push_str(&output.transcript.to_jsonl(Volatility::Omit));
        timed.push_str(&output.transcript.to_jsonl(Volatility::Keep));

        let mut files = Files::new();
        for path in &output.written {
            let bytes = codegen_core::__private::fs::read(&output_root.join(path))?;
            files.insert(path.clone(), bytes);
        }
        let put_off = output.transcript.events.iter().rev().find_map(|e| match e {
            Event::Check { asked_by_model: false, put_off, .. } => Some(put_off.is_some()),
            _ => None,
        });
        let totals = output.transcript.totals();
        let entry = LockedStep {
            id: step.id.clone(),
            key: key.clone(),
            model_calls: totals.model_calls,
            prompt_tokens: totals.prompt_tokens,
            completion_tokens: totals.completion_tokens,
            repairs: totals.repairs,
            check_rounds: totals.check_rounds,
            // Only a retry's seed differs from the one the fingerprint names.
            seed: if run == 1 { None } else { seed },
            fingerprint: assessed.fingerprint.clone(),
            files: files.iter().map(|(path, bytes)| LockedFile { path: path.clone(), sha256: sha256_hex(bytes) }).collect(),
        };
        let header = attempts::Header {
            step: step.id.clone(),
            outcome: Outcome::Succeeded,
            key,
            error: None,
            ended_at: attempts::now(),
            partial: None,
        };
        // The timings of what is about to be recorded, for `log`: history only.
        let _ = attempts::keep(layout, &header, &timed);
        return Ok(Ran { entry, files, transcript: transcripts, notes: output.notes, put_off: put_off == Some(true) });
    }
}

/// The running step's events and streaming replies, turned into [`Progress`]; and the reply
/// under way, kept in case the step is interrupted.
struct Watch<'a, 'p> {
    id: &'a str,
    max_model_calls: u32,
    started: Instant,
    calls: u32,
    tokens: u64,
    completion_tokens: u64,
    partial: Option<PartialReply>,
    progress: &'a RefCell<&'p mut dyn FnMut(Progress)>,
}

impl<'a, 'p> Watch<'a, 'p> {
    fn new(id: &'a str, max_model_calls: u32, progress: &'a RefCell<&'p mut dyn FnMut(Progress)>) -> Self {
        Watch {
            id,
            max_model_calls,
            started: Instant::now(),
            calls: 0,
            tokens: 0,
            completion_tokens: 0,
            partial: None,
            progress,
        }
    }

    fn show(&self, progress: Progress) {
        (self.progress.borrow_mut())(progress);
    }
}

impl Observer for Watch<'_, '_> {
    fn event(&mut self, event: &Event) {
        match event {
            Event::ModelCall { number, usage, volatile, .. } => {
                self.calls = *number;
                self.partial = None;
                self.tokens += usage.prompt_tokens.unwrap_or(0) + usage.completion_tokens.unwrap_or(0);
                self.completion_tokens += usage.completion_tokens.unwrap_or(0);
                self.show(Progress::ModelCall {
                    id: self.id.to_string(),
                    number: *number,
                    max_model_calls: self.max_model_calls,
                    tokens: self.tokens,
                    completion_tokens: self.completion_tokens,
                    call_tokens: usage.completion_tokens,
                    call_time: volatile.as_ref().map(|v| v.duration),
                    elapsed: self.started.elapsed(),
                });
            }
            Event::ToolRun { tool, ok, .. } => {
                self.show(Progress::ToolRan { id: self.id.to_string(), tool: tool.clone(), ok: *ok })
            }
            _ => {}
        }
    }

    fn progress(&mut self, report: &codegen_core::backend::Progress<'_>) {
        let call = self.calls + 1;
        let partial = self.partial.get_or_insert_with(|| PartialReply { model_call: call, ..PartialReply::default() });
        partial.pieces = report.pieces;
        partial.text.push_str(report.text);
        partial.tool = report.tool.map(str::to_string);
        // The call's arguments so far: usually what was kept plus the new end.
        match report.tool_arguments.strip_prefix(partial.arguments.as_str()) {
            Some(rest) => partial.arguments.push_str(rest),
            None => report.tool_arguments.clone_into(&mut partial.arguments),
        }
        self.show(Progress::Streaming {
            id: self.id.to_string(),
            call,
            max_model_calls: self.max_model_calls,
            pieces: report.pieces,
            chars: report.text_chars + report.argument_chars,
            tool: report.tool.map(str::to_string),
            call_elapsed: report.elapsed,
        });
    }
}

/// A step's check that says when it starts: a crate check can take a minute.
struct Announced<'a, 'p> {
    check: Box<dyn Check>,
    id: &'a str,
    progress: &'a RefCell<&'p mut dyn FnMut(Progress)>,
}

impl Check for Announced<'_, '_> {
    fn name(&self) -> String {
        self.check.name()
    }

    fn run(&mut self, output_root: &Path) -> Result<CheckOutcome, CheckError> {
        (self.progress.borrow_mut())(Progress::Checking { id: self.id.to_string(), check: self.check.name() });
        self.check.run(output_root)
    }
}

/// The sandbox of `step`'s model: it writes under `output_root` and reads its declared
/// inputs; with a check in the crate it may also read the crate's own source files (not part
/// of the step's key: the check, not the prompt, depends on them), since that check's
/// messages point into them. The sandbox's rules (no secrets, no links out of the package)
/// hold for all of them.
fn sandbox_for(chain: &Chain, step: &StepConfig, output_root: &std::path::Path) -> SandboxBuilder {
    let mut builder = Sandbox::builder(output_root).links_within(&chain.package_dir);
    let mut mounted: Vec<String> = Vec::new();
    for input in &step.inputs {
        builder = builder.input(input.virtual_path.clone(), input.real_path.clone());
        mounted.push(input.virtual_path.clone());
    }
    if matches!(step.check, CheckSpec::CargoCheck | CheckSpec::CargoTest) {
        for name in crate::check::CRATE_FILES_THE_MODEL_READS {
            let real = chain.package_dir.join(name);
            let taken = mounted.iter().any(|m| m == name || m.starts_with(&format!("{name}/")))
                || step.outputs.iter().any(|o| o == name || o.starts_with(&format!("{name}/")));
            if real.exists() && !taken {
                builder = builder.input(name, real);
            }
        }
    }
    builder
}

/// What `accept` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AcceptReport {
    /// Steps recorded from the pending area.
    pub accepted: Vec<String>,
    /// Pending steps that no longer match their declaration, discarded.
    pub outdated: Vec<String>,
}

/// Records the pending results in the committed lock and store, without calling a model.
/// Only pending steps that are still current are accepted; the pending area is then removed.
pub fn accept(chain: &Chain, layout: &Layout) -> Result<AcceptReport, Error> {
    let records = Records::read(layout)?;
    let Some(pending) = &records.pending else { return Ok(AcceptReport::default()) };
    let plan = crate::plan::plan(chain, &records)?;
    let order: Vec<String> = chain.steps.iter().map(|s| s.id.clone()).collect();
    let mut lock: Lock = records.lock.clone();
    let mut report = AcceptReport::default();
    for assessed in &plan {
        if assessed.state == StepState::Pending {
            let entry = assessed.entry.clone().expect("a pending step has its entry");
            records.pending_store.copy_step(&entry, &assessed.files, &records.store)?;
            lock.upsert(entry, &order);
            lock.write(&layout.lock_path())?;
            report.accepted.push(assessed.id.clone());
        } else if matches!(assessed.state, StepState::Stale(_)) && pending.step(&assessed.id).is_some() {
            report.outdated.push(assessed.id.clone());
        }
    }
    forget_removed_steps(chain, layout, &mut lock)?;
    discard_pending(layout)?;
    Ok(report)
}

/// Drops the steps that the manifest no longer declares from `lock` (written back) and
/// their folders and transcripts from the committed store; returns their ids.
fn forget_removed_steps(chain: &Chain, layout: &Layout, lock: &mut Lock) -> Result<Vec<String>, Error> {
    let removed: Vec<String> =
        lock.steps.iter().filter(|s| chain.step(&s.id).is_none()).map(|s| s.id.clone()).collect();
    lock.steps.retain(|s| chain.step(&s.id).is_some());
    lock.write(&layout.lock_path())?;
    let store = layout.store();
    for id in &removed {
        codegen_core::__private::fs::remove_dir_all(&store.step_dir(id))?;
        let transcript = store.transcript_path(id);
        if transcript.exists() {
            codegen_core::__private::fs::remove_file(&transcript)?;
        }
    }
    Ok(removed)
}

/// Removes the pending area of the package.
pub fn discard_pending(layout: &Layout) -> Result<(), Error> {
    Ok(codegen_core::__private::fs::remove_dir_all(&layout.pending_dir())?)
}
