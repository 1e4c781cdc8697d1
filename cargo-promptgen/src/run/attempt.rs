//! One step's run: the loop in a scratch copy of the tree, with the step's check, again with
//! the next seed after a failed run (`seed_retries`); what it reports as it goes, and the
//! attempt it keeps for `log`. Nothing outside the scratch folders and the check's tree
//! changes: recording is the scheduler's.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::time::Instant;

use codegen_core::check::{Check, CheckError, CheckOutcome};
use codegen_core::fs;
use codegen_core::sandbox::{Sandbox, SandboxBuilder};
use codegen_core::transcript::{Event, Volatility};
use codegen_core::{Cancel, Observer};

use crate::check::crate_check::Later;
use crate::check::setup::{CRATE_FILES_THE_MODEL_READS, CheckSetup, check_for};
use crate::config::{Chain, CheckSpec, StepConfig};
use crate::error::Error;
use crate::files::{Files, sync_dir, walk_files};
use crate::hash::sha256_hex;
use crate::plan::assess::Assessed;
use crate::record::layout::Layout;
use crate::record::lock::{LockedFile, LockedStep};
use crate::run::attempts::{self, Outcome, PartialReply};
use crate::run::progress::Progress;
use crate::run::revision::Revision;

/// A step that ran and succeeded, ready to be recorded.
pub(crate) struct Ran {
    /// Its lock entry.
    pub entry: LockedStep,
    /// Its files.
    pub files: Files,
    /// Its runs' transcripts, volatile fields left out: what the store keeps.
    pub transcript: String,
    /// Notes from the loop (e.g. a protocol fallback).
    pub notes: Vec<String>,
    /// Its check passed only in part: the rest runs once the chain is complete.
    pub put_off: bool,
}

/// What a step runs among: the tree the steps before it produced, the rest of the chain for
/// its check (`mounted`, `later`), where its check mounts them (`check_tree`), the flag
/// that stops it, and, for a re-run by edit, the recorded files it starts from.
pub(crate) struct Surroundings<'a> {
    pub tree: &'a Files,
    pub mounted: Files,
    pub later: Later,
    pub check_tree: PathBuf,
    pub cancel: &'a Cancel,
    pub revision: Option<&'a Revision>,
}

/// How one run of a step ended, before anything of it is recorded.
pub(crate) struct Attempted {
    /// What the loop returned.
    pub outcome: Result<codegen_core::StepOutput, codegen_core::StepFailure>,
    /// The step's files: on success those it wrote, on failure those its output root holds that
    /// the tree it started from did not (or held otherwise).
    pub files: Files,
    /// The reply under way when the run was interrupted, if any.
    pub partial: Option<PartialReply>,
}

/// One run of the loop for `step` with `seed`, in a fresh scratch copy of the tree, with the
/// step's check. Nothing outside the scratch folders and the check's tree changes. `cargo promptgen` runs it once per seed it tries, and
/// `eval` once per trial.
pub(crate) fn attempt(
    chain: &Chain,
    layout: &Layout,
    step: &StepConfig,
    seed: Option<u64>,
    backend: &mut dyn codegen_core::backend::Backend,
    surroundings: &Surroundings<'_>,
    progress: &RefCell<&mut dyn FnMut(Progress)>,
) -> Result<Attempted, Error> {
    let Surroundings { tree, mounted, later, check_tree, cancel, revision } = surroundings;
    let work = layout.work_dir();
    fs::create_dir_all(&work)?;
    let prompt = fs::read_to_string(&step.prompt)?;
    let mut system_prompt = step.system_prompt.as_deref().map(fs::read_to_string).transpose()?;
    // A re-run by edit starts from the step's recorded files, and is told what changed.
    let mut start = (*tree).clone();
    if let Some(revision) = revision {
        start.extend(revision.files.iter().map(|(path, bytes)| (path.clone(), bytes.clone())));
        let told = revision.instructions(step.protocol, &prompt);
        system_prompt = Some(match system_prompt {
            Some(own) => format!("{}\n\n{told}", own.trim_end()),
            None => told,
        });
    }
    let scratch = fs::temp_dir_in(&work, &format!("{}-", step.id))?;
    let output_root = scratch.path().join("tree");
    sync_dir(&output_root, &start)?;
    let mut sandbox = sandbox_for(chain, step, &output_root)
        .build()
        .map_err(|source| Error::Sandbox { id: step.id.clone(), source })?;

    let mut core_step = codegen_core::Step::new(step.model.clone(), prompt);
    core_step
        .max_model_calls(step.max_model_calls)
        .protocol(step.protocol)
        .constrain(step.constrain)
        .check_rounds(step.check_rounds)
        .cancel_on((*cancel).clone());
    if let Some(text) = system_prompt {
        core_step.system_prompt(text);
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

    let mut watch = Watch::new(&step.id, step.max_model_calls, progress);
    let setup = CheckSetup {
        chain,
        layout,
        step,
        scratch: scratch.path().join("check"),
        tree_dir: check_tree.clone(),
        mounted: mounted.clone(),
        later: later.clone(),
        cancel: (*cancel).clone(),
    };
    let mut check = check_for(setup).map(|check| Announced { check, id: &step.id, progress });
    let outcome = core_step.run_with(backend, &mut sandbox, check.as_mut().map(|c| c as &mut dyn Check), &mut watch);
    let partial = watch.partial.take();
    let mut files = Files::new();
    match &outcome {
        Ok(output) => {
            // What it wrote, and the recorded files it started from and kept.
            let kept = revision.iter().flat_map(|r| r.files.keys());
            for path in output.written.iter().chain(kept) {
                files.insert(path.clone(), fs::read(&output_root.join(path))?);
            }
        }
        Err(_) => {
            for path in walk_files(&output_root) {
                let bytes = fs::read(&output_root.join(&path))?;
                if start.get(&path) != Some(&bytes) {
                    files.insert(path, bytes);
                }
            }
        }
    }
    Ok(Attempted { outcome, files, partial })
}

/// Runs one step in a scratch copy of the tree, with the rest of the chain for its check;
/// again with the next seed after a failed run, up to `seed_retries` times. Nothing outside
/// the scratch folders changes, except that each run's transcript is kept under the target
/// folder for `cargo promptgen log` (see [`crate::run::attempts`]).
pub(crate) fn run_step(
    chain: &Chain,
    layout: &Layout,
    step: &StepConfig,
    assessed: &Assessed,
    surroundings: Surroundings<'_>,
    progress: &mut dyn FnMut(Progress),
) -> Result<Ran, Error> {
    if step.outputs.is_empty() {
        return Err(Error::NoOutputs { id: step.id.clone() });
    }
    let mut backend_config = step.backend.clone();
    backend_config.cancel = surroundings.cancel.clone();
    let opened = match surroundings.revision {
        Some(_) => backend_config.open_for_edit(),
        None => backend_config.open(),
    };
    let mut backend = opened.map_err(|source| Error::Backend { id: step.id.clone(), source })?;
    let key = assessed.fingerprint.key();
    let progress = RefCell::new(progress);

    let mut transcripts = String::new();
    // The same runs with their timings, kept for `log`.
    let mut timed = String::new();
    let runs = step.seed_retries + 1;
    let mut run = 1;
    loop {
        let seed = step.seed_for_run(run - 1);
        let Attempted { outcome, files, partial } =
            attempt(chain, layout, step, seed, backend.as_mut(), &surroundings, &progress)?;
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
                    let seed = step.seed_for_run(run - 1).unwrap_or_default();
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
            transcript: Some(sha256_hex(transcripts.as_bytes())),
            fingerprint: assessed.fingerprint.clone(),
            files: files
                .iter()
                .map(|(path, bytes)| LockedFile { path: path.clone(), sha256: sha256_hex(bytes) })
                .collect(),
            made_from: surroundings.revision.map(Revision::made_from).unwrap_or_default(),
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
pub(crate) struct Watch<'a, 'p> {
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
        for name in CRATE_FILES_THE_MODEL_READS {
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
