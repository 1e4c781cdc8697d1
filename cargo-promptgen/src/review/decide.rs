//! What happens to the results a build left pending: `cargo promptgen accept` records all that
//! are still current, and `review` decides one at a time which can be reviewed, and what
//! accepting or rejecting one of them does. The binary asks; this decides.
//!
//! A step's pending result was made after the result of the step before it (its key holds
//! that step's hand-off), so it can be recorded only once that result is: reviewing goes in
//! chain order, and rejecting a result discards the pending results made after it, which can
//! never be recorded. The pending area goes once nothing in it waits for review.

use codegen_core::fs;

use crate::config::Chain;
use crate::error::Error;
use crate::plan::assess::{StepState, plan};
use crate::record::commit::{Destination, Recorder, discard_pending};
use crate::record::layout::Layout;
use crate::record::records::Records;

/// Why `review` cannot decide on a step's pending result.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The step has no pending result, or one made after a result not recorded yet.
    #[error("step `{id}`'s pending result cannot be reviewed: {why}")]
    NotReviewable {
        /// The step.
        id: String,
        /// Why.
        why: String,
    },
    /// The record could not be read or written.
    #[error(transparent)]
    Record(#[from] Error),
}

/// What `accept` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AcceptReport {
    /// Steps recorded from the pending area.
    pub accepted: Vec<String>,
    /// Pending steps that no longer match their declaration, discarded.
    pub outdated: Vec<String>,
    /// What a stopped run had left in the record, and what `accept` did about it first.
    pub recovered: Vec<String>,
}

/// Records the pending results in the committed lock and store, without calling a model.
/// Only pending steps that are still current are accepted; the pending area is then removed.
pub fn accept(chain: &Chain, layout: &Layout) -> Result<AcceptReport, Error> {
    let records = Records::read(layout)?;
    let Some(pending) = &records.pending else { return Ok(AcceptReport::default()) };
    let mut recorder = Recorder::open(chain, layout, &records, Destination::Committed)?;
    let mut report = AcceptReport { recovered: std::mem::take(&mut recorder.recovered), ..AcceptReport::default() };
    for assessed in plan(chain, &records)? {
        if assessed.state == StepState::Pending {
            let entry = assessed.entry.as_ref().expect("a pending step has its entry");
            recorder.take(&records, entry, &assessed.files, true)?;
            report.accepted.push(assessed.id.clone());
        } else if matches!(assessed.state, StepState::Stale(_)) && pending.step(&assessed.id).is_some() {
            report.outdated.push(assessed.id.clone());
        }
    }
    recorder.finish(chain, layout, false, false)?;
    discard_pending(layout)?;
    Ok(report)
}

/// The steps whose pending results can be reviewed, in chain order.
pub fn pending_steps(chain: &Chain, layout: &Layout) -> Result<Vec<String>, Error> {
    let records = Records::read(layout)?;
    Ok(plan(chain, &records)?.into_iter().filter(|a| a.state == StepState::Pending).map(|a| a.id).collect())
}

/// What a decision changed besides its own step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decided {
    /// Pending results discarded with it: made after a rejected result, they can never be
    /// recorded.
    pub discarded: Vec<String>,
    /// Whether the pending area is gone, nothing in it waiting any more.
    pub area_removed: bool,
}

/// Records step `id`'s pending result in the lock and store, as `accept` would for it alone.
/// Refused, changing nothing, when the result is not pending or was made after a result that
/// is not recorded yet.
pub fn accept_step(chain: &Chain, layout: &Layout, id: &str) -> Result<Decided, ReviewError> {
    let records = Records::read(layout)?;
    let pending = records.pending.as_ref().and_then(|lock| lock.step(id)).cloned();
    let Some(entry) = pending.filter(|_| pending_in(chain, &records, id)) else {
        return Err(ReviewError::NotReviewable { id: id.to_string(), why: "it has no pending result".into() });
    };
    // Judged against the recorded steps alone: the pending lock holds only this step.
    let mut alone = records.clone();
    let mut only = records.pending.clone().unwrap_or_default();
    only.steps.retain(|s| s.id == id);
    alone.pending = Some(only);
    let assessed = plan(chain, &alone)?;
    let Some(step) = assessed.iter().find(|a| a.id == id && a.state == StepState::Pending) else {
        let before: Vec<&str> = assessed
            .iter()
            .take_while(|a| a.id != id)
            .filter(|a| a.state != StepState::Fresh)
            .map(|a| a.id.as_str())
            .collect();
        return Err(ReviewError::NotReviewable {
            id: id.to_string(),
            why: format!(
                "it was made after the pending result of step {}, which must be accepted first",
                before.join(", ")
            ),
        });
    };
    Recorder::open(chain, layout, &records, Destination::Committed)?.take(&records, &entry, &step.files, true)?;
    remove_pending(layout, &records, &[id.to_string()])?;
    Ok(tidy(chain, layout, Vec::new())?)
}

/// Removes step `id`'s pending result, and the pending results made after it.
pub fn reject_step(chain: &Chain, layout: &Layout, id: &str) -> Result<Decided, ReviewError> {
    let records = Records::read(layout)?;
    if !pending_in(chain, &records, id) {
        return Err(ReviewError::NotReviewable { id: id.to_string(), why: "it has no pending result".into() });
    }
    let before = pending_steps(chain, layout)?;
    remove_pending(layout, &records, &[id.to_string()])?;
    let records = Records::read(layout)?;
    let still = pending_steps(chain, layout)?;
    let discarded: Vec<String> = before.into_iter().filter(|s| s != id && !still.contains(s)).collect();
    remove_pending(layout, &records, &discarded)?;
    Ok(tidy(chain, layout, discarded)?)
}

fn pending_in(chain: &Chain, records: &Records, id: &str) -> bool {
    plan(chain, records).is_ok_and(|plan| plan.iter().any(|a| a.id == id && a.state == StepState::Pending))
}

/// Takes `ids` out of the pending lock and the pending store.
fn remove_pending(layout: &Layout, records: &Records, ids: &[String]) -> Result<(), Error> {
    if ids.is_empty() {
        return Ok(());
    }
    let Some(mut lock) = records.pending.clone() else { return Ok(()) };
    lock.steps.retain(|s| !ids.contains(&s.id));
    lock.write(&layout.pending_lock_path())?;
    let store = &records.pending_store;
    for id in ids {
        fs::remove_dir_all(&store.step_dir(id))?;
        let transcript = store.transcript_path(id);
        if transcript.exists() {
            fs::remove_file(&transcript)?;
        }
    }
    Ok(())
}

/// Removes the pending area once nothing in it waits for review.
fn tidy(chain: &Chain, layout: &Layout, discarded: Vec<String>) -> Result<Decided, Error> {
    let area_removed = pending_steps(chain, layout)?.is_empty() && layout.pending_dir().exists();
    if area_removed {
        discard_pending(layout)?;
    }
    Ok(Decided { discarded, area_removed })
}
