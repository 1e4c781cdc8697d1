//! `cargo promptgen eval`: how reliable a chain is, per step and per model, protocol,
//! constraint and way of starting (by edit or from nothing).
//!
//! A *trial* is one step × model × protocol × constraint × start × seed: the whole loop, in a
//! throwaway copy of the tree, with the step's check (the crate check and, with `check =
//! "cargo test"`, the crate's tests), as `cargo promptgen` would run it. The steps it runs
//! after contribute their recorded files, so that each step is measured on its own; with
//! `--chain`, each trial runs the whole chain fresh instead, each step on what the steps
//! before it wrote in the same trial. Seeds are `seed, seed + 1, ...` from the step's
//! configured seed (0 when none). The protocol and the constraint are the step's own unless
//! the run varies them (`--protocol`, `--constrain`), so that constrained and unconstrained
//! decoding can be compared on the same steps and seeds. A trial starts from nothing unless
//! the run asks for trials by edit (`--regenerate edit`): those start from the step's recorded
//! outputs and are told why the step would run again (nothing, when it is not stale), as a
//! re-run by edit is. Every trial measures its diff from the recorded outputs, so that the
//! two ways can be compared by the diff a reviewer would read and the tokens they cost.
//!
//! Nothing here writes the lock, the store or the pending area: a trial's files live in its
//! scratch folder, its check uses a check folder of its own worker, and what is kept goes to
//! the run's folder (see [`record`]). Each finished trial is appended to `trials.jsonl` at
//! once, so an interrupted run resumes where it stopped.
//!
//! Up to `jobs` trials run at once, but no more than `requests` model requests are in flight
//! (one, by default, for a server on this machine, which often serves one request at a time):
//! with two jobs, one trial's check runs while another talks to the model. A request that
//! waits for its turn has not been sent, so its time limits have not started.

pub mod error;
pub mod record;
pub mod score;

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Condvar, Mutex, mpsc};
use std::time::{Duration, Instant};

use codegen_core::backend::{Backend, BackendError, BackendKind, ChatRequest, ChatResponse, Progress as Streamed};
use codegen_core::check::CheckOutcome;
use codegen_core::constrain::Enforcement;
use codegen_core::transcript::{Event, Transcript, Volatility};
use codegen_core::{Cancel, Constrain, ToolProtocol};
use serde_json::json;

use crate::check::setup::{CheckSetup, check_for};
use crate::config::{Chain, CheckSpec, Regenerate, StepConfig};
use crate::error::{Error, report};
use crate::files::{Files, overlay, read_tree, sync_dir};
use crate::hash::sha256_hex;
use crate::plan::assess::{StepState, plan};
use crate::record::layout::Layout;
use crate::record::lock::LockedFile;
use crate::record::records::Records;
use crate::run::attempt::{Attempted, Surroundings, attempt};
use crate::run::attempts;
use crate::run::progress::Progress;
use crate::run::revision::Revision;
use crate::run::surroundings::{recorded_files, the_rest_of_the_chain};
use error::EvalError;
use record::{RunDir, RunPlan, TrialRecord, Variant, Verdict};
use score::Row;

/// What to evaluate.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// The steps (`--step`); empty for every step.
    pub steps: Vec<String>,
    /// The models (`--model`); empty for the configured one.
    pub models: Vec<String>,
    /// The protocols (`--protocol`); empty for each step's configured one.
    pub protocols: Vec<ToolProtocol>,
    /// Whether the server is asked to enforce the protocol (`--constrain`); empty for each
    /// step's configured `constrain`.
    pub constrain: Vec<Constrain>,
    /// How the trials start (`--regenerate`): by edit from the step's recorded outputs, or
    /// from nothing; empty for from nothing alone, as before the flag.
    pub regenerate: Vec<Regenerate>,
    /// Trials per step × variant (model, protocol, constraint, regenerate).
    pub seeds: u32,
    /// Run the whole chain fresh in each trial (`--chain`).
    pub chain: bool,
    /// Send this temperature instead of the configured one.
    pub temperature: Option<f64>,
}

/// How to run the trials.
#[derive(Debug, Clone)]
pub struct Pace {
    /// Trials at once.
    pub jobs: usize,
    /// Model requests in flight at once; `None`: one for a server on this machine (or any
    /// Ollama), `jobs` for others.
    pub requests: Option<usize>,
    /// Set to stop: running trials end at once and are not recorded.
    pub cancel: Cancel,
}

/// What an evaluation reports as it goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    /// The run begins (or resumes): its name, the trials it holds and how many are done.
    Began {
        /// The run's name.
        run: String,
        /// Its folder.
        dir: PathBuf,
        /// Trials in all.
        trials: usize,
        /// Trials already done (when resuming).
        done: usize,
        /// Whether the run varies the protocol or the constraint, so that a trial's line
        /// should name them.
        varies_decoding: bool,
        /// Whether the run compares trials by edit with trials from nothing, so that a trial's
        /// line should say how it started.
        varies_regenerate: bool,
    },
    /// A trial (or with `--chain`, a chain trial's step) finished and was recorded.
    Finished(Box<TrialRecord>),
}

/// A run's trials and what they add up to.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The run's folder.
    pub run: RunDir,
    /// What it was asked to do.
    pub plan: RunPlan,
    /// Every finished trial, in the order they finished.
    pub trials: Vec<TrialRecord>,
    /// Trials not run because the run was interrupted.
    pub left: usize,
    /// Settings that make the numbers mean less than they seem.
    pub warnings: Vec<String>,
}

impl Outcome {
    /// One row per step × variant (and with `--chain`, one per variant for the whole chain),
    /// with pass^`k` and each step's threshold.
    pub fn rows(&self, k: usize, min_pass_rate: &dyn Fn(&str) -> Option<f64>) -> Vec<Row> {
        let variants = self.plan.variants();
        let mut rows = score::rows(&self.trials, &self.plan.steps, &variants, k, min_pass_rate);
        if self.plan.chain {
            rows.extend(score::rows(&chain_trials(&self.trials), &["chain".into()], &variants, k, &|_| None));
        }
        rows
    }

    /// Model calls and tokens spent by the trials.
    pub fn spent(&self) -> (u64, u64) {
        let calls = self.trials.iter().map(|t| u64::from(t.model_calls)).sum();
        let tokens = self.trials.iter().map(|t| t.prompt_tokens + t.completion_tokens).sum();
        (calls, tokens)
    }

    /// `summary.json`: the plan, the rows, what was spent and the warnings.
    pub fn summary(&self, rows: &[Row]) -> serde_json::Value {
        let (calls, tokens) = self.spent();
        json!({
            "run": self.run.name,
            "plan": self.plan,
            "rows": rows,
            "trials": self.trials.len(),
            "left": self.left,
            "spent": { "model_calls": calls, "tokens": tokens },
            "warnings": self.warnings,
            "passed": rows.iter().all(Row::meets_threshold) && self.left == 0,
        })
    }
}

/// A chain trial's steps as one trial each: passed when every step passed.
fn chain_trials(trials: &[TrialRecord]) -> Vec<TrialRecord> {
    let mut units: BTreeMap<String, Vec<&TrialRecord>> = BTreeMap::new();
    for trial in trials {
        if let Some((unit, _)) = trial.trial.rsplit_once('.') {
            units.entry(unit.to_string()).or_default().push(trial);
        }
    }
    units
        .into_iter()
        .map(|(unit, steps)| {
            let mut classes: Vec<String> = Vec::new();
            for step in &steps {
                classes.extend(step.classes.iter().map(|c| format!("step {}: {c}", step.step)));
                if step.skipped {
                    classes.push(format!("step {}: skipped", step.step));
                }
            }
            let hashes: Vec<&str> = steps.iter().filter_map(|s| s.output_hash.as_deref()).collect();
            let all = |f: &dyn Fn(&TrialRecord) -> bool| steps.iter().all(|s| !s.skipped && f(s));
            // The steps share a protocol where the run set one; else it is theirs only if they agree.
            let protocol = &steps[0].protocol;
            TrialRecord {
                trial: unit,
                step: "chain".into(),
                model: steps[0].model.clone(),
                protocol: if steps.iter().all(|s| &s.protocol == protocol) { protocol.clone() } else { String::new() },
                constrain: steps[0].constrain,
                regenerate: steps[0].regenerate,
                made_from: steps.iter().flat_map(|s| s.made_from.iter().cloned()).collect(),
                // A skipped step has none: the chain trial failed, and no row averages its diff.
                diff_lines: steps.iter().map(|s| s.diff_lines).sum(),
                constrained: all(&|s| s.constrained),
                replies: steps.iter().map(|s| s.replies).sum(),
                runnable_replies: steps.iter().map(|s| s.runnable_replies).sum(),
                seed: steps[0].seed,
                temperature: steps[0].temperature,
                passed: all(&|s| s.passed),
                skipped: false,
                check: if all(&|s| s.check == Verdict::Passed) { Verdict::Passed } else { Verdict::Failed },
                tests: None,
                classes,
                error: None,
                finish_asked: all(&|s| s.finish_asked),
                model_calls: steps.iter().map(|s| s.model_calls).sum(),
                prompt_tokens: steps.iter().map(|s| s.prompt_tokens).sum(),
                completion_tokens: steps.iter().map(|s| s.completion_tokens).sum(),
                wall_ms: steps.iter().map(|s| s.wall_ms).sum(),
                transcript: None,
                output_hash: (!hashes.is_empty()).then(|| sha256_hex(hashes.join("\n").as_bytes())),
                files: Vec::new(),
            }
        })
        .collect()
}

/// One piece of work for a worker.
#[derive(Debug, Clone, Copy)]
enum Unit {
    /// One step (by index) with one variant (by its place in [`RunPlan::variants`]) and seed.
    Step { step: usize, variant: usize, seed: u64 },
    /// The whole chain, the `n`-th time, with one variant.
    Chain { n: u32, variant: usize },
}

/// Trial `n`'s seed: the step's seed, then the ones after it (0, 1, ... when it sets none).
fn step_seed(step: &StepConfig, n: u32) -> u64 {
    step.seed_for_run(n).unwrap_or_default()
}

/// The trial names a unit records.
fn unit_trials(chain: &Chain, plan: &RunPlan, variants: &[Variant], unit: Unit) -> Vec<String> {
    match unit {
        Unit::Step { step, variant, seed } => {
            vec![format!("{}.{}.s{seed}", chain.steps[step].id, variants[variant].tag())]
        }
        Unit::Chain { n, variant } => {
            plan.steps.iter().map(|id| format!("chain{n}.{}.{id}", variants[variant].tag())).collect()
        }
    }
}

fn units(chain: &Chain, plan: &RunPlan, variants: &[Variant]) -> Vec<Unit> {
    let mut units = Vec::new();
    if plan.chain {
        for n in 0..plan.seeds {
            for variant in 0..variants.len() {
                units.push(Unit::Chain { n, variant });
            }
        }
        return units;
    }
    // Seed-major, so that an interrupted run has measured every row a little.
    for n in 0..plan.seeds {
        for id in &plan.steps {
            let step = chain.index(id).expect("the plan's steps are the chain's");
            for variant in 0..variants.len() {
                units.push(Unit::Step { step, variant, seed: step_seed(&chain.steps[step], n) });
            }
        }
    }
    units
}

/// `values` without repeats, in the order first given.
fn distinct<T: PartialEq + Clone>(values: &[T]) -> Vec<T> {
    let mut kept: Vec<T> = Vec::new();
    for value in values {
        if !kept.contains(value) {
            kept.push(value.clone());
        }
    }
    kept
}

/// Starts a new evaluation run of `spec`.
pub fn start(
    chain: &Chain,
    layout: &Layout,
    spec: &Spec,
    pace: &Pace,
    report: &mut dyn FnMut(Report),
) -> Result<Outcome, EvalError> {
    let problem = |problem: String| EvalError::Unusable { package: chain.package_name.clone(), problem };
    for id in &spec.steps {
        chain.require_step(id)?;
    }
    if spec.chain && !spec.steps.is_empty() {
        return Err(problem("`--chain` runs every step; it cannot be combined with `--step`".into()));
    }
    if spec.seeds == 0 {
        return Err(problem("`--seeds 0` asks for no trials; give at least 1".into()));
    }
    let steps: Vec<String> = chain
        .steps
        .iter()
        .filter(|s| spec.steps.is_empty() || spec.steps.contains(&s.id))
        .map(|s| s.id.clone())
        .collect();
    let mut models = distinct(&spec.models);
    if models.is_empty() {
        let configured: Vec<&str> = chain.steps.iter().map(|s| s.model.as_str()).collect();
        // A chain whose steps use different models is evaluated with each step's own.
        models.push(if configured.windows(2).all(|w| w[0] == w[1]) {
            configured.first().copied().unwrap_or_default().to_string()
        } else {
            CONFIGURED.to_string()
        });
    }
    let records = Records::read(layout)?;
    let keys = plan(chain, &records)?
        .into_iter()
        .filter(|a| steps.contains(&a.id))
        .map(|a| (a.id.clone(), a.fingerprint.key()))
        .collect();
    let now = attempts::now();
    let run = RunDir::create(layout, &chain.package_name, now)?;
    let plan = RunPlan {
        package: chain.package_name.clone(),
        chain: spec.chain,
        steps,
        models,
        protocols: distinct(&spec.protocols),
        constrain: distinct(&spec.constrain),
        regenerate: distinct(&spec.regenerate),
        seeds: spec.seeds,
        temperature: spec.temperature,
        keys,
        replay_of: None,
        started_at: now,
    };
    run.write_plan(&plan)?;
    execute(chain, layout, run, plan, &records, pace, report)
}

/// `--model` not given and the steps use different models: each step's configured one.
const CONFIGURED: &str = "(configured)";

/// Resumes run `name` (the latest of the package when `None`): its finished trials are kept,
/// and the others run.
pub fn resume(
    chain: &Chain,
    layout: &Layout,
    name: Option<&str>,
    pace: &Pace,
    report: &mut dyn FnMut(Report),
) -> Result<Outcome, EvalError> {
    let run = RunDir::open(layout, &chain.package_name, name)?;
    let plan = run.read_plan()?;
    let records = Records::read(layout)?;
    if let Some(original) = plan.replay_of.clone() {
        return rejudge(chain, layout, run, plan, &original, pace, report);
    }
    let now: BTreeMap<String, String> =
        crate::plan::assess::plan(chain, &records)?.into_iter().map(|a| (a.id.clone(), a.fingerprint.key())).collect();
    for (id, key) in &plan.keys {
        match now.get(id) {
            Some(current) if current == key => {}
            Some(_) => {
                return Err(EvalError::Unusable {
                    package: chain.package_name.clone(),
                    problem: format!(
                        "step `{id}` changed (its prompt, inputs, settings or the steps it runs after) since run `{}` \
                         began, so new trials would not measure the same thing; start a new run",
                        run.name
                    ),
                });
            }
            None => {
                return Err(EvalError::Unusable {
                    package: chain.package_name.clone(),
                    problem: format!("step `{id}` of run `{}` is no longer declared; start a new run", run.name),
                });
            }
        }
    }
    execute(chain, layout, run, plan, &records, pace, report)
}

/// Judges the trials of run `name` again with the current checks and tests, on the files each
/// trial ended with, calling no model: a trial whose model asked to finish passes or fails by
/// today's check; the others (no finish, broken calls, a server error) keep their outcome,
/// since no check judged them. The result is a new run.
pub fn replay(
    chain: &Chain,
    layout: &Layout,
    name: &str,
    pace: &Pace,
    report: &mut dyn FnMut(Report),
) -> Result<Outcome, EvalError> {
    let original = RunDir::open(layout, &chain.package_name, Some(name))?;
    let mut plan = original.read_plan()?;
    let now = attempts::now();
    let run = RunDir::create(layout, &chain.package_name, now)?;
    plan.replay_of = Some(original.name.clone());
    plan.started_at = now;
    run.write_plan(&plan)?;
    rejudge(chain, layout, run, plan, &original.name, pace, report)
}

fn rejudge(
    chain: &Chain,
    layout: &Layout,
    run: RunDir,
    plan: RunPlan,
    original: &str,
    pace: &Pace,
    report: &mut dyn FnMut(Report),
) -> Result<Outcome, EvalError> {
    let source = RunDir::open(layout, &chain.package_name, Some(original))?;
    let judged = source.read_trials()?;
    let mut trials = run.read_trials()?;
    report(Report::Began {
        run: run.name.clone(),
        dir: run.dir.clone(),
        trials: judged.len(),
        done: trials.len(),
        varies_decoding: plan.varies_decoding(),
        varies_regenerate: plan.varies_regenerate(),
    });
    let records = Records::read(layout)?;
    let recorded = recorded_files(chain, &records);
    for old in judged {
        if trials.iter().any(|t| t.trial == old.trial) {
            continue;
        }
        if pace.cancel.is_cancelled() {
            break;
        }
        let mut new = old.clone();
        if let Some(transcript) = &old.transcript {
            let text = codegen_core::fs::read_to_string(&source.dir.join(transcript))?;
            new.transcript = Some(run.write_transcript(&old.trial, &text)?);
        }
        let kept = source.tree_dir(&old.trial);
        if kept.is_dir() {
            sync_dir(&run.tree_dir(&old.trial), &read_tree(&kept)?)?;
        }
        if let Some(step) = chain.step(&old.step).filter(|_| old.finish_asked && !old.skipped && kept.is_dir()) {
            let index = chain.index(&step.id).expect("a step of the chain");
            let (mounted, later) = the_rest_of_the_chain(chain, index, &recorded);
            let work = layout.work_dir();
            codegen_core::fs::create_dir_all(&work)?;
            let scratch = codegen_core::fs::temp_dir_in(&work, &format!("{}-replay-", step.id))?;
            let root = scratch.path().join("tree");
            sync_dir(&root, &read_tree(&kept)?)?;
            let setup = CheckSetup {
                chain,
                layout,
                step,
                scratch: scratch.path().join("check"),
                tree_dir: layout.check_tree_dir(".eval-0"),
                mounted,
                later,
                cancel: pace.cancel.clone(),
            };
            let with_tests = step.check == CheckSpec::CargoTest;
            let scored = match check_for(setup).map(|mut check| check.run(&root)) {
                None => score::rechecked(None, false, with_tests),
                Some(Ok(CheckOutcome::Passed)) => score::rechecked(None, false, with_tests),
                Some(Ok(CheckOutcome::PutOff(_))) => score::rechecked(None, true, with_tests),
                Some(Ok(CheckOutcome::Failed(diagnostics))) => {
                    score::rechecked(Some(&diagnostics.findings), false, with_tests)
                }
                // An outcome of a newer codegen-core: counted as a failed check.
                Some(Ok(_)) => score::rechecked(Some(&Default::default()), false, with_tests),
                Some(Err(_)) if pace.cancel.is_cancelled() => break,
                Some(Err(error)) => score::Scored {
                    check: Verdict::NotRun,
                    tests: with_tests.then_some(Verdict::NotRun),
                    classes: vec![format!("check could not run: {error}")],
                },
            };
            new.passed =
                scored.classes.is_empty() && scored.check == Verdict::Passed && scored.tests != Some(Verdict::Failed);
            new.check = scored.check;
            new.tests = scored.tests;
            new.classes = scored.classes;
            new.error = None;
        }
        run.append_trial(&new)?;
        report(Report::Finished(Box::new(new.clone())));
        trials.push(new);
    }
    let total = source.read_trials()?.len();
    let left = total.saturating_sub(trials.len());
    let warnings = warnings(chain, &plan);
    Ok(Outcome { run, plan, trials, left, warnings })
}

/// Settings that make seeds, and so the spread the table shows, mean less than they seem.
pub fn warnings(chain: &Chain, plan: &RunPlan) -> Vec<String> {
    let mut warnings = Vec::new();
    if plan.replay_of.is_some() {
        return warnings;
    }
    // Temperature 0 is greedy decoding: llama.cpp's server and vLLM then ignore the seed, and
    // Ollama often does.
    let ignores_seed = match chain.backend.kind {
        BackendKind::Ollama => "on Ollama, which then often ignores the seed",
        BackendKind::OpenAi => "(greedy decoding: llama.cpp's server and vLLM then ignore the seed)",
        BackendKind::Scripted => {
            warnings.push(
                "the scripted backend replays the same turns whatever the seed: every trial of a step measures the \
                 same script"
                    .into(),
            );
            return warnings;
        }
    };
    let greedy: Vec<&str> = plan
        .steps
        .iter()
        .filter_map(|id| chain.step(id))
        .filter(|s| plan.temperature.or(s.temperature) == Some(0.0))
        .map(|s| s.id.as_str())
        .collect();
    if !greedy.is_empty() && plan.seeds > 1 {
        let (steps, samples) = if greedy.len() == 1 { ("step", "samples") } else { ("steps", "sample") };
        warnings.push(format!(
            "{steps} {} {samples} at temperature 0 {ignores_seed}: the {seeds} seeds may measure one output {seeds} \
             times. `--temperature 0.7` (or any value above 0) shows the spread.",
            greedy.join(", "),
            seeds = plan.seeds,
        ));
    }
    warnings
}

/// Shared by the workers.
struct Work<'a> {
    chain: &'a Chain,
    layout: &'a Layout,
    run: &'a RunDir,
    plan: &'a RunPlan,
    /// The plan's variants, which units name by their place.
    variants: Vec<Variant>,
    /// Each step's recorded files before the run (pending results first, as a build).
    recorded: BTreeMap<String, Files>,
    /// What each evaluated step's trials by edit start from, when the run has such trials and
    /// the step has recorded outputs.
    revisions: BTreeMap<String, Revision>,
    gate: Gate,
    cancel: Cancel,
}

enum Message {
    Done(Vec<TrialRecord>),
    Failed(EvalError),
}

fn execute(
    chain: &Chain,
    layout: &Layout,
    run: RunDir,
    plan: RunPlan,
    records: &Records,
    pace: &Pace,
    report: &mut dyn FnMut(Report),
) -> Result<Outcome, EvalError> {
    let mut trials = run.read_trials()?;
    let variants = plan.variants();
    let all = units(chain, &plan, &variants);
    let total: usize = all.iter().map(|&u| unit_trials(chain, &plan, &variants, u).len()).sum();
    let todo: VecDeque<Unit> = all
        .into_iter()
        .filter(|&u| {
            unit_trials(chain, &plan, &variants, u).iter().any(|name| !trials.iter().any(|t| &t.trial == name))
        })
        .collect();
    report(Report::Began {
        run: run.name.clone(),
        dir: run.dir.clone(),
        trials: total,
        done: trials.len(),
        varies_decoding: plan.varies_decoding(),
        varies_regenerate: plan.varies_regenerate(),
    });
    let recorded = recorded_files(chain, records);
    if !plan.chain {
        for id in &plan.steps {
            let index = chain.index(id).expect("a step of the chain");
            if let Some(missing) =
                chain.graph.dependencies(index).iter().find(|&&d| !recorded.contains_key(&chain.steps[d].id))
            {
                return Err(EvalError::Unusable {
                    package: chain.package_name.clone(),
                    problem: format!(
                        "step `{id}` runs after step `{}`, which has no recorded output to start from; record it with \
                         `cargo promptgen -p {}`, or evaluate the whole chain with `--chain`",
                        chain.steps[*missing].id, chain.package_name
                    ),
                });
            }
        }
    }
    let revisions =
        if plan.regenerate.contains(&Regenerate::Edit) { revisions(chain, &plan, records)? } else { BTreeMap::new() };
    let requests = pace.requests.unwrap_or_else(|| if serves_one_at_a_time(chain) { 1 } else { pace.jobs.max(1) });
    let work = Work {
        chain,
        layout,
        run: &run,
        plan: &plan,
        variants,
        recorded,
        revisions,
        gate: Gate::new(requests.max(1)),
        cancel: pace.cancel.clone(),
    };
    let queue = Mutex::new(todo);
    let workers = pace.jobs.max(1).min(queue.lock().map(|q| q.len()).unwrap_or(1)).max(1);
    let (sender, receiver) = mpsc::channel::<Message>();
    let mut failure: Option<EvalError> = None;
    std::thread::scope(|scope| {
        for slot in 0..workers {
            let sender = sender.clone();
            let (work, queue) = (&work, &queue);
            scope.spawn(move || {
                loop {
                    if work.cancel.is_cancelled() {
                        break;
                    }
                    let Some(unit) = queue.lock().ok().and_then(|mut q| q.pop_front()) else { break };
                    let message = match run_unit(work, unit, slot) {
                        Ok(Some(records)) => Message::Done(records),
                        // Interrupted: nothing of it is recorded.
                        Ok(None) => break,
                        Err(error) => Message::Failed(error),
                    };
                    if sender.send(message).is_err() {
                        break;
                    }
                }
            });
        }
        drop(sender);
        for message in receiver {
            match message {
                Message::Done(records) => {
                    for record in records {
                        if failure.is_none()
                            && let Err(error) = run.append_trial(&record)
                        {
                            failure = Some(error);
                            work.cancel.cancel();
                        }
                        report(Report::Finished(Box::new(record.clone())));
                        trials.push(record);
                    }
                }
                Message::Failed(error) => {
                    if failure.is_none() {
                        failure = Some(error);
                    }
                    // Stop the other workers: the run cannot go on as asked.
                    work.cancel.cancel();
                }
            }
        }
    });
    if let Some(error) = failure {
        return Err(error);
    }
    let left = total.saturating_sub(trials.len());
    let mut warnings = warnings(chain, &plan);
    if plan.regenerate.contains(&Regenerate::Edit) {
        let nothing: Vec<&str> =
            plan.steps.iter().filter(|id| !work.revisions.contains_key(*id)).map(String::as_str).collect();
        if !nothing.is_empty() {
            let (steps, have) = if nothing.len() == 1 { ("step", "has") } else { ("steps", "have") };
            warnings.push(format!(
                "{steps} {} {have} no recorded outputs: {} trials by edit started from nothing, as fresh ones do \
                 (their records say so: `made_from` is empty). Record {} with `cargo promptgen -p {}` to measure \
                 edits.",
                nothing.join(", "),
                if nothing.len() == 1 { "its" } else { "their" },
                if nothing.len() == 1 { "it" } else { "them" },
                chain.package_name
            ));
        }
    }
    Ok(Outcome { run, plan, trials, left, warnings })
}

/// What each of the plan's steps starts from in a trial by edit: its recorded outputs, and why
/// it would run again (the plan's reasons when it is stale, none when it is not). A step with
/// nothing recorded has none: its trials by edit start from nothing.
fn revisions(chain: &Chain, plan: &RunPlan, records: &Records) -> Result<BTreeMap<String, Revision>, EvalError> {
    let mut revisions = BTreeMap::new();
    for assessed in crate::plan::assess::plan(chain, records)? {
        let Some(step) = chain.step(&assessed.id).filter(|s| plan.steps.contains(&s.id)) else { continue };
        let reasons = match assessed.state {
            StepState::Stale(reasons) => reasons,
            StepState::Fresh | StepState::Pending => Vec::new(),
        };
        if let Some(revision) = Revision::for_trial(step, records, &reasons) {
            revisions.insert(step.id.clone(), revision);
        }
    }
    Ok(revisions)
}

/// Whether the chain's server is likely one that serves a request at a time: any Ollama (it
/// queues by default), and any server on this machine.
fn serves_one_at_a_time(chain: &Chain) -> bool {
    let url = chain.effective_base_url().unwrap_or_default();
    let host = url.split("://").nth(1).unwrap_or(&url).split(['/', '?']).next().unwrap_or_default();
    let host =
        host.rsplit_once(':').map(|(h, _)| h).filter(|h| !h.ends_with(']') || h.starts_with('[')).unwrap_or(host);
    chain.backend.kind == BackendKind::Ollama
        || host == "localhost"
        || host.starts_with("127.")
        || host == "[::1]"
        || host == "0.0.0.0"
}

/// Runs one unit; `None` when it was interrupted.
fn run_unit(work: &Work<'_>, unit: Unit, slot: usize) -> Result<Option<Vec<TrialRecord>>, EvalError> {
    let chain = work.chain;
    match unit {
        Unit::Step { step, variant, seed } => {
            let tree = dependencies_tree(chain, step, &|id| work.recorded.get(id));
            let name = unit_trials(chain, work.plan, &work.variants, unit).remove(0);
            let variant = &work.variants[variant];
            Ok(run_trial(work, step, variant, seed, &tree, &name, slot)?.map(|(record, _)| vec![record]))
        }
        Unit::Chain { n, variant } => {
            let mut produced: BTreeMap<String, Files> = BTreeMap::new();
            let mut failed: Vec<usize> = Vec::new();
            let mut records = Vec::new();
            let names = unit_trials(chain, work.plan, &work.variants, unit);
            let variant = &work.variants[variant];
            for &index in chain.graph.order() {
                let step = &chain.steps[index];
                let name =
                    names.iter().find(|n| n.ends_with(&format!(".{}", step.id))).expect("a trial per step").clone();
                let seed = step_seed(step, n);
                if failed.iter().any(|&f| chain.graph.depends_on(index, f)) {
                    failed.push(index);
                    records.push(skipped(work, step, variant, seed, &name));
                    continue;
                }
                let tree = dependencies_tree(chain, index, &|id| produced.get(id));
                let Some((record, files)) = run_trial(work, index, variant, seed, &tree, &name, slot)? else {
                    return Ok(None);
                };
                if !record.passed {
                    failed.push(index);
                }
                produced.insert(step.id.clone(), files);
                records.push(record);
            }
            Ok(Some(records))
        }
    }
}

fn skipped(work: &Work<'_>, step: &StepConfig, variant: &Variant, seed: u64, name: &str) -> TrialRecord {
    TrialRecord {
        trial: name.to_string(),
        step: step.id.clone(),
        model: variant.model.clone(),
        protocol: variant.protocol.unwrap_or(step.protocol).as_str().to_string(),
        constrain: variant.constrain.unwrap_or(step.constrain),
        regenerate: variant.mode(),
        made_from: Vec::new(),
        diff_lines: None,
        constrained: false,
        replies: 0,
        runnable_replies: 0,
        seed,
        temperature: work.plan.temperature.or(step.temperature),
        passed: false,
        skipped: true,
        check: Verdict::NotRun,
        tests: (step.check == CheckSpec::CargoTest).then_some(Verdict::NotRun),
        classes: Vec::new(),
        error: None,
        finish_asked: false,
        model_calls: 0,
        prompt_tokens: 0,
        completion_tokens: 0,
        wall_ms: 0,
        transcript: None,
        output_hash: None,
        files: Vec::new(),
    }
}

/// The files step `index` starts from: those of the steps it runs after, transitively, each
/// over the ones before it in the graph's order.
fn dependencies_tree<'f>(chain: &Chain, index: usize, files_of: &dyn Fn(&str) -> Option<&'f Files>) -> Files {
    overlay(&chain.graph, chain.graph.dependencies(index), |d| files_of(&chain.steps[d].id))
}

/// Runs one trial; `None` when it was interrupted. Also returns the trial's own files.
fn run_trial(
    work: &Work<'_>,
    index: usize,
    variant: &Variant,
    seed: u64,
    tree: &Files,
    name: &str,
    slot: usize,
) -> Result<Option<(TrialRecord, Files)>, EvalError> {
    let chain = work.chain;
    let mut step = chain.steps[index].clone();
    let model_name = &variant.model;
    if model_name != CONFIGURED {
        model_name.clone_into(&mut step.model);
    }
    if let Some(protocol) = variant.protocol {
        step.protocol = protocol;
    }
    if let Some(constrain) = variant.constrain {
        step.constrain = constrain;
    }
    if let Some(temperature) = work.plan.temperature {
        step.temperature = Some(temperature);
    }
    // A step with nothing recorded has no revision: its trial by edit starts from nothing.
    let revision = match variant.mode() {
        Regenerate::Edit => work.revisions.get(&step.id),
        Regenerate::Fresh => None,
    };
    let mut config = step.backend.clone();
    config.cancel = work.cancel.clone();
    // As `cargo promptgen` opens it: a script answers a re-run by edit from its own turns.
    let opened = if revision.is_some() { config.open_for_edit() } else { config.open() };
    let backend = opened.map_err(|source| Error::Backend { id: step.id.clone(), source })?;
    let mut backend = Gated { inner: backend, gate: &work.gate, cancel: &work.cancel };
    let (mounted, later) = the_rest_of_the_chain(chain, index, &work.recorded);
    let check_tree = work.layout.check_tree_dir(&format!(".eval-{slot}"));
    let surroundings = Surroundings { tree, mounted, later, check_tree, cancel: &work.cancel, revision };
    let mut quiet = |_: Progress| {};
    let progress: RefCell<&mut dyn FnMut(Progress)> = RefCell::new(&mut quiet);
    let started = Instant::now();
    let Attempted { outcome, files, .. } =
        attempt(chain, work.layout, &step, Some(seed), &mut backend, &surroundings, &progress)?;
    let wall = started.elapsed();
    let with_tests = step.check == CheckSpec::CargoTest;
    let (transcript, scored, error) = match &outcome {
        Ok(output) => (&output.transcript, score::passed(&output.transcript, with_tests), None),
        Err(failure) if matches!(failure.error, codegen_core::Error::Interrupted { .. }) => return Ok(None),
        Err(failure) => (
            &failure.transcript,
            score::classify(&failure.error, &failure.transcript, with_tests),
            Some(report(failure)),
        ),
    };
    let totals = transcript.totals();
    let replies = transcript.replies();
    let finish_asked =
        outcome.is_ok() || transcript.events.iter().any(|e| matches!(e, Event::Check { asked_by_model: false, .. }));
    let transcript_path = work.run.write_transcript(name, &transcript.to_jsonl(Volatility::Keep))?;
    // The step's outputs as the trial left them: a failed trial's `files` are only those it
    // changed, so the recorded files it started from and kept are added back.
    let mut ended: Files = revision.map(|r| r.files.clone()).unwrap_or_default();
    ended.extend(files);
    let mut judged = tree.clone();
    judged.extend(ended.iter().map(|(p, b)| (p.clone(), b.clone())));
    sync_dir(&work.run.tree_dir(name), &judged)?;
    let recorded: Files = work
        .recorded
        .get(&step.id)
        .into_iter()
        .flatten()
        .filter(|(path, _)| step.outputs.contains(*path))
        .map(|(path, bytes)| (path.clone(), bytes.clone()))
        .collect();
    let locked: Vec<LockedFile> =
        ended.iter().map(|(path, bytes)| LockedFile { path: path.clone(), sha256: sha256_hex(bytes) }).collect();
    let output_hash = (!locked.is_empty()).then(|| {
        let listing: String = locked.iter().map(|f| format!("{}\0{}\n", f.path, f.sha256)).collect();
        sha256_hex(listing.as_bytes())
    });
    let passed = outcome.is_ok() && scored.tests != Some(Verdict::NotRun);
    let record = TrialRecord {
        trial: name.to_string(),
        step: step.id.clone(),
        model: model_name.clone(),
        protocol: step.protocol.as_str().to_string(),
        constrain: step.constrain,
        regenerate: variant.mode(),
        made_from: revision.map(Revision::made_from).unwrap_or_default(),
        diff_lines: Some(score::diff_lines(&recorded, &ended)),
        constrained: enforced(transcript),
        replies: replies.sent,
        runnable_replies: replies.runnable,
        seed,
        temperature: step.temperature,
        passed,
        skipped: false,
        check: scored.check,
        tests: scored.tests,
        classes: scored.classes,
        error,
        finish_asked,
        model_calls: totals.model_calls,
        prompt_tokens: totals.prompt_tokens,
        completion_tokens: totals.completion_tokens,
        wall_ms: u64::try_from(wall.as_millis()).unwrap_or(u64::MAX),
        transcript: Some(transcript_path),
        output_hash,
        files: locked,
    };
    Ok(Some((record, ended)))
}

/// Whether the server enforced the step's protocol: the step planned a constraint and some
/// model call went out under it. A server that refused it answered nothing constrained.
fn enforced(transcript: &Transcript) -> bool {
    let planned = transcript.events.iter().any(|e| matches!(e, Event::Constrained { .. }));
    planned && transcript.events.iter().any(|e| matches!(e, Event::ModelCall { constraint: Some(_), .. }))
}

/// A counting semaphore for model requests, whose waits end when the run is cancelled.
struct Gate {
    free: Mutex<usize>,
    freed: Condvar,
}

impl Gate {
    fn new(permits: usize) -> Gate {
        Gate { free: Mutex::new(permits), freed: Condvar::new() }
    }

    /// Waits for a permit; `false` if the run was cancelled first.
    fn enter(&self, cancel: &Cancel) -> bool {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if cancel.is_cancelled() {
                return false;
            }
            if *free > 0 {
                *free -= 1;
                return true;
            }
            // Cancel does not signal this condvar: look again every 50 ms.
            free = self.freed.wait_timeout(free, Duration::from_millis(50)).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    fn leave(&self) {
        *self.free.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.freed.notify_one();
    }
}

/// A backend whose requests take turns through a [`Gate`].
struct Gated<'a> {
    inner: Box<dyn Backend>,
    gate: &'a Gate,
    cancel: &'a Cancel,
}

impl Gated<'_> {
    fn turn<T>(&mut self, call: impl FnOnce(&mut dyn Backend) -> Result<T, BackendError>) -> Result<T, BackendError> {
        if !self.gate.enter(self.cancel) {
            return Err(BackendError::Cancelled { backend: self.inner.kind(), url: self.inner.location() });
        }
        let result = call(self.inner.as_mut());
        self.gate.leave();
        result
    }
}

impl Backend for Gated<'_> {
    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }

    fn location(&self) -> String {
        self.inner.location()
    }

    // Without it a trial would never be constrained: the default enforces nothing. Asking is
    // not a model request (a GET of the server's models or version, answered at once even
    // while it generates), so it does not wait for the gate.
    fn enforcement(&mut self) -> Enforcement {
        self.inner.enforcement()
    }

    // Questions about the prompt, like the one above, generate nothing: they need no turn.
    fn prompt_size(&mut self, request: &ChatRequest<'_>) -> Option<codegen_core::backend::PromptSize> {
        self.inner.prompt_size(request)
    }

    fn chat(&mut self, request: &ChatRequest<'_>) -> Result<ChatResponse, BackendError> {
        self.turn(|backend| backend.chat(request))
    }

    fn chat_observed(
        &mut self,
        request: &ChatRequest<'_>,
        progress: &mut dyn FnMut(&Streamed<'_>),
    ) -> Result<ChatResponse, BackendError> {
        self.turn(|backend| backend.chat_observed(request, progress))
    }
}
