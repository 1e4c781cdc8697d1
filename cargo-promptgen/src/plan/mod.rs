//! Which steps are fresh, which must run again, and why.
//!
//! A step is *fresh* when its fingerprint (prompt, system prompt, settings, tool contract,
//! script, inputs, and what the steps it runs after handed over) hashes to the key in the
//! lock, and its stored files still match their recorded hashes. Because each fingerprint
//! holds the key and files of the steps it runs after (`after`, see [`crate::graph`]), and
//! those hold theirs, a change to step 02 makes 02 and its dependents stale, transitively, and
//! nothing else: not the steps it runs after, nor the steps independent of it.
//!
//! What a fingerprint holds of its dependencies ([`fingerprint::handoff`]): when a step runs after exactly
//! the step before it in id order (a chain without `after`), the digest of that step's key and
//! files in `previous`, as before `after` existed, so that those locks keep their keys byte
//! for byte; otherwise one digest per step it runs after, by id, in `after`.

pub mod assess;
pub mod explain;
pub mod fingerprint;
