//! The servers a step can talk to, behind one trait.
//!
//! - [`ollama`]: Ollama's native `POST /api/chat`.
//! - [`openai`]: `POST {base}/chat/completions`, served by OpenAI, llama.cpp's servers, vLLM,
//!   LM Studio and Ollama's `/v1`.
//! - [`scripted`]: canned turns from a file, for tests and reproducible demos. It is not a
//!   model and never says it is one.
//!
//! Each backend speaks its protocol with serde types of its own and hands the loop the
//! protocol-neutral [`Message`]s of [`crate::chat`].
//!
//! The HTTP backends ask for streamed replies ([`BackendConfig::stream`]) and put each one
//! together from its pieces (`stream.rs`), so that [`Backend::chat_observed`] can show it as it
//! arrives and a stalled server is noticed within [`HttpConfig::idle_timeout`]. The
//! [`ChatResponse`] is the one the same reply asked for whole gives, so nothing recorded
//! depends on whether it streamed. A server that cannot stream a request is asked again
//! without streaming (see [`Delivery`]), and is not asked to stream such requests again.

// Without the `http` feature the wire types and the reply parsers of the HTTP backends are
// compiled (the stream decoder and the scripted backend share them) but partly unused.
#![cfg_attr(not(feature = "http"), allow(dead_code, unused_imports))]

mod chat;
mod config;
mod error;
#[cfg(feature = "http")]
mod exchange;
pub(crate) mod http;
mod kind;
pub mod ollama;
mod open;
pub mod openai;
pub mod scripted;
pub(crate) mod stream;
mod wire;

pub use chat::{Backend, ChatRequest, ChatResponse, Delivery, Progress, PromptCache, PromptSize, Usage};
pub use config::BackendConfig;
pub use error::BackendError;
pub use http::{HttpConfig, RetryPolicy, RetryRecord};
pub use kind::BackendKind;
