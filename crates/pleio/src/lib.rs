//! pleio serves rows of huge on-disk embedding tables (the per-layer
//! embedding tables of GGUF models) fast, exactly and in bounded memory.
//!
//! One entry point: [`Table::open`] a file, then [`Table::gather`] rows.
//!
//! ```no_run
//! let table = pleio::Table::open("model.gguf")?; // its per-layer-embedding table
//! let mut rows = vec![0f32; 2 * table.row_elems()];
//! table.gather(&[3, 1_000_000], &mut rows)?; // exactly ggml's to_float, any strategy
//! # Ok::<(), pleio::Error>(())
//! ```
//!
//! Data flows one way: token ids become row ids ([`ngram`]), row ids are
//! planned into page advice ([`page_plan`]) or read spans ([`io`]), a
//! [`Strategy`] fetches the bytes ([`fetch`]), and a decoder ([`quant`])
//! writes them as the [`Dtype`] asked for. Only [`sys`], [`map`], the
//! io_uring backend and the SIMD kernels may use `unsafe`.
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod error;
mod open;
mod output;
mod tuning;

pub mod cache;
pub mod checkpoint;
pub mod fetch;
pub mod gguf;
pub mod io;
pub mod layout;
pub mod lookahead;
#[allow(unsafe_code)] // the mapping: raw pointers into mapped file bytes
pub mod map;
pub mod model;
pub mod ngram;
pub mod page_plan;
pub mod quant;
pub mod safetensors;
#[allow(unsafe_code)] // the OS layer: every system call
pub mod sys;
#[cfg(feature = "tokenizer")]
pub mod tokenizer;

pub use cache::CachePolicy;
pub use error::{Error, ErrorKind, Result};
pub use fetch::{GatherStats, GatherTotals, Strategy, Table};
pub use layout::{Layout, RowId};
pub use open::OpenOptions;
pub use output::{Dtype, Rounding};

/// The README's code blocks, compiled by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

/// The code blocks of docs/library.md, compiled by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/library.md")]
pub struct DocsLibrary;
