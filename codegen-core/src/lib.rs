//! Runs one prompt to completion against a language model that reads and writes files
//! through tools.
//!
//! A *step* sends a prompt to a model together with its tools: `read_file`, `write_file`,
//! `edit_file`, `list_files`, `finish`, and `check` when the step has a [`Check`](check::Check). The model
//! calls them, the loop carries the calls out inside a [`Sandbox`](sandbox::Sandbox) and sends
//! the results back, until the model calls `finish`, replies without a tool call, or uses up
//! its budget of model calls. Everything that happened is kept in a
//! [`Transcript`](transcript::Transcript).
//!
//! This crate is the engine of `cargo-promptgen`, which runs chains of steps from `build.rs`
//! and keeps a lock of what they produced; use it directly to run a prompt from your own code.
//!
//! # Running one prompt
//!
//! With [Ollama](https://ollama.com) running and a code model pulled
//! (`ollama pull qwen2.5-coder:7b`):
//!
//! ```no_run
//! use codegen_core::backend::{BackendConfig, BackendKind};
//! use codegen_core::sandbox::Sandbox;
//! use codegen_core::{Step, ToolProtocol};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The server: Ollama at OLLAMA_HOST, or http://127.0.0.1:11434.
//! let mut backend = BackendConfig::new(BackendKind::Ollama).open()?;
//!
//! // What the model may touch: it writes only under `generated/`, and may also read
//! // `src/domain.rs` (under that same name).
//! let mut sandbox = Sandbox::builder("generated")
//!     .input("src/domain.rs", "src/domain.rs")
//!     .build()?;
//!
//! let output = Step::new(
//!     "qwen2.5-coder:7b",
//!     "Write the file view.rs containing a Rust trait `View` with two methods: \
//!      `fn ask_name(&mut self) -> String` and `fn show_greeting(&mut self, name: &str)`.",
//! )
//! .seed(123)
//! .temperature(0.0)
//! .max_model_calls(8)
//! .protocol(ToolProtocol::Native)
//! .expect_output("view.rs")
//! .run(backend.as_mut(), &mut sandbox)?;
//!
//! println!("wrote {:?}: {}", output.written, output.summary.unwrap_or_default());
//! let totals = output.transcript.totals();
//! println!("{} model calls, {} + {} tokens", totals.model_calls, totals.prompt_tokens, totals.completion_tokens);
//! # Ok(())
//! # }
//! ```
//!
//! [`run_prompt`] does the same in one call with every default (and a sandbox that reads
//! only its own output folder).
//!
//! The same step without any server, from canned turns (this example runs as a test):
//!
//! ```
//! use codegen_core::backend::scripted::Scripted;
//! use codegen_core::chat::{Arguments, Message, ToolCall};
//! use codegen_core::sandbox::Sandbox;
//! use codegen_core::Step;
//! use serde_json::json;
//!
//! let call = |name: &str, args: serde_json::Value| ToolCall {
//!     id: format!("call_{name}"),
//!     name: name.into(),
//!     arguments: Arguments::from_value(args),
//! };
//! let mut backend = Scripted::from_turns("example", vec![
//!     Message::assistant("", vec![call("write_file", json!({"path": "view.rs", "content": "pub trait View {}\n"}))]),
//!     Message::assistant("", vec![call("finish", json!({"summary": "Wrote view.rs."}))]),
//! ]);
//! let dir = tempfile::tempdir().unwrap();
//! let mut sandbox = Sandbox::builder(dir.path()).build().unwrap();
//! let output = Step::new("scripted", "Write view.rs.")
//!     .expect_output("view.rs")
//!     .run(&mut backend, &mut sandbox)
//!     .unwrap();
//! assert_eq!(output.written, ["view.rs"]);
//! assert_eq!(std::fs::read_to_string(dir.path().join("view.rs")).unwrap(), "pub trait View {}\n");
//! ```
//!
//! # Backends and their environment
//!
//! | backend | server | URL | other variables |
//! | --- | --- | --- | --- |
//! | `ollama` | Ollama's `/api/chat` | `base_url`, else `OLLAMA_HOST` (every form Ollama accepts), else `http://127.0.0.1:11434` | |
//! | `openai` | `/chat/completions` of OpenAI, llama.cpp servers, vLLM, LM Studio | `base_url`, else `OPENAI_BASE_URL`, else `https://api.openai.com/v1` | `OPENAI_API_KEY`, sent as a Bearer token when set |
//! | `scripted` | none: canned turns from a file | | |
//!
//! Ollama receives `num_ctx` on every request ([`BackendConfig::num_ctx`](backend::BackendConfig::num_ctx),
//! 16384 by default): its own default is small and silently drops the front of a long
//! history. Connection failures and the statuses 408, 409, 429 and 5xx are retried with
//! backoff ([`RetryPolicy`](backend::RetryPolicy)).
//!
//! # Streaming, timeouts and watching a step
//!
//! The HTTP backends ask for streamed replies ([`BackendConfig::stream`](backend::BackendConfig::stream))
//! and put each one together into exactly the response the server sends whole, so a
//! [`Transcript`](transcript::Transcript) does not depend on streaming. A server that cannot
//! stream a request (llama-cpp-python sends an empty stream when tools are offered, and its
//! streams carry no token counts; a stream may end before its final event) is asked again
//! without streaming, and not asked to stream such requests again
//! ([`Delivery`](backend::Delivery), kept with the transcript's volatile data and in
//! [`StepOutput::notes`]).
//!
//! A streamed reply has no limit on its length in time, only on its silences
//! ([`HttpConfig`](backend::HttpConfig)): five minutes before its first byte, since a local
//! model loads its weights and reads the whole prompt first, and one minute between two of its
//! pieces, so that a stalled server is noticed within a minute
//! ([`BackendError::Stalled`](backend::BackendError::Stalled)). Ollama sends nothing while a
//! model writes a tool call, so a request that offers it tools may be silent as long as a whole
//! request may take: ten minutes, the limit of a reply asked for whole.
//!
//! [`Step::run_with`] shows an [`Observer`] each event as it is recorded and each reply as it
//! streams in ([`Progress`](backend::Progress): pieces so far, about one token each, characters
//! of text and of tool-call arguments, the tool being called):
//!
//! ```no_run
//! use codegen_core::backend::{BackendConfig, BackendKind, Progress};
//! use codegen_core::sandbox::Sandbox;
//! use codegen_core::transcript::Event;
//! use codegen_core::{Observer, Step};
//!
//! struct Show;
//!
//! impl Observer for Show {
//!     fn event(&mut self, event: &Event) {
//!         if let Event::ModelCall { number, usage, .. } = event {
//!             eprintln!("\ncall {number}: {:?} tokens", usage.completion_tokens);
//!         }
//!     }
//!
//!     fn progress(&mut self, progress: &Progress<'_>) {
//!         let rate = progress.pieces as f64 / progress.elapsed.as_secs_f64().max(1e-3);
//!         eprint!("\r~{} tokens, {rate:.1}/s, {}", progress.pieces, progress.tool.unwrap_or("writing"));
//!     }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut backend = BackendConfig::new(BackendKind::Ollama).open()?;
//! let mut sandbox = Sandbox::builder("generated").build()?;
//! Step::new("qwen2.5-coder:7b", "Write hello.rs.").run_with(backend.as_mut(), &mut sandbox, None, &mut Show)?;
//! # Ok(())
//! # }
//! ```
//!
//! # Tool protocols
//!
//! [`ToolProtocol::Native`] uses the server's `tools` field, and also runs tool calls that a
//! model writes as text in its reply (qwen2.5-coder does). [`ToolProtocol::Json`] describes
//! the tools in the system prompt and reads a JSON object from the reply;
//! [`ToolProtocol::Blocks`] uses `@@@write_begin(path)` ... `@@@write_end` blocks, which need
//! no JSON escaping of code. When Ollama answers that a model "does not support tools", the
//! step falls back to `Json` by itself and notes it in [`StepOutput::notes`].
//!
//! # Constrained decoding
//!
//! By default ([`Constrain::Auto`], [`Step::constrain`]) a step asks the server to enforce its
//! protocol where the server can: a JSON schema for `json`, a GBNF grammar for `blocks`, a
//! required tool call for `native` (or, where the server cannot require one, the `json`
//! protocol under a schema). Each turn's constraint admits only the calls that can succeed
//! then: writes to declared outputs, reads of readable files, `finish` once every output
//! exists. A server that rejects the constraint is asked again without it, once. See
//! [`constrain`] for which servers enforce what.
//!
//! # When the model gets it wrong
//!
//! A malformed call (bad JSON, unknown tool, missing argument, a path the sandbox refuses,
//! `finish` while a declared output is missing) is answered with the exact problem and what
//! is allowed, and the model tries again. Each such *repair* is recorded and counts against
//! `max_model_calls`. Only running out of budget, or a server that cannot be used, fails a step.
//! No model output makes this crate panic.
//!
//! # Modules
#![deny(missing_docs)]

pub mod backend;
mod cancel;
pub mod chat;
pub mod check;
mod compile_time;
pub mod constrain;
pub mod edit;
pub mod fs;
mod protocol;
mod report;
mod run;
pub mod sandbox;
mod tools;
pub mod transcript;

pub use cancel::Cancel;
pub use constrain::Constrain;
pub use fs::FsError;
pub use protocol::ToolProtocol;
pub use report::error_with_causes;
pub use run::{Error, Observer, Step, StepFailure, StepOutput, run_prompt};

/// Not API. `cargo-promptgen`, the benchmarks and the tests use these internals (the file
/// operations, the parsers of model text, the tool definitions, the stream decoder); anything
/// in it may change or go in any release.
#[doc(hidden)]
pub mod __private {
    #![allow(missing_docs)]
    pub mod protocol {
        pub use crate::protocol::{blocks, text};
    }
    pub mod run {
        pub use crate::run::contract;
    }
    pub mod tools {
        pub use crate::tools::*;
    }
    pub mod stream {
        pub use crate::backend::stream::*;
    }
}
