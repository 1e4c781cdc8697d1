//! codegen-core's integration tests: one test binary (`it`) with a module per area, so that
//! `cargo test` links it once. `cargo test -p codegen-core --test it streaming::` runs one
//! module's tests. The data files the recorded tests serve are in `tests/data/`.

mod backends;
mod cancel;
mod check_loop;
mod constrained;
mod editing;
mod env_vars;
mod ollama_recorded;
mod prompt_bytes;
mod protocol_props;
mod sandbox;
mod scripted;
mod step_loop;
mod stream_props;
mod streaming;
mod streams_recorded;
mod support;
