//! (crate docs are written last)
pub mod backend;
pub mod chat;
pub mod fs;
pub mod protocol;
// pub mod run; (enabled once the text protocols land)
pub mod sandbox;
pub mod tools;
pub mod transcript;

pub use protocol::ToolProtocol;
// pub use run::{run_prompt, Error, Step, StepFailure, StepOutput};
