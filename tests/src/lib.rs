//! The fake LLM server (work in progress).
