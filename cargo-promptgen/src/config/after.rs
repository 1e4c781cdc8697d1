//! Each step's `after` resolved into the chain's [`Graph`]: ids that exist, no step after
//! itself, no cycle, and no output that two independent steps declare.

use std::collections::BTreeMap;

use super::error::{ConfigError, CycleLink, Location};
use super::source::Source;
use super::{PACKAGE_PREFIX, StepConfig};
use crate::graph::Graph;

/// What a step declares of the graph, with the places to point at.
pub(super) struct GraphDecl {
    pub(super) id: String,
    /// `after`, when declared: each id with its place and key.
    pub(super) after: Option<Vec<Named>>,
    /// The place (a byte offset in the manifest: [`Source::at`] makes it a line and column
    /// only for an error, as that scans the text) and key of each output, in the order of
    /// [`DeclaredStep::outputs`].
    pub(super) outputs_at: Vec<(usize, String)>,
}

/// A step id as written in `after`.
pub(super) struct Named {
    pub(super) id: String,
    /// A byte offset in the manifest, as in [`GraphDecl::outputs_at`].
    pub(super) at: usize,
    pub(super) key: String,
}

/// Resolves each step's `after` into [`StepConfig::after`] and the chain's [`Graph`]: an id
/// `after` names must be another step of the chain, the steps may not wait for each other in a
/// cycle, and an output may not be declared by two steps of which neither runs after the other.
/// `steps` are in id order; `declared` says what each declares, by id.
pub(super) fn resolve_graph(
    src: &Source,
    steps: &mut [StepConfig],
    declared: Vec<GraphDecl>,
) -> Result<Graph, ConfigError> {
    let file = src.file.as_path();
    let ids: Vec<String> = steps.iter().map(|s| s.id.clone()).collect();
    let index = |id: &str| ids.binary_search_by(|s| s.as_str().cmp(id)).ok();
    let declared: BTreeMap<String, GraphDecl> = declared.into_iter().map(|d| (d.id.clone(), d)).collect();
    let decl = |i: usize| declared.get(&ids[i]);
    let mut after = Vec::with_capacity(steps.len());
    for (i, step) in steps.iter_mut().enumerate() {
        let deps = match decl(i).and_then(|d| d.after.as_ref()) {
            None => i.checked_sub(1).into_iter().collect(),
            Some(list) => {
                let mut deps: Vec<usize> = Vec::with_capacity(list.len());
                for named in list {
                    let (at, key) = (src.at(named.at), named.key.clone());
                    if named.id == step.id {
                        return Err(ConfigError::AfterItself { file: file.into(), at, key, step: step.id.clone() });
                    }
                    let Some(dep) = index(&named.id) else {
                        return Err(ConfigError::UnknownAfter {
                            file: file.into(),
                            at,
                            key,
                            step: step.id.clone(),
                            after: named.id.clone(),
                            known: ids.clone(),
                        });
                    };
                    if deps.contains(&dep) {
                        return Err(ConfigError::InvalidValue {
                            file: file.into(),
                            at,
                            key,
                            value: format!("{:?}", named.id),
                            expected: "each step id once in `after`".into(),
                        });
                    }
                    deps.push(dep);
                }
                deps.sort_unstable();
                deps
            }
        };
        step.after_declared = decl(i).is_some_and(|d| d.after.is_some());
        step.after = deps.iter().map(|&d| ids[d].clone()).collect();
        after.push(deps);
    }
    let graph = Graph::new(after).map_err(|cycle| {
        let links: Vec<CycleLink> =
            cycle.iter().map(|&i| CycleLink { step: ids[i].clone(), implicit: !steps[i].after_declared }).collect();
        // Point at an id in `after` that closes the cycle (an implicit link goes to a lower id,
        // so a cycle has at least one declared link).
        let place = cycle.iter().zip(cycle.iter().cycle().skip(1)).find_map(|(&step, &next)| {
            let list = decl(step)?.after.as_ref()?;
            list.iter().find(|named| named.id == ids[next]).map(|named| (src.at(named.at), named.key.clone()))
        });
        let (at, key) = place.unwrap_or((Location { line: 1, column: 1 }, format!("{PACKAGE_PREFIX}.steps")));
        ConfigError::Cycle { file: file.into(), at, key, cycle: links }
    })?;
    let mut owners: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, step) in steps.iter().enumerate() {
        for (k, output) in step.outputs.iter().enumerate() {
            let earlier = owners.entry(output.as_str()).or_default();
            if let Some(&first) = earlier.iter().find(|&&j| graph.independent(i, j)) {
                let (at, key) = decl(i)
                    .and_then(|d| d.outputs_at.get(k))
                    .map(|(offset, key)| (src.at(*offset), key.clone()))
                    .unwrap_or((Location { line: 1, column: 1 }, format!("{PACKAGE_PREFIX}.steps")));
                return Err(ConfigError::SharedOutput {
                    file: file.into(),
                    at,
                    key,
                    path: output.clone(),
                    first: ids[first].clone(),
                    second: step.id.clone(),
                });
            }
            earlier.push(i);
        }
    }
    Ok(graph)
}
