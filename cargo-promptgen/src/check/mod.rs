//! The checks a step's files must pass before it may finish, run where the files will live.
//!
//! - `cargo check` / `cargo test` ([`CrateCheck`], the default for Rust outputs): the package
//!   itself is checked (or tested) with the step's candidate tree mounted where the build
//!   entry mounts the recorded one, so generated code is checked against the crate's
//!   dependencies and its own items, and hand-written code and tests against the generated
//!   code. How: Cargo runs in a target folder of its own, `<target>/promptgen/check-target`
//!   (kept between runs and shared by the packages, so dependencies compile once per machine
//!   and re-checks are incremental), with `PROMPTGEN_TREE` naming the
//!   candidate tree and `PROMPTGEN_TREE_PACKAGE` the package; the package's build entry sees
//!   them and mounts that tree instead of the recorded one, without reading the lock, taking
//!   the process lock or calling a model (see `build_script.rs`). So a check never recurses
//!   and never waits on the lock its caller holds, also when the caller is itself a build
//!   script regenerating online. Every target is type-checked first (`cargo check
//!   --all-targets --keep-going`), and `cargo test` runs only once that passes: Cargo stops
//!   starting targets at the first that fails unless it keeps going, which `cargo test`
//!   cannot, so the errors a check reports (and what it puts off, which transcripts record)
//!   would otherwise depend on which target Cargo happened to start first.
//! - `rustc` ([`RustcCheck`]): the generated tree alone, type-checked; fast, and blind to the
//!   crate.
//! - a command: runs in the package folder with the same variables.
//!
//! # What a check sees of the rest of the chain
//!
//! A step's candidate tree holds the files of its *dependencies* (the steps it runs after,
//! transitively; see [`crate::graph`]) as they stand in this run, and the step's own. The
//! crate compiles every step's files, so a crate check also mounts, beneath the candidate,
//! the recorded files of the chain's *other* steps: every step that is neither the step nor
//! one of its dependencies, that is its dependents and the steps independent of it
//! (`run::surroundings::the_rest_of_the_chain`). They are taken as recorded *before* the run began,
//! not as steps finish during it, so what a check sees does not depend on which independent
//! steps happened to finish first. Errors that only concern what those other steps own (their
//! files, or a module that one of them declares and none has written yet) are put off rather
//! than blamed on this step ([`Later`]); in a chain without `after`, the other steps are the
//! steps after it in id order, as before.
//!
//! A check that could only run in part is run again on the whole tree once every step is done
//! (`run::recheck`). So is every check of the run when no single step that ran has
//! all the other steps that ran among its dependencies (two independent steps, say): no check
//! then saw the whole tree as it ends. In a line, the last step that ran always has.

pub mod confine;
pub mod crate_check;
pub mod diagnostics;
pub mod process;
pub mod redact;
pub mod rustc;
pub mod setup;
