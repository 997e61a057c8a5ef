//! Benchmarks live in `benches/` (criterion) and `examples/`; this crate
//! has no library code of its own.
#![deny(unsafe_code)]
