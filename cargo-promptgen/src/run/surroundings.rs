//! What a step's check mounts of the rest of the chain: the recorded files of the steps that
//! are neither the step nor among its dependencies, and what those steps own.

use std::collections::BTreeMap;

use crate::check::crate_check::Later;
use crate::config::Chain;
use crate::files::Files;
use crate::record::records::Records;

/// Every step's recorded files that can be read and check out against the lock (pending
/// results first, as a build would use them).
pub fn recorded_files(chain: &Chain, records: &Records) -> BTreeMap<String, Files> {
    let mut recorded = BTreeMap::new();
    for step in &chain.steps {
        if let Some((_, _, files)) = records.recorded_step(&step.id) {
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
