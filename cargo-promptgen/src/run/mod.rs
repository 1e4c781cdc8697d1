//! Running a chain: the schedule ([`schedule`]: each step once the steps it runs after are
//! done, up to `jobs` at a time, each result recorded as it comes), one step's run
//! ([`attempt`]: the loop in a scratch tree, with its check and its retries; for a re-run by
//! edit, from the recorded files, see [`revision`]), what a check
//! mounts of the rest of the chain ([`surroundings`]), the checks repeated on the whole tree
//! ([`recheck`]), what a run reports ([`progress`]) and the attempts it keeps for `log`
//! ([`attempts`]).

pub mod attempt;
pub mod attempts;
pub mod progress;
pub mod recheck;
pub(crate) mod revision;
pub mod schedule;
pub mod surroundings;
