//! Each step's `after` resolved into the chain's [`Graph`]: ids that exist, no step after
//! itself, no cycle, and no output that two independent steps declare.

use std::collections::BTreeMap;

use super::chain::{PACKAGE_PREFIX, StepConfig};
use super::error::{ConfigError, ConfigErrorKind, CycleLink};
use super::source::Source;
use crate::graph::Graph;

/// What a step declares of the graph, with the places to point at.
pub(super) struct GraphDecl {
    /// `after`, when declared.
    pub(super) after: Option<Vec<Written>>,
    /// Each output, in the order of [`StepConfig::outputs`].
    pub(super) outputs: Vec<Written>,
}

/// An item of a list as written, with its place: a byte offset in the manifest, which
/// [`Source::at`] makes a line and column only for an error (it scans the text), and its key.
pub(super) struct Written {
    pub(super) value: String,
    pub(super) at: usize,
    pub(super) key: String,
}

/// Resolves each step's `after` into [`StepConfig::after`] and the chain's [`Graph`]: an id
/// `after` names must be another step of the chain, the steps may not wait for each other in a
/// cycle, and an output may not be declared by two steps of which neither runs after the other.
/// `steps` are in id order; `declared[i]` says what `steps[i]` declares.
pub(super) fn resolve_graph(
    src: &Source,
    steps: &mut [StepConfig],
    declared: &[GraphDecl],
) -> Result<Graph, ConfigError> {
    let ids: Vec<String> = steps.iter().map(|s| s.id.clone()).collect();
    let index = |id: &str| ids.binary_search_by(|s| s.as_str().cmp(id)).ok();
    let mut after = Vec::with_capacity(steps.len());
    for ((i, step), decl) in steps.iter_mut().enumerate().zip(declared) {
        let deps = match &decl.after {
            None => i.checked_sub(1).into_iter().collect(),
            Some(list) => {
                let mut deps: Vec<usize> = Vec::with_capacity(list.len());
                for named in list {
                    let error = |kind| src.error(named.at, &named.key, kind);
                    if named.value == step.id {
                        return Err(error(ConfigErrorKind::AfterItself { step: step.id.clone() }));
                    }
                    let Some(dep) = index(&named.value) else {
                        return Err(error(ConfigErrorKind::UnknownAfter {
                            step: step.id.clone(),
                            after: named.value.clone(),
                            known: ids.clone(),
                        }));
                    };
                    if deps.contains(&dep) {
                        return Err(error(ConfigErrorKind::InvalidValue {
                            value: format!("{:?}", named.value),
                            expected: "each step id once in `after`".into(),
                        }));
                    }
                    deps.push(dep);
                }
                deps.sort_unstable();
                deps
            }
        };
        step.after_declared = decl.after.is_some();
        step.after = deps.iter().map(|&d| ids[d].clone()).collect();
        after.push(deps);
    }
    let graph = Graph::new(after).map_err(|cycle| {
        let links: Vec<CycleLink> =
            cycle.iter().map(|&i| CycleLink { step: ids[i].clone(), implicit: !steps[i].after_declared }).collect();
        // Point at an id in `after` that closes the cycle (an implicit link goes to a lower id,
        // so a cycle has at least one declared link).
        let place = cycle
            .iter()
            .zip(cycle.iter().cycle().skip(1))
            .find_map(|(&step, &next)| declared[step].after.as_ref()?.iter().find(|named| named.value == ids[next]));
        let (at, key) = place.map_or((0, format!("{PACKAGE_PREFIX}.steps")), |named| (named.at, named.key.clone()));
        src.error(at, key, ConfigErrorKind::Cycle { cycle: links })
    })?;
    let mut owners: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, step) in steps.iter().enumerate() {
        for (output, written) in step.outputs.iter().zip(&declared[i].outputs) {
            let earlier = owners.entry(output.as_str()).or_default();
            if let Some(&first) = earlier.iter().find(|&&j| graph.independent(i, j)) {
                return Err(src.error(
                    written.at,
                    &written.key,
                    ConfigErrorKind::SharedOutput {
                        path: output.clone(),
                        first: ids[first].clone(),
                        second: step.id.clone(),
                    },
                ));
            }
            earlier.push(i);
        }
    }
    Ok(graph)
}
