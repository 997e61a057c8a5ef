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
//! The API: [`Table`] (opened by [`Table::open`] or [`OpenOptions`]),
//! [`Table::gather`] / [`Table::gather_as`] as a [`Dtype`] with a
//! [`Strategy`] and a [`Rounding`] rule, [`Table::prefetch`] for the next
//! batch, [`GatherStats`] / [`GatherTotals`], one [`Error`], and token ids
//! to row ids ([`Table::sequence`], [`OwnedSequence`]).
//!
//! Inside, data flows one way: token ids become row ids (`ngram`), row ids
//! become a batch's extents (`layout`), one coalescer turns extents into
//! page advice or reads (`coalesce`), a strategy fetches the bytes
//! (`fetch`, through the readers of `io`), and a decoder (`quant`) writes
//! them as the dtype asked for. Only `sys`, `map`, the io_uring backend and
//! the SIMD kernels may use `unsafe`. These modules are public only with
//! the `internals` feature (pleio's lab, CLI, benches and tests): not an
//! API.
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
// Without `internals`, the items only the lab and the tests use are unused,
// and the names clippy accepts in public enums (`Value::Array`,
// safetensors' `BOOL`) are flagged in private ones.
#![cfg_attr(
    not(feature = "internals"),
    allow(
        dead_code,
        unused_imports,
        clippy::enum_variant_names,
        clippy::upper_case_acronyms
    )
)]

// A struct of counters whose fields are public with the `internals`
// feature (the lab, the CLI and the tests read them directly) and
// crate-private without: an engine reads the accessors and `fields()`.
macro_rules! counters {
    ($(#[$attr:meta])* pub struct $name:ident {
        $($(#[$fattr:meta])* $field:ident: $ty:ty,)*
    }) => {
        #[cfg(feature = "internals")]
        $(#[$attr])*
        pub struct $name { $($(#[$fattr])* pub $field: $ty,)* }
        #[cfg(not(feature = "internals"))]
        $(#[$attr])*
        pub struct $name { $($(#[$fattr])* pub(crate) $field: $ty,)* }
    };
}

mod blocks;
mod error;
mod open;
mod output;
mod tuning;

// The engine's internals: public with the `internals` feature (the lab, the
// CLI, the benches, the fuzz targets and the tests enable it), private
// without. An engine uses the façade re-exported below.
macro_rules! internal_mods {
    ($($(#[$attr:meta])* $name:ident;)*) => {$(
        $(#[$attr])*
        #[cfg(feature = "internals")]
        pub mod $name;
        $(#[$attr])*
        #[cfg(not(feature = "internals"))]
        mod $name;
    )*};
}

internal_mods! {
    cache;
    checkpoint;
    coalesce;
    fetch;
    gguf;
    io;
    layout;
    #[allow(unsafe_code)] // the mapping: raw pointers into mapped file bytes
    map;
    model;
    ngram;
    quant;
    remote;
    safetensors;
    #[allow(unsafe_code)] // the OS layer: every system call
    sys;
}

#[cfg(feature = "tokenizer")]
pub mod tokenizer;

pub use blocks::{decode_blocks, decode_blocks_f32};
#[cfg(feature = "internals")]
pub use cache::CachePolicy;
pub use error::{Error, ErrorKind, Result};
#[cfg(feature = "internals")]
pub use fetch::lookahead;
pub use fetch::lookahead::{Prefetch, Prefetched};
pub use fetch::{GatherStats, GatherTotals, SigbusGuard, Strategy, Table};
#[cfg(feature = "internals")]
pub use layout::Layout;
pub use layout::RowId;
pub use ngram::OwnedSequence;
#[cfg(feature = "internals")]
pub use ngram::RowMapper;
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
