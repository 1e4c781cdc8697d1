//! cargo-promptgen's integration tests, most of them end to end (the real binary, real
//! `cargo`, the fake LLM server on loopback): one test binary (`it`) with a module per area,
//! so that `cargo test` links it once. `cargo test -p cargo-promptgen --test it graph::` runs
//! one module's tests; `support` is what they share. The ignored ones need a server a script
//! starts: `real_llm::` (scripts/real-llm.sh), `s3_cache::` (scripts/s3-cache.sh) and
//! `watching::html_report_page` (scripts/html-report.sh).

mod cache_store;
mod chain_flow;
mod cli;
mod compile_check;
mod config;
mod confine;
mod crash_points;
mod crate_check;
mod dependency;
mod docs;
mod eval;
mod example_app;
mod graph;
mod real_llm;
mod regenerate;
mod reliability;
mod s3_cache;
mod support;
mod untrusted;
mod watching;
