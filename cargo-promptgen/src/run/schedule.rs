//! Running steps: each in a scratch copy of the tree the steps it runs after produced, up to
//! `jobs` at a time, then recording each result as it comes, one at a time.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use codegen_core::check::{Check, CheckError, CheckOutcome};
use codegen_core::sandbox::{Sandbox, SandboxBuilder};
use codegen_core::transcript::{Event, Volatility};
use codegen_core::{Cancel, Observer};

use crate::run::attempts::{self, Outcome, PartialReply};

use crate::check::crate_check::{CheckSetup, Later, check_for};
use crate::config::{Chain, CheckSpec, StepConfig};
use crate::error::Error;
use crate::files::sync_dir;
use crate::graph::Graph;
use crate::plan::assess::{Assessed, Records, StepState, Upstream, assess};
use crate::record::layout::Layout;
use crate::record::lock::{Lock, LockedFile, LockedStep, sha256_hex};
use crate::record::store::{Files, Storage};

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

/// The chain after a run: every step's record and the tree they produce together.
#[derive(Debug)]
pub struct ChainResult {
    /// Each step's usable record, in the chain's (id) order; a step that failed or was
    /// skipped has none.
    pub steps: Vec<(LockedStep, StepState)>,
    /// Steps that ran and were recorded in this call, in the order they finished.
    pub regenerated: Vec<String>,
    /// Steps whose results a build had left pending, recorded by this call.
    pub accepted: Vec<String>,
    /// Steps the lock recorded that the manifest no longer declares, removed by this call.
    pub removed: Vec<String>,
    /// Steps that failed, in the order they failed; nothing of them was recorded.
    pub failed: Vec<FailedStep>,
    /// Steps that did not run because a step they run after (transitively) failed, in the
    /// chain's order.
    pub skipped: Vec<SkippedStep>,
    /// The tree of every usable record, each step's files over those of the steps it runs
    /// after.
    pub tree: Files,
}

impl ChainResult {
    /// The error to give for the failed steps, if any: the first failure's. (The other
    /// failures and the skipped steps are in [`ChainResult::failed`] and
    /// [`ChainResult::skipped`].)
    pub fn into_failure(self) -> Result<ChainResult, Error> {
        if self.failed.is_empty() {
            return Ok(self);
        }
        let mut failed = self.failed;
        Err(failed.swap_remove(0).error)
    }
}

/// A step that failed: nothing of it was recorded.
#[derive(Debug)]
pub struct FailedStep {
    /// The step.
    pub id: String,
    /// Why.
    pub error: Error,
}

/// A step that did not run because a step it runs after failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedStep {
    /// The step.
    pub id: String,
    /// The failed steps it runs after, directly or not, in the chain's order.
    pub failed: Vec<String>,
}

/// Where a step is in a run.
enum Slot {
    /// Not ready yet, or ready and not assessed yet, or waiting for a free job.
    Waiting,
    /// Running on a thread of its own since then.
    Running(Instant),
    /// Done: its usable record, its files and their state.
    Done { entry: Box<LockedStep>, files: Files, state: StepState },
    /// Failed, or skipped because a step it runs after failed.
    Stopped,
}

impl Slot {
    fn entry(&self) -> Option<&LockedStep> {
        match self {
            Slot::Done { entry, .. } => Some(entry),
            _ => None,
        }
    }
}

/// What a step's thread tells the thread that records.
enum Message {
    Progress(Progress),
    Finished(usize, Box<std::thread::Result<Result<Ran, Error>>>),
}

/// Brings every step of the chain up to date at `destination`, running up to `jobs` steps at
/// once: a stale step (or one in `forced`) runs once the steps it runs after are done, in a
/// scratch tree holding their files and nothing else, and is recorded as soon as it succeeds;
/// fresh steps are taken as recorded; and results a build left in the pending area are
/// recorded too when `destination` is [`Destination::Committed`] (as `accept` would).
///
/// A failing step records nothing of itself and stops the steps that run after it, which are
/// [`ChainResult::skipped`]; steps independent of it go on, and are recorded. The result lists
/// the failures ([`ChainResult::into_failure`] turns them into the error). `Err` is for what
/// stops the whole run (the lock or the store cannot be written): no step starts after it,
/// and the results of the steps still running are not recorded.
///
/// Only the calling thread reads and writes the lock and the store, one step at a time; the
/// steps' model calls and checks run on threads of their own, and their [`Progress`] comes to
/// `progress` on the calling thread. Which steps run at the same time changes nothing a step
/// sees ([`the_rest_of_the_chain`]), so results do not depend on `jobs`.
/// Setting `cancel` stops the running steps at once ([`Error::Interrupted`]), recording
/// nothing of them, and starts no other step.
pub fn bring_up_to_date(
    chain: &Chain,
    layout: &Layout,
    forced: &[String],
    destination: Destination,
    jobs: usize,
    cancel: &Cancel,
    progress: &mut dyn FnMut(Progress),
) -> Result<ChainResult, Error> {
    let records = Records::read(layout)?;
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
    let graph = &chain.graph;
    let count = chain.steps.len();
    let mut result = ChainResult {
        steps: Vec::new(),
        regenerated: Vec::new(),
        accepted: Vec::new(),
        removed: Vec::new(),
        failed: Vec::new(),
        skipped: Vec::new(),
        tree: Files::new(),
    };
    let mut slots: Vec<Slot> = (0..count).map(|_| Slot::Waiting).collect();
    // How many of the steps each step runs after are not done yet.
    let mut waiting: Vec<usize> = (0..count).map(|i| graph.after(i).len()).collect();
    // Steps whose dependencies are done, to assess, by their place in the graph's order.
    let mut ready: BTreeSet<(usize, usize)> =
        (0..count).filter(|&i| waiting[i] == 0).map(|i| (graph.rank(i), i)).collect();
    // Stale steps waiting for a free job, by their place in the graph's order.
    let mut queued: BTreeMap<usize, (usize, Assessed)> = BTreeMap::new();
    // The failed steps each skipped step runs after.
    let mut skipped: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    // Each step's files as recorded before this run, read when a step first needs the rest of
    // the chain mounted for its check. Not updated as steps finish: what a step's check mounts
    // must not depend on which independent steps happened to finish first.
    let mut recorded: Option<BTreeMap<String, Files>> = None;
    // Steps whose check could only run in part, to run in full once the chain is complete.
    let mut put_off = Vec::new();
    let mut fatal: Option<Error> = None;
    let (sender, receiver) = mpsc::channel::<Message>();

    std::thread::scope(|scope| {
        let mut running = 0;
        loop {
            // Assess every step whose dependencies are done: fresh ones are taken at once, and
            // release the steps after them; stale ones wait for a job.
            while fatal.is_none()
                && let Some((rank, index)) = ready.pop_first()
            {
                let step = &chain.steps[index];
                let upstream =
                    Upstream::Recorded(graph.after(index).iter().filter_map(|&d| slots[d].entry()).collect());
                let force = forced.iter().any(|id| id == &step.id);
                let assessed = match assess(chain, step, &upstream, &records, force) {
                    Ok(assessed) => assessed,
                    Err(error) => {
                        stop(chain, index, error, &mut slots, &mut skipped, &mut result, progress);
                        continue;
                    }
                };
                if let StepState::Stale(_) = assessed.state {
                    queued.insert(rank, (index, assessed));
                    continue;
                }
                let state = assessed.state.clone();
                let entry = assessed.entry.clone().expect("a usable step has its entry");
                let recording = match (destination, &state) {
                    // Keep the pending lock whole: it is accepted as one.
                    (Destination::Pending, StepState::Fresh) => {
                        target_lock.upsert(entry.clone(), &order);
                        Ok(())
                    }
                    // A build already made this result: record it as `accept` would.
                    (Destination::Committed, StepState::Pending) => records
                        .pending_store
                        .copy_step(&entry, &assessed.files, &target_store)
                        .and_then(|()| {
                            target_lock.upsert(entry.clone(), &order);
                            target_lock.write(&target_lock_path)
                        })
                        .map(|()| result.accepted.push(step.id.clone())),
                    _ => Ok(()),
                };
                if let Err(error) = recording {
                    fatal = Some(error);
                    break;
                }
                let state = if destination == Destination::Committed { StepState::Fresh } else { state };
                slots[index] = Slot::Done { entry: Box::new(entry), files: assessed.files, state };
                release(graph, index, &mut waiting, &mut ready);
            }
            // Start stale steps while there are free jobs.
            while fatal.is_none()
                && running < jobs.max(1)
                && let Some((_, (index, assessed))) = queued.pop_first()
            {
                let step = &chain.steps[index];
                if let StepState::Stale(reasons) = &assessed.state {
                    // The last of the steps it runs after, in the graph's order, and its state.
                    let after = graph.after(index).iter().max_by_key(|&&d| graph.rank(d)).map(|&d| {
                        let word = match &slots[d] {
                            Slot::Done { .. } if result.regenerated.contains(&chain.steps[d].id) => "regenerated",
                            Slot::Done { state: StepState::Pending, .. } => "pending",
                            _ => "recorded",
                        };
                        (chain.steps[d].id.clone(), word)
                    });
                    progress(Progress::StepStarted {
                        id: step.id.clone(),
                        reasons: reasons.clone(),
                        max_model_calls: step.max_model_calls,
                        after,
                    });
                }
                let tree = tree_of(graph, &graph.dependencies(index), &slots);
                let recorded = recorded.get_or_insert_with(|| recorded_files(chain, &records));
                let (mounted, later) = the_rest_of_the_chain(chain, index, recorded);
                let sender = sender.clone();
                slots[index] = Slot::Running(Instant::now());
                running += 1;
                scope.spawn(move || {
                    let mut forward = |p: Progress| {
                        let _ = sender.send(Message::Progress(p));
                    };
                    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        let check_tree = layout.check_tree_dir(&step.id);
                        let surroundings = Surroundings { tree: &tree, mounted, later, check_tree, cancel };
                        run_step(chain, layout, step, &assessed, surroundings, &mut forward)
                    }));
                    let _ = sender.send(Message::Finished(index, Box::new(ran)));
                });
            }
            if running == 0 {
                break;
            }
            // The calling thread holds a sender, so this waits for a message, never for nothing.
            let Ok(message) = receiver.recv() else { break };
            let (index, ran) = match message {
                Message::Progress(p) => {
                    progress(p);
                    continue;
                }
                Message::Finished(index, ran) => (index, ran),
            };
            running -= 1;
            let ran = match *ran {
                Ok(ran) => ran,
                // A bug in a step's thread is a bug of the run: let it surface as one.
                Err(panic) => std::panic::resume_unwind(panic),
            };
            let ran = match ran {
                Ok(ran) if fatal.is_none() => ran,
                // The run is stopping: nothing more is recorded.
                Ok(_) => continue,
                // An interruption stops the whole run: no step starts after it, and the steps
                // still running (interrupted too) record nothing.
                Err(error @ Error::Interrupted { .. }) => {
                    if fatal.is_none() {
                        fatal = Some(error);
                    }
                    continue;
                }
                Err(error) => {
                    stop(chain, index, error, &mut slots, &mut skipped, &mut result, progress);
                    continue;
                }
            };
            let step = &chain.steps[index];
            let recording = target_store.save(&ran.entry, &ran.files, Some(&ran.transcript)).and_then(|()| {
                target_lock.upsert(ran.entry.clone(), &order);
                target_lock.write(&target_lock_path)
            });
            if let Err(error) = recording {
                fatal = Some(error);
                continue;
            }
            if ran.put_off {
                put_off.push(index);
            }
            let elapsed = match slots[index] {
                Slot::Running(started) => started.elapsed(),
                _ => Duration::ZERO,
            };
            result.regenerated.push(step.id.clone());
            progress(Progress::StepDone {
                id: step.id.clone(),
                entry: Box::new(ran.entry.clone()),
                notes: ran.notes,
                elapsed,
            });
            let state = match destination {
                Destination::Committed => StepState::Fresh,
                Destination::Pending => StepState::Pending,
            };
            slots[index] = Slot::Done { entry: Box::new(ran.entry), files: ran.files, state };
            release(graph, index, &mut waiting, &mut ready);
        }
    });
    if let Some(error) = fatal {
        return Err(error);
    }
    result.skipped = skipped
        .into_iter()
        .map(|(index, failed)| SkippedStep {
            id: chain.steps[index].id.clone(),
            failed: failed.into_iter().map(|f| chain.steps[f].id.clone()).collect(),
        })
        .collect();
    result.tree = tree_of(graph, graph.order(), &slots);
    result.steps = slots
        .into_iter()
        .filter_map(|slot| match slot {
            Slot::Done { entry, state, .. } => Some((*entry, state)),
            _ => None,
        })
        .collect();
    if result.failed.is_empty() {
        // A check mounts the steps its step does not run after as they were recorded before
        // the run, so it judged the whole tree only if every step that ran is among its step's
        // dependencies; in a line, the last step that ran is such a step. When none is, each
        // step that ran is checked again on the whole tree, as are the checks put off.
        let ran: Vec<usize> = result.regenerated.iter().filter_map(|id| chain.index(id)).collect();
        let seen_whole = ran.iter().any(|&t| ran.iter().all(|&s| s == t || graph.depends_on(t, s)));
        let mut again: Vec<usize> = ran
            .iter()
            .copied()
            .filter(|&s| put_off.contains(&s) || (!seen_whole && chain.steps[s].check != CheckSpec::None))
            .collect();
        again.sort_by_key(|&s| graph.rank(s));
        for index in again {
            check_in_full(chain, layout, &chain.steps[index], &result.tree, cancel)?;
        }
    }
    match destination {
        Destination::Pending if !result.regenerated.is_empty() => {
            target_lock.steps.retain(|s| order.contains(&s.id));
            target_lock.write(&target_lock_path)?;
        }
        Destination::Committed if result.failed.is_empty() => {
            result.removed = forget_removed_steps(chain, layout, &mut target_lock)?
        }
        Destination::Committed | Destination::Pending => {}
    }
    Ok(result)
}

/// Marks `index` done for the steps that run after it, and those left waiting for nothing
/// ready.
fn release(graph: &Graph, index: usize, waiting: &mut [usize], ready: &mut BTreeSet<(usize, usize)>) {
    for &next in graph.dependents(index) {
        waiting[next] -= 1;
        if waiting[next] == 0 {
            ready.insert((graph.rank(next), next));
        }
    }
}

/// Records that step `index` failed with `error`, and skips the steps that run after it.
fn stop(
    chain: &Chain,
    index: usize,
    error: Error,
    slots: &mut [Slot],
    skipped: &mut BTreeMap<usize, Vec<usize>>,
    result: &mut ChainResult,
    progress: &mut dyn FnMut(Progress),
) {
    let id = chain.steps[index].id.clone();
    progress(Progress::StepFailed { id: id.clone(), error: crate::error::report(&error) });
    result.failed.push(FailedStep { id, error });
    slots[index] = Slot::Stopped;
    for dependent in chain.graph.all_dependents(index) {
        slots[dependent] = Slot::Stopped;
        let failed = skipped.entry(dependent).or_default();
        failed.push(index);
        failed.sort_unstable();
    }
}

/// The files of the done steps among `steps` (in the graph's order), each step's over those of
/// the steps before it.
fn tree_of(graph: &Graph, steps: &[usize], slots: &[Slot]) -> Files {
    let mut ordered = steps.to_vec();
    ordered.sort_by_key(|&s| graph.rank(s));
    let mut tree = Files::new();
    for index in ordered {
        if let Slot::Done { files, .. } = &slots[index] {
            for (path, bytes) in files {
                tree.insert(path.clone(), bytes.clone());
            }
        }
    }
    tree
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
        let pending = records
            .pending
            .as_ref()
            .and_then(|lock| lock.step(&step.id))
            .and_then(|e| records.pending_store.load(e).ok());
        let files = pending.or_else(|| records.lock.step(&step.id).and_then(|e| records.store.load(e).ok()));
        if let Some(files) = files {
            recorded.insert(step.id.clone(), files);
        }
    }
    recorded
}

/// For the check of step `index`: the recorded files of the chain's *other* steps (every step
/// that is not among its dependencies, nor the step itself: its dependents and the steps
/// independent of it), mounted beneath its candidate tree so that the crate is whole, and what
/// those steps own, so that errors about them are not blamed on this step (a module no step
/// has written yet included). Its dependencies' files are in its own tree already. See
/// `check.rs`.
pub fn the_rest_of_the_chain(chain: &Chain, index: usize, recorded: &BTreeMap<String, Files>) -> (Files, Later) {
    let mut mounted = Files::new();
    let mut later = Later::default();
    let others = (0..chain.steps.len()).filter(|&other| other != index && !chain.graph.depends_on(index, other));
    let mut others: Vec<usize> = others.collect();
    // Where two of them hold a path, the one later in the graph's order wins, as in the crate.
    others.sort_by_key(|&other| chain.graph.rank(other));
    for step in others.into_iter().map(|other| &chain.steps[other]) {
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
        tree_dir: layout.check_tree_dir(&step.id),
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
/// its check (`mounted`, `later`), where its check mounts them (`check_tree`), and the flag
/// that stops it.
pub(crate) struct Surroundings<'a> {
    pub tree: &'a Files,
    pub mounted: Files,
    pub later: Later,
    pub check_tree: PathBuf,
    pub cancel: &'a Cancel,
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
    let Surroundings { tree, mounted, later, check_tree, cancel } = surroundings;
    let work = layout.work_dir();
    codegen_core::__private::fs::create_dir_all(&work)?;
    let prompt = codegen_core::__private::fs::read_to_string(&step.prompt)?;
    let system_prompt = step.system_prompt.as_deref().map(codegen_core::__private::fs::read_to_string).transpose()?;
    let scratch = codegen_core::__private::fs::temp_dir_in(&work, &format!("{}-", step.id))?;
    let output_root = scratch.path().join("tree");
    sync_dir(&output_root, tree)?;
    let mut sandbox = sandbox_for(chain, step, &output_root)
        .build()
        .map_err(|source| Error::Sandbox { id: step.id.clone(), source })?;

    let mut core_step = codegen_core::Step::new(step.model.clone(), prompt);
    core_step
        .max_model_calls(step.max_model_calls)
        .protocol(step.protocol)
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
            for path in &output.written {
                files.insert(path.clone(), codegen_core::__private::fs::read(&output_root.join(path))?);
            }
        }
        Err(_) => {
            for path in crate::record::store::walk_files(&output_root) {
                let bytes = codegen_core::__private::fs::read(&output_root.join(&path))?;
                if tree.get(&path) != Some(&bytes) {
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
fn run_step(
    chain: &Chain,
    layout: &Layout,
    step: &StepConfig,
    assessed: &Assessed,
    surroundings: Surroundings<'_>,
    progress: &mut dyn FnMut(Progress),
) -> Result<Ran, Error> {
    let mut backend_config = chain.backend_config(step);
    backend_config.cancel = surroundings.cancel.clone();
    let mut backend = backend_config.open().map_err(|source| Error::Backend { id: step.id.clone(), source })?;
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
            files: files
                .iter()
                .map(|(path, bytes)| LockedFile { path: path.clone(), sha256: sha256_hex(bytes) })
                .collect(),
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
        for name in crate::check::crate_check::CRATE_FILES_THE_MODEL_READS {
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
    let plan = crate::plan::assess::plan(chain, &records)?;
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
