//! The text parsers a library exposes: quantities (`--rows`, `--size`,
//! `--mem-cap`: `4096`, `64k`, `1.5G`), strategy, dtype and cold-mode
//! names. No input panics; a plain decimal number parses to itself; every
//! name that parses prints back to a name that parses to the same value.
//!
//! (The row-list and token-list parsers live in the `pleio` binary, out of
//! a fuzzer's reach.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use pleio::{Dtype, Strategy};
use pleio_lab::bench::ColdMode;
use pleio_lab::units::{parse_quantity, parse_quantity_arg};

fuzz_target!(|s: &str| {
    let q = parse_quantity(s);
    assert_eq!(q, parse_quantity_arg(s).ok());
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        assert_eq!(q, t.parse::<u64>().ok(), "{t:?}");
    }
    if let Some(v) = q {
        // The same number with a unit of 1024 is 1024 times as much.
        if v <= u64::MAX >> 10 && t.bytes().all(|b| b.is_ascii_digit()) {
            assert_eq!(parse_quantity(&format!("{t}k")), Some(v << 10));
        }
    }
    if let Ok(st) = s.parse::<Strategy>() {
        assert_eq!(st.name().parse::<Strategy>(), Ok(st));
    }
    if let Ok(d) = s.parse::<Dtype>() {
        assert_eq!(d.name().parse::<Dtype>(), Ok(d));
    }
    if let Ok(c) = s.parse::<ColdMode>() {
        assert_eq!(c.name().parse::<ColdMode>(), Ok(c));
    }
});
