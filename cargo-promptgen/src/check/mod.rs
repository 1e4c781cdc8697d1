pub mod confine;
pub mod crate_check;
pub mod diagnostics;
pub mod redact;
