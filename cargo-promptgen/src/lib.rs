//! Prompt chains declared in Cargo metadata, a committed lock, `cargo promptgen`, and the
//! build-script entry.
//!
//! (The tutorial is written below once the pieces are in place.)
#![warn(missing_docs)]

pub mod build_script;
pub mod config;
pub mod error;
pub mod generate;
pub mod layout;
pub mod lock;
pub mod lock_file;
pub mod plan;
pub mod report;
pub mod store;

pub use build_script::{build, Builder};
pub use error::Error;
