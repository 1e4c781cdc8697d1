//! The chain as a graph: which steps each step runs after, an order they can run in, and who
//! depends on whom, transitively.
//!
//! A step declares the steps whose outputs it builds on, `after = ["01", "03"]`, or
//! `after = []` for none; without the key it runs after the step before it in id order, so a
//! chain that declares no `after` is the line it always was (see `config.rs`, which resolves
//! `after` and refuses unknown ids, a step after itself, cycles and outputs that two
//! independent steps declare).
//!
//! Steps are numbered by their place in [`crate::config::Chain::steps`] (id order). Three
//! relations follow from `after`:
//!
//! - the *dependencies* of a step: the steps it runs after, and theirs, transitively. Its
//!   key holds their keys and files (through the direct ones), its model sees their files,
//!   and nothing else of the chain;
//! - its *dependents*: the steps that have it among their dependencies. They are what goes
//!   stale with it, and what a failure of it stops;
//! - steps that are neither are *independent* of it: they may run at the same time, in any
//!   order, and nothing of theirs reaches it.

use std::collections::BTreeSet;

/// The dependency graph of a chain's steps (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Graph {
    /// The steps' direct dependencies, by index, in index order.
    after: Vec<Vec<usize>>,
    /// The steps that run directly after each step, by index, in index order.
    dependents: Vec<Vec<usize>>,
    /// Every step, each after its dependencies; among steps that could go either way, the
    /// lower index first. A chain without `after` runs in index (id) order.
    order: Vec<usize>,
    /// Each step's place in `order`.
    rank: Vec<usize>,
    /// Each step's dependencies, transitively, as a set of indices.
    ancestors: Vec<Bits>,
}

impl Graph {
    /// The graph of steps `0..after.len()`, where step `i` runs after the steps `after[i]`
    /// (indices below `after.len()`, not `i` itself). `Err` holds a cycle: steps `c[0]`,
    /// `c[1]`, ..., each of which runs after the next, and the last after the first.
    pub fn new(after: Vec<Vec<usize>>) -> Result<Graph, Vec<usize>> {
        let n = after.len();
        let after: Vec<Vec<usize>> = after
            .into_iter()
            .map(|deps| deps.into_iter().collect::<BTreeSet<usize>>().into_iter().filter(|&d| d < n).collect())
            .collect();
        let mut dependents = vec![Vec::new(); n];
        for (step, deps) in after.iter().enumerate() {
            for &dep in deps {
                dependents[dep].push(step);
            }
        }
        // Kahn's algorithm, taking the lowest ready index each time.
        let mut waiting: Vec<usize> = after.iter().map(Vec::len).collect();
        let mut ready: BTreeSet<usize> = (0..n).filter(|&i| waiting[i] == 0).collect();
        let mut order = Vec::with_capacity(n);
        while let Some(step) = ready.pop_first() {
            order.push(step);
            for &next in &dependents[step] {
                waiting[next] -= 1;
                if waiting[next] == 0 {
                    ready.insert(next);
                }
            }
        }
        if order.len() < n {
            return Err(find_cycle(&after, &waiting));
        }
        let mut rank = vec![0; n];
        for (place, &step) in order.iter().enumerate() {
            rank[step] = place;
        }
        let mut ancestors = vec![Bits::new(n); n];
        for &step in &order {
            let mut set = Bits::new(n);
            for &dep in &after[step] {
                set.union_with(&ancestors[dep]);
                set.insert(dep);
            }
            ancestors[step] = set;
        }
        Ok(Graph { after, dependents, order, rank, ancestors })
    }

    /// The number of steps.
    pub fn len(&self) -> usize {
        self.after.len()
    }

    /// Whether there are no steps.
    pub fn is_empty(&self) -> bool {
        self.after.is_empty()
    }

    /// The steps `step` runs directly after, in index order.
    pub fn after(&self, step: usize) -> &[usize] {
        &self.after[step]
    }

    /// The steps that run directly after `step`, in index order.
    pub fn dependents(&self, step: usize) -> &[usize] {
        &self.dependents[step]
    }

    /// Every step, each after its dependencies (lower indices first where the graph allows).
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// The place of `step` in [`Graph::order`].
    pub fn rank(&self, step: usize) -> usize {
        self.rank[step]
    }

    /// Whether `dependency` is among the dependencies of `step`, transitively.
    pub fn depends_on(&self, step: usize, dependency: usize) -> bool {
        self.ancestors[step].contains(dependency)
    }

    /// Whether two different steps are independent: neither depends on the other.
    pub fn independent(&self, a: usize, b: usize) -> bool {
        a != b && !self.depends_on(a, b) && !self.depends_on(b, a)
    }

    /// The dependencies of `step`, transitively, in [`Graph::order`].
    pub fn dependencies(&self, step: usize) -> Vec<usize> {
        let mut deps: Vec<usize> = self.ancestors[step].iter().collect();
        deps.sort_by_key(|&d| self.rank[d]);
        deps
    }

    /// The dependents of `step`, transitively, in index order.
    pub fn all_dependents(&self, step: usize) -> Vec<usize> {
        (0..self.len()).filter(|&other| self.depends_on(other, step)).collect()
    }
}

/// A cycle among the steps Kahn's algorithm could not order (`waiting[i] > 0`): following
/// dependencies from one of them must come back to a step already met.
fn find_cycle(after: &[Vec<usize>], waiting: &[usize]) -> Vec<usize> {
    let stuck = |i: usize| waiting[i] > 0;
    let Some(start) = (0..after.len()).find(|&i| stuck(i)) else { return Vec::new() };
    let mut path = vec![start];
    let mut seen = vec![None; after.len()];
    seen[start] = Some(0);
    let mut at = start;
    loop {
        // A stuck step waits on at least one stuck dependency (else it would have been freed).
        let Some(&next) = after[at].iter().find(|&&d| stuck(d)) else { return path };
        if let Some(place) = seen[next] {
            let mut cycle = path.split_off(place);
            // Start from the lowest index, for a message that does not depend on the search.
            let lowest = (0..cycle.len()).min_by_key(|&i| cycle[i]).unwrap_or(0);
            cycle.rotate_left(lowest);
            return cycle;
        }
        seen[next] = Some(path.len());
        path.push(next);
        at = next;
    }
}

/// A set of step indices below a fixed bound.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Bits {
    words: Vec<u64>,
}

impl Bits {
    fn new(n: usize) -> Bits {
        Bits { words: vec![0; n.div_ceil(64)] }
    }

    fn insert(&mut self, i: usize) {
        self.words[i / 64] |= 1 << (i % 64);
    }

    fn contains(&self, i: usize) -> bool {
        self.words.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    fn union_with(&mut self, other: &Bits) {
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a |= b;
        }
    }

    fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.words
            .iter()
            .enumerate()
            .flat_map(|(w, &word)| (0..64).filter(move |bit| word & (1 << bit) != 0).map(move |bit| w * 64 + bit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 0 -> {1, 2} -> 3: the diamond.
    fn diamond() -> Graph {
        Graph::new(vec![vec![], vec![0], vec![0], vec![1, 2]]).unwrap()
    }

    #[test]
    fn a_line_runs_in_index_order() {
        let line = Graph::new(vec![vec![], vec![0], vec![1], vec![2]]).unwrap();
        assert_eq!(line.order(), [0, 1, 2, 3]);
        assert!(line.depends_on(3, 0) && !line.depends_on(0, 3));
        assert_eq!(line.dependencies(3), [0, 1, 2]);
        assert_eq!(line.all_dependents(1), [2, 3]);
    }

    #[test]
    fn the_diamond_has_two_independent_steps() {
        let graph = diamond();
        assert_eq!(graph.order(), [0, 1, 2, 3]);
        assert!(graph.independent(1, 2) && !graph.independent(1, 3) && !graph.independent(0, 3));
        assert_eq!(graph.dependencies(3), [0, 1, 2]);
        assert_eq!(graph.dependencies(2), [0]);
        assert_eq!(graph.dependents(0), [1, 2]);
        assert_eq!(graph.all_dependents(0), [1, 2, 3]);
        assert_eq!(graph.all_dependents(3), Vec::<usize>::new());
    }

    #[test]
    fn a_step_may_run_after_a_later_id() {
        // 0 runs after 2, which runs after 1.
        let graph = Graph::new(vec![vec![2], vec![], vec![1]]).unwrap();
        assert_eq!(graph.order(), [1, 2, 0]);
        assert_eq!(graph.dependencies(0), [1, 2]);
        assert_eq!((graph.rank(1), graph.rank(2), graph.rank(0)), (0, 1, 2));
    }

    #[test]
    fn a_cycle_is_found_and_given_from_its_lowest_step() {
        // 3 -> 1 -> 2 -> 3 (each runs after the next), and 0 after 3, outside the cycle.
        let cycle = Graph::new(vec![vec![3], vec![2], vec![3], vec![1]]).unwrap_err();
        assert_eq!(cycle, [1, 2, 3]);
        assert_eq!(Graph::new(vec![vec![1], vec![0]]).unwrap_err(), [0, 1]);
    }

    #[test]
    fn sets_hold_many_steps() {
        let n = 200;
        let line = Graph::new((0..n).map(|i| if i == 0 { vec![] } else { vec![i - 1] }).collect()).unwrap();
        assert_eq!(line.dependencies(n - 1).len(), n - 1);
        assert!(line.depends_on(n - 1, 0) && line.depends_on(130, 64) && !line.depends_on(64, 130));
    }
}
