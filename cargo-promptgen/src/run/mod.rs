pub mod attempts;
pub mod schedule;
