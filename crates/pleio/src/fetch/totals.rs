//! Running totals of every gather of a table, summed over its clones, all
//! threads and its lookahead worker ([`crate::Table::stats`]).

use std::sync::atomic::{AtomicU64, Ordering};

use super::GatherStats;

counters! {
/// Sums of [`GatherStats`] over every successful gather of one table since
/// it was opened: [`GatherTotals::gathers`], [`GatherTotals::rows`],
/// [`GatherTotals::bytes`], and every total by name in
/// [`GatherTotals::fields`]. New totals may be added.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GatherTotals {
    /// Gathers that succeeded.
    gathers: u64,
    /// Row ids gathered (duplicates counted).
    rows: u64,
    /// Row bytes copied out of the file.
    bytes: u64,
    /// Rows fetched with positioned reads rather than through the mapping.
    cold_rows: u64,
    /// `auto`: rows found in the page cache by `mincore`.
    found_resident: u64,
    /// Read requests issued.
    read_requests: u64,
    /// Bytes asked of the file by those reads.
    read_bytes: u64,
    /// Page runs advised.
    runs_advised: u64,
    /// Advice system calls.
    advice_syscalls: u64,
    /// Advice the kernel refused.
    advice_failures: u64,
    /// Gathers served by a fallback backend.
    fallbacks: u64,
    /// `auto` gathers that found pages evicted behind its back.
    rearms: u64,
    /// Gathers that found pleio's `SIGBUS` handler displaced by the host's.
    guard_displaced: u64,
    /// Gathers that installed it again (over a restored default).
    guard_reinstalled: u64,
    /// Gathers that read mapped rows with `pread` instead (the handler
    /// displaced by another one).
    guard_fallbacks: u64,
    /// Gathers served by the table's next tier after its first source failed.
    tier_fallbacks: u64,
}
}

impl GatherTotals {
    /// Gathers that succeeded.
    pub fn gathers(&self) -> u64 {
        self.gathers
    }

    /// Row ids gathered (duplicates counted).
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Row bytes copied out of the file.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Every total with its name, in a fixed order, for reports and
    /// bindings (pleio-py's `stats()` dict): `gathers`, `rows`, `bytes`,
    /// `cold_rows`, `found_resident`, `read_requests`, `read_bytes`,
    /// `runs_advised`, `advice_syscalls`, `advice_failures`, `fallbacks`,
    /// `rearms`, `guard_displaced`, `guard_reinstalled`, `guard_fallbacks`,
    /// `tier_fallbacks`.
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            ("gathers", self.gathers),
            ("rows", self.rows),
            ("bytes", self.bytes),
            ("cold_rows", self.cold_rows),
            ("found_resident", self.found_resident),
            ("read_requests", self.read_requests),
            ("read_bytes", self.read_bytes),
            ("runs_advised", self.runs_advised),
            ("advice_syscalls", self.advice_syscalls),
            ("advice_failures", self.advice_failures),
            ("fallbacks", self.fallbacks),
            ("rearms", self.rearms),
            ("guard_displaced", self.guard_displaced),
            ("guard_reinstalled", self.guard_reinstalled),
            ("guard_fallbacks", self.guard_fallbacks),
            ("tier_fallbacks", self.tier_fallbacks),
        ]
        .into_iter()
    }
}

/// The shared counters behind [`GatherTotals`].
#[derive(Debug, Default)]
pub(crate) struct Totals([AtomicU64; 16]);

impl Totals {
    /// Adds one gather. Zero fields are skipped: a warm gather costs two
    /// uncontended atomic adds.
    pub(crate) fn add(&self, s: &GatherStats) {
        let values = [
            1,
            s.rows,
            s.bytes,
            s.cold_rows,
            s.found_resident,
            s.read_requests,
            s.read_bytes,
            s.runs_advised,
            s.advice_syscalls,
            s.advice_failures,
            u64::from(s.fallback),
            u64::from(s.rearmed),
            s.guard_displaced,
            s.guard_reinstalled,
            s.guard_fallbacks,
            s.tier_fallbacks,
        ];
        for (c, v) in self.0.iter().zip(values) {
            if v != 0 {
                c.fetch_add(v, Ordering::Relaxed);
            }
        }
    }

    /// The totals now.
    pub(crate) fn get(&self) -> GatherTotals {
        let v = |i: usize| self.0[i].load(Ordering::Relaxed);
        GatherTotals {
            gathers: v(0),
            rows: v(1),
            bytes: v(2),
            cold_rows: v(3),
            found_resident: v(4),
            read_requests: v(5),
            read_bytes: v(6),
            runs_advised: v(7),
            advice_syscalls: v(8),
            advice_failures: v(9),
            fallbacks: v(10),
            rearms: v(11),
            guard_displaced: v(12),
            guard_reinstalled: v(13),
            guard_fallbacks: v(14),
            tier_fallbacks: v(15),
        }
    }
}
