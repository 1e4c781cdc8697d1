//! Scheduling a chain: each step once the steps it runs after are done, up to `jobs` at a
//! time on threads of their own, each result recorded on the calling thread as it comes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use codegen_core::Cancel;

use crate::config::Chain;
use crate::error::{Error, report};
use crate::files::{Files, overlay};
use crate::plan::assess::{Assessed, StepState, Upstream, assess};
use crate::record::commit::{Destination, Recorder};
use crate::record::layout::Layout;
use crate::record::lock::LockedStep;
use crate::record::records::Records;
use crate::run::attempt::{Ran, Surroundings, run_step};
use crate::run::progress::Progress;
use crate::run::recheck::recheck;
use crate::run::revision::Revision;
use crate::run::surroundings::{recorded_files, the_rest_of_the_chain};

/// What to bring up to date, where, and how.
#[derive(Clone, Copy)]
pub struct Schedule<'a> {
    /// The chain.
    pub chain: &'a Chain,
    /// Its package's folders.
    pub layout: &'a Layout,
    /// Steps to run even when they are fresh (`--step`, `--force`).
    pub forced: &'a [String],
    /// Only these steps and the stale steps they run after (transitively) may run (`--step`);
    /// `None`: every stale step. A stale step left out is [`ChainResult::left`], with every
    /// step that runs after it.
    pub only: Option<&'a [String]>,
    /// Where the results are recorded.
    pub destination: Destination,
    /// Steps that may run at once (at least one does).
    pub jobs: usize,
    /// Set to stop: the running steps end at once and record nothing, and no other starts.
    pub cancel: &'a Cancel,
}

/// The chain after a run: every step's record and the tree they produce together.
#[derive(Debug, Default)]
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
    /// Stale steps that were not asked for ([`Schedule::only`]), and the steps that run after
    /// them, in the chain's order: still stale.
    pub left: Vec<String>,
    /// What a stopped run had left in the record, and what this one did about it before it
    /// wrote anything (see `record::commit::recover`).
    pub recovered: Vec<String>,
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
    /// Stale and not asked for, or after such a step: left as it is.
    Left,
}

/// What a step's thread tells the thread that records.
enum Message {
    Progress(Progress),
    Finished(usize, Box<std::thread::Result<Result<Ran, Error>>>),
}

/// Which steps are where: ready to be assessed, waiting for a job, running, done, stopped.
struct Steps<'a> {
    chain: &'a Chain,
    slots: Vec<Slot>,
    /// How many of the steps each step runs after are not done yet.
    waiting: Vec<usize>,
    /// Steps whose dependencies are done, to assess, by their place in the graph's order.
    ready: BTreeSet<(usize, usize)>,
    /// Stale steps waiting for a free job, by their place in the graph's order.
    queued: BTreeMap<usize, (usize, Assessed)>,
    /// The failed steps each skipped step runs after.
    skipped: BTreeMap<usize, Vec<usize>>,
}

impl<'a> Steps<'a> {
    fn new(chain: &'a Chain) -> Steps<'a> {
        let graph = &chain.graph;
        let count = chain.steps.len();
        let waiting: Vec<usize> = (0..count).map(|i| graph.after(i).len()).collect();
        let ready = (0..count).filter(|&i| waiting[i] == 0).map(|i| (graph.rank(i), i)).collect();
        Steps {
            chain,
            slots: (0..count).map(|_| Slot::Waiting).collect(),
            waiting,
            ready,
            queued: BTreeMap::new(),
            skipped: BTreeMap::new(),
        }
    }

    /// What the steps `index` runs after handed over: each of them is done.
    fn upstream(&self, index: usize) -> Upstream<'_> {
        let entry = |d: usize| match &self.slots[d] {
            Slot::Done { entry, .. } => Some(&**entry),
            _ => None,
        };
        Upstream::Recorded(self.chain.graph.after(index).iter().filter_map(|&d| entry(d)).collect())
    }

    /// Step `index` is done with `entry` and `files`: the steps after it may be assessed once
    /// their other dependencies are done too.
    fn done(&mut self, index: usize, entry: LockedStep, files: Files, state: StepState) {
        self.slots[index] = Slot::Done { entry: Box::new(entry), files, state };
        let graph = &self.chain.graph;
        for &next in graph.dependents(index) {
            self.waiting[next] -= 1;
            if self.waiting[next] == 0 {
                self.ready.insert((graph.rank(next), next));
            }
        }
    }

    /// Step `index` failed: it and the steps that run after it, transitively, are stopped.
    fn stop(&mut self, index: usize) {
        self.slots[index] = Slot::Stopped;
        for dependent in self.chain.graph.all_dependents(index) {
            self.slots[dependent] = Slot::Stopped;
            let failed = self.skipped.entry(dependent).or_default();
            failed.push(index);
            failed.sort_unstable();
        }
    }

    /// Step `index` is stale and may not run: it and the steps that run after it are left.
    fn leave(&mut self, index: usize) {
        self.slots[index] = Slot::Left;
        for dependent in self.chain.graph.all_dependents(index) {
            self.slots[dependent] = Slot::Left;
        }
    }

    /// The last of the steps `index` runs after, in the graph's order, and its state now:
    /// `regenerated` (in this run), `recorded` or `pending`.
    fn last_dependency(&self, index: usize, regenerated: &[String]) -> Option<(String, &'static str)> {
        let graph = &self.chain.graph;
        graph.after(index).iter().max_by_key(|&&d| graph.rank(d)).map(|&d| {
            let id = &self.chain.steps[d].id;
            let word = match &self.slots[d] {
                Slot::Done { .. } if regenerated.contains(id) => "regenerated",
                Slot::Done { state: StepState::Pending, .. } => "pending",
                _ => "recorded",
            };
            (id.clone(), word)
        })
    }

    /// The files of the done steps among `steps`, each over those before it in the graph's order.
    fn tree(&self, steps: impl IntoIterator<Item = usize>) -> Files {
        overlay(&self.chain.graph, steps, |i| match &self.slots[i] {
            Slot::Done { files, .. } => Some(files),
            _ => None,
        })
    }
}

impl Schedule<'_> {
    /// Brings every step of the chain up to date at `destination`, running up to `jobs` steps
    /// at once: a stale step (or one in `forced`) runs once the steps it runs after are done,
    /// in a scratch tree holding their files and nothing else, and is recorded as soon as it
    /// succeeds; fresh steps are taken as recorded; and results a build left in the pending
    /// area are recorded too when `destination` is [`Destination::Committed`] (as `accept`
    /// would).
    ///
    /// A failing step records nothing of itself and stops the steps that run after it, which
    /// are [`ChainResult::skipped`]; steps independent of it go on, and are recorded. The
    /// result lists the failures ([`ChainResult::into_failure`] turns them into the error).
    /// `Err` is for what stops the whole run (the lock or the store cannot be written, an
    /// interruption): no step starts after it, and the results of the steps still running are
    /// not recorded.
    ///
    /// Only the calling thread reads and writes the lock and the store, one step at a time;
    /// the steps' model calls and checks run on threads of their own, and their [`Progress`]
    /// comes to `progress` on the calling thread. Which steps run at the same time changes
    /// nothing a step sees ([`the_rest_of_the_chain`]), so results do not depend on `jobs`.
    pub fn bring_up_to_date(&self, progress: &mut dyn FnMut(Progress)) -> Result<ChainResult, Error> {
        let Schedule { chain, layout, forced, only, destination, jobs, cancel } = *self;
        // The steps that may run: those asked for and what they run after.
        let may_run: Option<Vec<bool>> = only.map(|ids| {
            let mut allowed = vec![false; chain.steps.len()];
            for index in ids.iter().filter_map(|id| chain.index(id)) {
                allowed[index] = true;
                for dependency in chain.graph.dependencies(index) {
                    allowed[dependency] = true;
                }
            }
            allowed
        });
        let records = Records::read(layout)?;
        let mut recorder = Recorder::open(chain, layout, &records, destination)?;
        let mut steps = Steps::new(chain);
        let mut result = ChainResult { recovered: std::mem::take(&mut recorder.recovered), ..ChainResult::default() };
        // Each step's files as recorded before this run, read when a step first needs the rest
        // of the chain mounted for its check. Not updated as steps finish: what a step's check
        // mounts must not depend on which independent steps happened to finish first.
        let mut recorded: Option<BTreeMap<String, Files>> = None;
        // Steps whose check could only run in part, to run in full once the chain is complete.
        let mut put_off = Vec::new();
        let mut fatal: Option<Error> = None;
        let fail = |steps: &mut Steps<'_>,
                    result: &mut ChainResult,
                    index: usize,
                    error: Error,
                    progress: &mut dyn FnMut(Progress)| {
            let id = chain.steps[index].id.clone();
            progress(Progress::StepFailed { id: id.clone(), error: report(&error) });
            result.failed.push(FailedStep { id, error });
            steps.stop(index);
        };
        let (sender, receiver) = mpsc::channel::<Message>();

        std::thread::scope(|scope| {
            let mut running = 0;
            loop {
                // Assess every step whose dependencies are done: fresh ones are taken at once,
                // and release the steps after them; stale ones wait for a job.
                while fatal.is_none()
                    && let Some((rank, index)) = steps.ready.pop_first()
                {
                    let step = &chain.steps[index];
                    let force = forced.iter().any(|id| id == &step.id);
                    let assessed = match assess(chain, step, &steps.upstream(index), &records, force) {
                        Ok(assessed) => assessed,
                        Err(error) => {
                            fail(&mut steps, &mut result, index, error, progress);
                            continue;
                        }
                    };
                    if let StepState::Stale(_) = assessed.state {
                        if may_run.as_ref().is_some_and(|allowed| !allowed[index]) {
                            steps.leave(index);
                        } else {
                            steps.queued.insert(rank, (index, assessed));
                        }
                        continue;
                    }
                    let entry = assessed.entry.clone().expect("a usable step has its entry");
                    let pending = assessed.state == StepState::Pending;
                    match recorder.take(&records, &entry, &assessed.files, pending) {
                        Ok(true) => result.accepted.push(step.id.clone()),
                        Ok(false) => {}
                        Err(error) => {
                            fatal = Some(error);
                            break;
                        }
                    }
                    let state = if destination == Destination::Committed { StepState::Fresh } else { assessed.state };
                    steps.done(index, entry, assessed.files, state);
                }
                // Start stale steps while there are free jobs.
                while fatal.is_none()
                    && running < jobs.max(1)
                    && let Some((_, (index, assessed))) = steps.queued.pop_first()
                {
                    let step = &chain.steps[index];
                    let revision = match &assessed.state {
                        StepState::Stale(reasons) => Revision::of(step, &records, reasons, &assessed.fingerprint.key()),
                        _ => None,
                    };
                    if let StepState::Stale(reasons) = &assessed.state {
                        progress(Progress::StepStarted {
                            id: step.id.clone(),
                            reasons: reasons.clone(),
                            starts_from: revision.iter().flat_map(|r| r.files.keys().cloned()).collect(),
                            max_model_calls: step.max_model_calls,
                            after: steps.last_dependency(index, &result.regenerated),
                        });
                    }
                    let tree = steps.tree(chain.graph.dependencies(index));
                    let recorded = recorded.get_or_insert_with(|| recorded_files(chain, &records));
                    let (mounted, later) = the_rest_of_the_chain(chain, index, recorded);
                    let sender = sender.clone();
                    steps.slots[index] = Slot::Running(Instant::now());
                    running += 1;
                    scope.spawn(move || {
                        let mut forward = |p: Progress| {
                            let _ = sender.send(Message::Progress(p));
                        };
                        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            let check_tree = layout.check_tree_dir(&step.id);
                            let revision = revision.as_ref();
                            let surroundings =
                                Surroundings { tree: &tree, mounted, later, check_tree, cancel, revision };
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
                    // An interruption stops the whole run: no step starts after it, and the
                    // steps still running (interrupted too) record nothing.
                    Err(error @ Error::Interrupted { .. }) => {
                        fatal.get_or_insert(error);
                        continue;
                    }
                    Err(error) => {
                        fail(&mut steps, &mut result, index, error, progress);
                        continue;
                    }
                };
                let step = &chain.steps[index];
                if let Err(error) = recorder.record(&ran.entry, &ran.files, &ran.transcript) {
                    fatal = Some(error);
                    continue;
                }
                if ran.put_off {
                    put_off.push(index);
                }
                let elapsed = match steps.slots[index] {
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
                steps.done(index, ran.entry, ran.files, state);
            }
        });
        if let Some(error) = fatal {
            return Err(error);
        }
        result.tree = steps.tree(chain.graph.order().iter().copied());
        result.skipped = std::mem::take(&mut steps.skipped)
            .into_iter()
            .map(|(index, failed)| SkippedStep {
                id: chain.steps[index].id.clone(),
                failed: failed.into_iter().map(|f| chain.steps[f].id.clone()).collect(),
            })
            .collect();
        result.left = (0..chain.steps.len())
            .filter(|&i| matches!(steps.slots[i], Slot::Left))
            .map(|i| chain.steps[i].id.clone())
            .collect();
        result.steps = steps
            .slots
            .into_iter()
            .filter_map(|slot| match slot {
                Slot::Done { entry, state, .. } => Some((*entry, state)),
                _ => None,
            })
            .collect();
        if result.failed.is_empty() {
            let ran: Vec<usize> = result.regenerated.iter().filter_map(|id| chain.index(id)).collect();
            recheck(chain, layout, &ran, &put_off, &result.tree, cancel)?;
        }
        result.removed = recorder.finish(chain, layout, !result.regenerated.is_empty(), !result.failed.is_empty())?;
        Ok(result)
    }
}
