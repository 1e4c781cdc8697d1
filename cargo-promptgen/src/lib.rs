//! Prompt chains declared in Cargo metadata, compiled like any other build stage, and
//! recorded in a committed lock so that builds are reproducible, offline and reviewable.
//!
//! A *chain* is a graph of steps. Each step sends one prompt to a language model, which
//! reads and writes files through tools (see [`codegen_core`]) until it declares itself
//! done. A step runs after the steps it names in `after` (by default the step before it in id
//! order, so a chain without `after` is a line) and sees what they wrote, transitively, and
//! nothing else. The lock, `promptgen.lock`, records for each step a *key* (a hash of
//! everything that can change its result, its dependencies' keys and files included) and the
//! files it produced; the files themselves sit in `promptgen/<id>/` beside it. The lock is to
//! prompts what `Cargo.lock` is to versions.
//!
//! # Using it in a crate
//!
//! ```sh
//! cargo add --build cargo-promptgen --no-default-features   # copies the recorded files
//! cargo install cargo-promptgen      # for the `cargo promptgen` subcommand
//! ```
//!
//! Without features the build entry compiles no HTTP client and never calls a model. Turn on
//! `online` (`--features online`) to let `cargo build` regenerate stale steps itself, and
//! `tls` for HTTPS to a hosted API.
//!
//! Declare the chain in `Cargo.toml`:
//!
//! ```toml
//! [package.metadata.promptgen]
//! backend = "ollama"                  # "ollama" | "openai" | "scripted"
//! model = "qwen2.5-coder:7b"
//! seed = 123
//! temperature = 0.0
//! max_model_calls = 8                 # model calls per step, repairs included
//! protocol = "native"                 # "native" | "json" | "blocks"
//! system_prompt = "prompts/system.md" # optional
//!
//! [[package.metadata.promptgen.steps]]
//! id = "01"
//! prompt = "prompts/step_01_view.md"  # relative to the package
//! outputs = ["view.rs"]               # files the step must produce
//! inputs = ["src/domain.rs"]          # extra files or folders the model may read
//!
//! [[package.metadata.promptgen.steps]]
//! id = "02"
//! prompt = "prompts/step_02_view_impl.md"
//! outputs = ["view_impl.rs"]
//! after = ["01"]                      # the default: the step before it; [] for none
//! ```
//!
//! Call the build entry from `build.rs`:
//!
//! ```no_run
//! // build.rs
//! fn main() -> Result<(), cargo_promptgen::Error> {
//!     cargo_promptgen::build()
//! }
//! ```
//!
//! and mount the generated files, one module per `.rs` file, in `src/main.rs` or `src/lib.rs`:
//!
//! ```ignore
//! mod generated {
//!     include!(concat!(env!("OUT_DIR"), "/promptgen.rs"));
//! }
//! // generated::view::View, generated::presenter::Presenter, ...
//! ```
//!
//! Then `cargo promptgen` runs the chain and records it; commit `promptgen.lock` and
//! `promptgen/`. From then on `cargo build` copies the recorded files into
//! `$OUT_DIR/promptgen/` without calling any model.
//!
//! With `store = "cache"` only the lock is committed: the files live in a content-addressed
//! cache folder (`PROMPTGEN_CACHE_DIR`, else the user's cache folder), shared through an S3
//! bucket (`cache_url`) by `cargo promptgen push` and `pull`. A build reads the local cache
//! only; a file it lacks fails the build with `cargo promptgen pull` as the fix.
//!
//! # What a build does
//!
//! - Every step fresh: the recorded files are copied (only those whose bytes changed), no
//!   network at all.
//! - Some step stale, with the `online` feature, and neither `PROMPTGEN_OFFLINE` nor `CI` set:
//!   the stale steps run, their results go to a pending area under the target folder (a build
//!   script never writes the package), and a warning says `cargo promptgen accept` records
//!   them. Without `online`, a stale step fails the build as offline.
//! - Some step stale and offline (or `CI`): the build fails, listing each stale step, what
//!   changed in it, and the command that fixes it.
//!
//! # Environment
//!
//! Strongest first: command-line flags; `PROMPTGEN_BACKEND`, `PROMPTGEN_MODEL`,
//! `PROMPTGEN_BASE_URL`; the backend's own `OLLAMA_HOST`, `OPENAI_BASE_URL`, `OPENAI_API_KEY`;
//! the package's metadata; `[workspace.metadata.promptgen]`. `PROMPTGEN_OFFLINE=1` and `CI`
//! forbid model calls during builds. `PROMPTGEN_CACHE_DIR` (else `XDG_CACHE_HOME` or `HOME`)
//! locates the cache of `store = "cache"`. `PROMPTGEN_JOBS` (and `jobs`) is how many steps
//! `cargo promptgen` runs at once; a build runs its stale steps one at a time.
//!
//! # API
//!
//! A build script needs [`build`], or [`Builder`] for the paths and switches it can set, and
//! the [`Error`] they return; [`BuildReport`] says what a build did. Everything else is
//! internal: `cargo promptgen`, its benchmarks and tests reach it through a hidden module
//! that is not part of the API and may change in any release.
#![deny(missing_docs)]

// The code follows a chain's flow: manifest -> plan -> run -> check -> record -> mount.
//
// config/        the manifest's `[package.metadata.promptgen]` (and the workspace's), resolved
// plan/          which steps are fresh, pending or stale, and why: fingerprints and keys
// run/           (online) the schedule, one step's run with its retries, progress, kept attempts
// check/         (online) the checks a step's files must pass, where they live, confined
// record/        the lock, the store, the cache, the pending area, and where each lives
// mount.rs       how a crate mounts the generated tree from `OUT_DIR`
// build_script.rs  the build entry: `build()` and `Builder`
// review/        what a person sees and decides: check, status, diff, accept, review
// remote/        (cli) the cache's S3 remote: push, pull, store --to
// eval/          (online) `cargo promptgen eval`
// error.rs, files.rs, graph.rs, hash.rs: what every phase shares (the build entry's error,
//                file sets, the steps' graph, SHA-256)
//
// No module imports a module that imports it back (tests/module_graph checks it).
mod build_script;
#[cfg(feature = "online")]
mod check;
mod config;
mod error;
#[cfg(feature = "online")]
mod eval;
mod files;
mod graph;
mod hash;
mod mount;
mod plan;
mod record;
#[cfg(feature = "cli")]
mod remote;
mod review;
#[cfg(feature = "online")]
mod run;

pub use build_script::{BuildReport, Builder, build};
pub use codegen_core::FsError;
pub use config::{ConfigError, ConfigErrorKind, Location};
pub use error::{Error, MissingFile, StaleStep};

/// Not API. What the `cargo promptgen` binary, the benchmarks and the tests use of the
/// internals, item by item; anything in it may change or go in any release.
#[doc(hidden)]
pub mod __private {
    #![allow(missing_docs)]

    #[cfg(feature = "cli")]
    pub use crate::config::with_store;
    pub use crate::config::{
        CacheUrl, Chain, ENV_VARS, Origin, Overrides, PASS_RATES, Regenerate, StepConfig, StoreMode, TEMPERATURES,
        UnknownStep, load, load_from_env,
    };
    pub use crate::error::report;
    pub use crate::files::{Files, sync_dir};
    pub use crate::hash::sha256_hex;
    pub use crate::plan::assess::{Assessed, StepState, plan};
    pub use crate::plan::fingerprint::fingerprint;
    pub use crate::record::cache::{Cache, Lookup};
    pub use crate::record::commit::{Destination, discard_pending};
    pub use crate::record::layout::Layout;
    pub use crate::record::lock::{Lock, LockedFile, LockedStep};
    pub use crate::record::process_lock::ProcessLock;
    pub use crate::record::records::Records;
    pub use crate::record::store::Storage;
    #[cfg(feature = "online")]
    pub use crate::{
        check::crate_check::Later,
        check::setup::{CheckSetup, check_for},
        run::progress::Progress,
        run::schedule::{ChainResult, Schedule},
        run::surroundings::{recorded_files, the_rest_of_the_chain},
    };

    /// `check`, `status`, `diff`; `accept` and `review`.
    pub mod review {
        pub use crate::review::decide::{Decided, ReviewError, accept, accept_step, pending_steps, reject_step};
        #[cfg(feature = "cli")]
        pub use crate::review::status::diff;
        pub use crate::review::status::{CheckReport, StatusRow, check, status};
    }

    /// Each step's kept attempts, for `log`.
    #[cfg(feature = "online")]
    pub mod attempts {
        pub use crate::run::attempts::{Attempt, Outcome, PartialReply, read};
    }

    /// The checks' confinement.
    #[cfg(feature = "online")]
    pub mod confine {
        pub use crate::check::confine::{Policy, Support, Toolchain, UNCONFINED_VAR, confine, kernel_abi, tmp_dir};
    }

    /// `cargo promptgen eval`.
    #[cfg(feature = "online")]
    pub mod eval {
        pub use crate::eval::error::EvalError;
        pub use crate::eval::record::{RunDir, TrialRecord, Verdict};
        pub use crate::eval::score::Row;
        pub use crate::eval::{Outcome, Pace, Report, Spec, replay, resume, start, warnings};
    }

    /// The cache's S3 remote.
    #[cfg(feature = "cli")]
    pub mod remote {
        pub use crate::remote::s3::{Remote, RemoteError};
        pub use crate::remote::sync::{SyncError, Transfer, pull, push, switch};
    }
}
