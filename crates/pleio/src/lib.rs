//! pleio serves rows of huge on-disk embedding tables (the per-layer
//! embedding tables of GGUF models) fast, exactly and in bounded memory.
//!
//! Data flows one way: row ids are planned into reads, fetched by a
//! strategy, and decoded to f32 exactly as ggml's CPU `to_float` does.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod fetch;
pub mod gguf;
pub mod io;
pub mod lookahead;
pub mod map;
pub mod model;
pub mod ngram;
pub mod page_plan;
pub mod quant;
pub mod sys;
pub mod table;
#[cfg(feature = "tokenizer")]
pub mod tokenizer;
