//! The read paths' machine-tuned settings, in one place, each with the
//! measurement its default comes from.
//!
//! These were tuned on one machine (the build VM: 2 cores, a virtio disk
//! whose queue-depth-1 read takes 60-100 us) and sat as constants in the
//! modules that use them. None changes a result: every setting trades time
//! for time (a wasted probe, a wider read), never bytes, so a machine they
//! fit badly is slower, not wrong. They are crate-internal: no engine user
//! has needed to set them, and the public options stay small; a measured
//! need on another machine is the reason to expose one (as `with_budget`
//! exposes the cache budget).
//!
//! Settings that belong to one read backend's configuration live there
//! (`io::ReaderConfig::new`: the ring's and the pool's queue depths); the lab's own
//! measurement constants (the floor's queue depths, phase budgets) live in
//! `pleio-lab`.

use std::time::Duration;

/// The read paths' settings (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tuning {
    /// `auto`'s warm path reads the clock once per window of this many
    /// rows. A decode batch (16 rows) fits in one window and so reads no
    /// clock at all: measured, two clock reads (~30 ns each here) were 7%
    /// of a warm 16-row gather. Also the stack buffers' length, hence a
    /// constant.
    pub window_rows: usize,
    /// A warm window slower than this is taken as the eviction signature
    /// (then the next window is probed before it is touched). One major
    /// fault on the build machine's disk costs 60-100 us (a queue-depth-1
    /// read); sixteen resident rows of 90 B cost under 2 us, sixteen minor
    /// faults under 20 us. Too low for a machine (a slow CPU, rows of
    /// several KiB) costs up to `window_rows` probes per slow window; too
    /// high (a disk faster than the budget) notices eviction later.
    pub window_budget: Duration,
    /// Rows believed cold that `auto` probes before asking the device: if
    /// none is resident the batch is taken as truly cold, so a cold batch
    /// pays at most this many probes (about a microsecond each).
    pub probe_rows: usize,
    /// The direct strategies read rows at most this many bytes apart as one
    /// span (the gap read and ignored): one request instead of two for rows
    /// sharing a page, at the cost of at most this many wasted bytes per
    /// merge.
    pub coalesce_gap: usize,
    /// Reads in flight on the row cache's ring. Measured on the build
    /// machine's virtio disk under load (cold replays of 16k corpus tokens,
    /// four rounds): 256 beat 64 in every round (4.6-8.3k against 3.2-5.7k
    /// tokens/s); 512 was no better.
    pub cache_queue_depth: u32,
}

impl Tuning {
    /// The defaults, as measured above.
    pub(crate) const DEFAULT: Tuning = Tuning {
        window_rows: 16,
        window_budget: Duration::from_micros(50),
        probe_rows: 8,
        coalesce_gap: 1024,
        cache_queue_depth: 256,
    };
}

/// The settings the read paths use.
pub(crate) const TUNING: Tuning = Tuning::DEFAULT;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_keep_their_documented_relations() {
        let t = TUNING;
        // A decode batch fits one window, and a cold batch's probes fit it.
        assert!(t.window_rows >= 16 && t.probe_rows <= t.window_rows);
        // Below one queue-depth-1 device read on the build machine (60 us).
        assert!(t.window_budget < Duration::from_micros(60));
        // A merge wastes less than a page.
        assert!(t.coalesce_gap < 4096);
        assert!(t.cache_queue_depth.is_power_of_two());
    }
}
