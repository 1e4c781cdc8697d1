//! Prompt chains from Cargo metadata, the lock and the build-script entry.
//!
//! Not written yet: this crate is the subject of the cargo-promptgen issue. It exists so the
//! workspace has the layout the design fixes; it offers nothing yet.
