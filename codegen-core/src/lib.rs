//! (crate docs are written last)
pub mod chat;
pub mod fs;
pub mod protocol;
pub mod sandbox;
pub mod tools;
