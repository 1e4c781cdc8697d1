//! What `check`, `status` and `diff` tell: computed here, printed by the binary.

use crate::config::{Chain, StoreMode};
use crate::error::{Error, StaleStep};
use crate::plan::assess::{StepState, plan, stale_steps};
use crate::record::layout::{Layout, STORE_DIR};
use crate::record::records::Records;

/// The result of `cargo promptgen check`.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckReport {
    /// Steps that must run again, and why.
    pub stale: Vec<StaleStep>,
    /// Steps whose results wait in the pending area.
    pub pending: Vec<String>,
    /// Steps the lock records that the manifest no longer declares.
    pub removed: Vec<String>,
    /// Stored files or folders that no step owns (with `store = "cache"`, everything in the
    /// package's `promptgen/` folder).
    pub unowned: Vec<String>,
    /// Stale steps whose only fault is that the local cache lacks their files
    /// (`store = "cache"`): `cargo promptgen pull` makes them fresh, no model needed.
    pub not_in_cache: Vec<String>,
    /// What stopped runs left in the package, by path relative to it: staged and old folders
    /// of steps in `promptgen/`, temporary files beside the lock. The record reads whole
    /// through them; the next `cargo promptgen` finishes or removes them. Never to commit.
    pub leftovers: Vec<String>,
}

impl CheckReport {
    /// Whether the committed lock and store are complete and current.
    pub fn is_fresh(&self) -> bool {
        self.stale.is_empty() && self.pending.is_empty() && self.removed.is_empty() && self.leftovers.is_empty()
    }
}

/// Checks the chain against the lock and the store, without calling any model.
pub fn check(chain: &Chain, layout: &Layout) -> Result<CheckReport, Error> {
    let mut records = Records::read(layout)?;
    // `check` judges what is committed: pending results count as not recorded yet.
    let pending_ids: Vec<String> =
        records.pending.take().map(|p| p.steps.into_iter().map(|s| s.id).collect()).unwrap_or_default();
    let assessed = plan(chain, &records)?;
    let stale = stale_steps(&assessed);
    let pending = stale.iter().filter(|s| pending_ids.contains(&s.id)).map(|s| s.id.clone()).collect();
    let not_in_cache = assessed.iter().filter(|a| !a.missing.is_empty()).map(|a| a.id.clone()).collect();
    let removed: Vec<String> =
        records.lock.steps.iter().filter(|s| chain.step(&s.id).is_none()).map(|s| s.id.clone()).collect();
    let mut declared = records.lock.clone();
    declared.steps.retain(|s| chain.step(&s.id).is_some());
    if layout.store.mode == StoreMode::Cache {
        // The lock's files live in the cache: nothing in `promptgen/` belongs to a step.
        declared.steps.clear();
    }
    let unowned = layout
        .store()
        .unowned(&declared)
        .into_iter()
        .filter(|path| layout.store.mode == StoreMode::Cache || !removed.iter().any(|id| owned_by(path, id)))
        .collect();
    Ok(CheckReport { stale, pending, removed, unowned, not_in_cache, leftovers: leftovers(layout) })
}

/// What stopped runs left in the package: see [`CheckReport::leftovers`].
pub fn leftovers(layout: &Layout) -> Vec<String> {
    let store = layout.store();
    let mut found: Vec<String> = store.leftovers().into_iter().map(|name| format!("{STORE_DIR}/{name}")).collect();
    for name in codegen_core::fs::read_dir_names(&layout.package_dir).unwrap_or_default() {
        let name = name.to_string_lossy();
        if name.starts_with(".promptgen-tmp-") {
            found.push(name.into_owned());
        }
    }
    found
}

/// Whether the store path `path` is step `id`'s folder, something in it, or its transcript.
fn owned_by(path: &str, id: &str) -> bool {
    path == id || path.starts_with(&format!("{id}/")) || path == format!("{id}.transcript.jsonl")
}

/// One line of `cargo promptgen status`.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusRow {
    /// The step's id.
    pub id: String,
    /// Its prompt, as the manifest names it.
    pub prompt: String,
    /// The steps it runs after (directly), in id order.
    pub after: Vec<String>,
    /// The files it declares, else (declaring none) the files it recorded.
    pub outputs: Vec<String>,
    /// `fresh`, `pending`, `stale`, or `unpulled` (stale only because the local cache lacks
    /// its files).
    pub state: &'static str,
    /// Why it is stale.
    pub reasons: Vec<String>,
    /// Files it produced (as recorded).
    pub files: usize,
    /// The backend it was recorded with (`scripted` for canned turns), or is configured with.
    pub backend: String,
    /// The model it was recorded with, or is configured with when not recorded.
    pub model: String,
    /// Model calls of the recorded run.
    pub model_calls: Option<u32>,
    /// Prompt plus completion tokens of the recorded run.
    pub tokens: Option<u64>,
    /// Repair turns of the recorded run.
    pub repairs: Option<u32>,
    /// Failed compile checks of the recorded run, each answered with a repair round.
    pub check_rounds: Option<u32>,
    /// The seed of the run that produced the recorded files.
    pub seed: Option<u64>,
    /// Whether that run was a retry with another seed than the configured one.
    pub retried: bool,
}

/// The status of every step.
pub fn status(chain: &Chain, layout: &Layout) -> Result<Vec<StatusRow>, Error> {
    let records = Records::read(layout)?;
    let assessed = plan(chain, &records)?;
    Ok(chain
        .steps
        .iter()
        .zip(&assessed)
        .map(|(step, a)| {
            let recorded = a.entry.as_ref().or_else(|| records.lock.step(&step.id));
            let (state, reasons) = match &a.state {
                StepState::Fresh => ("fresh", Vec::new()),
                StepState::Pending => ("pending", Vec::new()),
                StepState::Stale(reasons) if !a.missing.is_empty() => ("unpulled", reasons.clone()),
                StepState::Stale(reasons) => ("stale", reasons.clone()),
            };
            let outputs = if step.outputs.is_empty() {
                recorded.map(|e| e.files.iter().map(|f| f.path.clone()).collect()).unwrap_or_default()
            } else {
                step.outputs.clone()
            };
            StatusRow {
                id: step.id.clone(),
                prompt: step.prompt_display.clone(),
                after: step.after.clone(),
                outputs,
                state,
                reasons,
                files: recorded.map_or(0, |e| e.files.len()),
                backend: recorded.map_or_else(|| chain.backend.kind.to_string(), |e| e.fingerprint.backend.clone()),
                model: recorded.map_or_else(|| step.model.clone(), |e| e.fingerprint.model.clone()),
                model_calls: recorded.map(|e| e.model_calls),
                tokens: recorded.map(|e| e.prompt_tokens + e.completion_tokens),
                repairs: recorded.map(|e| e.repairs),
                check_rounds: recorded.map(|e| e.check_rounds),
                seed: recorded.and_then(|e| e.seed.or(e.fingerprint.seed)),
                retried: recorded.is_some_and(|e| e.seed.is_some()),
            }
        })
        .collect())
}

/// A unified diff from the committed outputs to the pending ones, for every step with
/// pending results (or only `step`, which must be one of the chain's: see
/// [`Chain::require_step`]). Empty when nothing is pending. (With the `cli` feature.)
#[cfg(feature = "cli")]
pub fn diff(chain: &Chain, layout: &Layout, step: Option<&str>) -> Result<String, Error> {
    let records = Records::read(layout)?;
    let Some(pending) = &records.pending else { return Ok(String::new()) };
    let mut out = String::new();
    for config in chain.steps.iter().filter(|s| step.is_none_or(|id| id == s.id)) {
        let Some(new_entry) = pending.step(&config.id) else { continue };
        let committed = records.lock.step(&config.id);
        if committed.is_some_and(|c| c.key == new_entry.key && c.files == new_entry.files) {
            continue;
        }
        let new_files = match records.pending_store.load(new_entry) {
            Ok(files) => files,
            // A fresh step copied into the pending lock has no files of its own there.
            Err(Error::DamagedStore { .. }) => continue,
            Err(e) => return Err(e),
        };
        let old_files = match committed {
            Some(entry) => records.store.load(entry).unwrap_or_default(),
            None => crate::files::Files::new(),
        };
        let mut hunks = String::new();
        let mut paths: Vec<&String> = old_files.keys().chain(new_files.keys()).collect();
        paths.sort();
        paths.dedup();
        for path in paths {
            let old = old_files.get(path).map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
            let new = new_files.get(path).map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
            if old == new {
                continue;
            }
            let name = format!("promptgen/{}/{path}", config.id);
            let text = similar::TextDiff::from_lines(&old, &new)
                .unified_diff()
                .context_radius(3)
                .header(&format!("a/{name}"), &format!("b/{name}"))
                .to_string();
            hunks.push_str(&text);
        }
        if let Some(provenance) = new_entry.provenance().filter(|_| !hunks.is_empty()) {
            // Before the step's first `---`, where `git apply` and `patch` read nothing.
            out.push_str(&format!("step {}: {provenance}\n", config.id));
        }
        out.push_str(&hunks);
    }
    Ok(out)
}
