//! Why an evaluation cannot start, resume or replay.

use crate::config::UnknownStep;
use crate::error::Error;

/// Why `cargo promptgen eval` cannot start, resume or replay a run.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// The run cannot be made as asked: flags that contradict, a run that is not there or
    /// no longer matches the chain, a step with nothing recorded to start from.
    #[error("cannot evaluate {package}: {problem}")]
    Unusable {
        /// The package.
        package: String,
        /// What is wrong, and what to do.
        problem: String,
    },
    /// `--step` named a step the chain does not have.
    #[error(transparent)]
    UnknownStep(#[from] UnknownStep),
    /// A trial's run, or the record it reads, failed.
    #[error(transparent)]
    Run(#[from] Error),
}

impl From<codegen_core::FsError> for EvalError {
    fn from(error: codegen_core::FsError) -> EvalError {
        EvalError::Run(error.into())
    }
}
