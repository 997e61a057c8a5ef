//! The C ABI of pleio: `include/pleio.h` (generated from this crate by
//! cbindgen) and `libpleio_capi.{so,a}`.
//!
//! Everything a C caller reaches is in [`ffi`], the only module allowed
//! `unsafe` code (it turns C pointers into slices and writes C structs, each
//! block with a `// SAFETY:` comment). The rest is safe Rust: [`handles`]
//! keeps the open tables, prefetches and sequences behind opaque tokens that
//! are looked up, never dereferenced, so a closed, foreign or garbage handle
//! is an error rather than a crash; [`status`] turns engine errors into
//! status codes and the thread-local message behind `pleio_last_error`.
//!
//! The bindings add no logic of their own: every gather, prefetch and row-id
//! mapping is the engine's (`pleio::Table`), with the caller's arguments
//! checked and converted.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod api;
pub mod ffi;
pub mod handles;
pub mod status;
