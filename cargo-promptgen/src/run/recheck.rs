//! The checks a run repeats once every step is done, on the whole chain's tree.
//!
//! A check mounts the steps its step does not run after as they were recorded before the run
//! (see [`crate::check`]), so it judged the whole tree only if every step that ran is among
//! its step's dependencies; in a line, the last step that ran is such a step. When none is
//! (two independent steps ran, say), each step that ran is checked again on the whole tree, as
//! is every check that could only run in part.

use codegen_core::Cancel;
use codegen_core::check::CheckOutcome;
use codegen_core::fs;

use crate::check::crate_check::Later;
use crate::check::setup::{CheckSetup, check_for};
use crate::config::{Chain, CheckSpec, StepConfig};
use crate::error::Error;
use crate::files::{Files, sync_dir};
use crate::record::layout::Layout;

/// Checks again, on `tree` (every step's files), the steps of `ran` (indices, in the order
/// they finished) whose check did not see the whole tree: those in `put_off`, and, when no
/// step of `ran` has all the others among its dependencies, every one with a check. The first
/// that fails is [`Error::CheckFailedOnceComplete`].
pub fn recheck(
    chain: &Chain,
    layout: &Layout,
    ran: &[usize],
    put_off: &[usize],
    tree: &Files,
    cancel: &Cancel,
) -> Result<(), Error> {
    let graph = &chain.graph;
    let seen_whole = ran.iter().any(|&t| ran.iter().all(|&s| s == t || graph.depends_on(t, s)));
    let mut again: Vec<usize> = ran
        .iter()
        .copied()
        .filter(|&s| put_off.contains(&s) || (!seen_whole && chain.steps[s].check != CheckSpec::None))
        .collect();
    again.sort_by_key(|&s| graph.rank(s));
    for index in again {
        check_in_full(chain, layout, &chain.steps[index], tree, cancel)?;
    }
    Ok(())
}

/// Runs `step`'s check on the whole chain's `tree`.
fn check_in_full(
    chain: &Chain,
    layout: &Layout,
    step: &StepConfig,
    tree: &Files,
    cancel: &Cancel,
) -> Result<(), Error> {
    let work = layout.work_dir();
    fs::create_dir_all(&work)?;
    let scratch = fs::temp_dir_in(&work, &format!("{}-full-", step.id))?;
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
        Ok(CheckOutcome::Failed(diagnostics)) => diagnostics.text,
        Ok(_) => return Ok(()),
        Err(error) => error.to_string(),
    };
    Err(Error::CheckFailedOnceComplete { id: step.id.clone(), check: check.name(), diagnostics: failure })
}
