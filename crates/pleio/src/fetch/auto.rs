//! `auto`: resident rows straight from the mapping, cold rows advised all
//! at once, and an honest view of the page cache.
//!
//! One pass over the request: a row whose pages the residency bitmap marks
//! resident is copied out of the mapping at once (no system call, no thread
//! hop; the copy survives a file shrinking under it, see
//! [`crate::sys::SIGBUS_PROTECTED`]); any other row is set aside. The
//! set-aside rows' pages are then advised together (`MADV_WILLNEED`,
//! batched as `advise` does: every read in flight at once, issued from this
//! thread's system call), copied out of the mapping the same way (each
//! touch waits for its page's read and leaves the page in this process's
//! page tables), and marked resident. So the next pass over those rows
//! takes no fault at all. Measured against reading the cold rows with
//! buffered io_uring (the earlier design): that was slower cold, as reads
//! that miss the page cache are punted to kernel worker threads, and its
//! first warm pass paid a minor fault per page, as the pages were cached
//! but not mapped; populating the page tables after the read
//! (`MADV_POPULATE_READ`) fixed the warm pass but not the cold one
//! (experimental builds measured in the session that made this change; the
//! docs/benchmarks.md has the chosen design's figures). Every row is written to the
//! output last, so an error leaves it untouched.
//!
//! Rows the bitmap does not know are not taken as cold blindly: the first
//! few are checked against the page cache (a *probe*: `cachestat`, or
//! `mincore`, or for a reader the kernel hides residency from, a one-byte
//! cache-only read; see [`crate::map::ResidencyMethod`]), and if any is
//! in the page cache (a fresh process over a warm cache), all of them are,
//! and the resident ones take the mapped path and are learned. A truly cold
//! batch pays at most [`PROBE`] probes for this.
//!
//! The bitmap goes stale when the kernel evicts pages pleio read. The warm
//! path watches for that: it is timed in windows of [`WINDOW`] rows (one
//! clock read per window but the last, an unfenced time-stamp counter read
//! where it can be, see [`crate::sys::clock`]; no system call). A window
//! slower than [`WINDOW_BUDGET`] is the eviction signature (a major fault
//! costs a device read, tens of microseconds; a window of resident rows,
//! even with minor faults, costs a few). Then the next window's rows are
//! probed before they are touched: one found evicted
//! confirms it, the rest of the batch joins the cold reads, the bitmap is
//! cleared (eviction rarely takes one page) and re-learned from this batch
//! on, and the stats say `rearmed`. A slow window with nothing evicted
//! behind it (the thread was preempted) costs at most [`WINDOW`] probes
//! and nothing else.

use std::time::Duration;

use super::direct::Kind;
use super::known_pages::Residency;
use super::{with_staged, GatherError, GatherStats, PartScratch, Staged, Table};
use crate::layout::{BatchExtent, ExtentOrder};
use crate::output::Out;
use crate::tuning::TUNING;
use crate::sys::clock::BudgetClock;
use crate::sys::guard::Scope;

/// Rows decoded between two clock reads on the warm path
/// ([`Tuning::window_rows`](crate::tuning::Tuning::window_rows)).
pub(super) const WINDOW: usize = TUNING.window_rows;

/// A warm window slower than this is the eviction signature
/// ([`Tuning::window_budget`](crate::tuning::Tuning::window_budget)).
pub(super) const WINDOW_BUDGET: Duration = TUNING.window_budget;

/// Rows believed cold that are probed before the device is asked
/// ([`Tuning::probe_rows`](crate::tuning::Tuning::probe_rows)).
pub(super) const PROBE: usize = TUNING.probe_rows;

impl Table {
    /// The residency bitmap, created on first use.
    pub(super) fn residency(&self) -> &Residency {
        self.shared.residency.get_or_init(|| {
            let page = self
                .mapping()
                .map_or_else(crate::sys::page_size, |m| m.page_size());
            Residency::of(&self.shared.table, page)
        })
    }

    /// True if the page cache holds every page of every part of `row` (a
    /// probe; see [`crate::map::Mapping::all_resident`]).
    fn probe_resident(&self, row: u64) -> bool {
        let Ok(ext) = self.shared.table.extents(row) else {
            return false;
        };
        ext.as_slice().iter().all(|e| {
            self.mapping_of(e.file)
                .and_then(|m| m.all_resident(e.offset..e.offset + e.len))
                .unwrap_or(false)
        })
    }

    /// True if every region of the table is mapped.
    fn wholly_mapped(&self) -> bool {
        *self.shared.wholly_mapped.get_or_init(|| {
            self.shared.table.regions().all(|r| {
                self.mapping_of(r.file)
                    .and_then(|m| m.bytes(r.range.start, r.range.end - r.range.start))
                    .is_some()
            })
        })
    }

    pub(super) fn gather_auto(
        &self,
        rows: &[u64],
        out: &mut Out<'_>,
        stats: &mut GatherStats,
        guard: &Scope,
    ) -> Result<(), GatherError> {
        if !self.wholly_mapped() {
            // Table not mapped whole (unmapped fragments, or no mapping):
            // read everything; without a file, let the mapped path decide.
            return match self.gather_direct(Kind::Uring, rows, out, stats) {
                Err(GatherError::NoFile { .. }) => self.gather_mapped(rows, out, guard),
                r => r,
            };
        }
        with_staged(|st| {
            super::with_part_scratch(|ps| {
                // Several regions: every row's extents found once for the
                // batch, so a warm window's residency test and copy are
                // lookups (a second shard search and extent build a window
                // cost a warm 1792-row FP8 gather a third of its time).
                let mut batch = std::mem::take(&mut ps.batch);
                let known = self.shared.table.single_region().is_none()
                    && self
                        .shared
                        .table
                        .batch_extents(rows, ExtentOrder::Rows, &mut batch)
                        .is_ok();
                let extents = known.then_some(&batch[..]);
                let r = self.auto_staged(rows, extents, out, stats, st, ps, guard);
                ps.batch = batch;
                r
            })
        })
    }

    /// Copies rows `ids` (request indices `slots`) out of the mapping into
    /// `dst`, taking their extents from `extents` (the request's, in row
    /// order) when given. `ps`: scratch.
    fn copy_slots(
        &self,
        guard: &Scope,
        ids: &[u64],
        slots: &[usize],
        extents: Option<&[BatchExtent]>,
        ps: &mut PartScratch,
        dst: &mut [u8],
    ) -> Result<(), GatherError> {
        let Some(extents) = extents else {
            return self.copy_mapped(guard, ids, dst);
        };
        let per = self.shared.table.parts().max(1);
        ps.parts.clear();
        for &j in slots {
            ps.parts.extend_from_slice(&extents[j * per..(j + 1) * per]);
        }
        self.copy_extents(guard, ids, &ps.parts, false, dst, &mut ps.addrs, &mut ps.spill)
    }

    /// `auto` over a wholly mapped table: rows believed resident are copied
    /// out of the mapping into `st` as the request is walked (timed, to
    /// catch eviction), the rest advised together and then copied out the
    /// same way; every row is written to `out` last, so a faulting copy
    /// leaves it untouched. A batch whose windows were all resident is
    /// staged in request order and written without slot lookups.
    ///
    /// `extents`: every part of every row of `rows`, in row order, for a
    /// table of several regions (`None`: found row by row).
    #[allow(clippy::too_many_arguments)]
    fn auto_staged(
        &self,
        rows: &[u64],
        extents: Option<&[BatchExtent]>,
        out: &mut Out<'_>,
        stats: &mut GatherStats,
        st: &mut Staged,
        ps: &mut PartScratch,
        guard: &Scope,
    ) -> Result<(), GatherError> {
        let rb = self.shared.table.row_bytes() as usize;
        let per = self.shared.table.parts().max(1);
        let res = self.residency();
        self.stage_rows(&mut st.bytes, rows.len(), rows.len(), out)?;
        st.slots.clear();
        // Appends `ids` (request indices `slots`) to the staging.
        let stage = |st: &mut Staged, ps: &mut PartScratch, ids: &[u64], slots: &[usize]| {
            let at = st.slots.len() * rb;
            let dst = &mut st.bytes[at..at + ids.len() * rb];
            self.copy_slots(guard, ids, slots, extents, ps, dst)?;
            st.slots.extend_from_slice(slots);
            Ok::<(), GatherError>(())
        };
        let mut cold: Vec<usize> = Vec::new();
        let mut evicted = false;
        let (mut ids, mut slots) = ([0u64; WINDOW], [0usize; WINDOW]);
        // Every window so far was wholly resident: the staging holds rows
        // 0.. in request order.
        let mut sequential = true;
        let n = rows.len();
        // The rows of the window after next are asked of memory (a software
        // prefetch: no fault, no wait) before each window's clock read
        // (which, when it was `Instant::now`, waited for every earlier
        // load to finish; see `sys::clock`); without it a warm
        // 1792-row gather took 1.8-2x `fault`'s time on a GGUF table, one
        // memory round trip per window. A checkpoint's rows are prefetched
        // from the batch's extents: when each row's extents had to be
        // found again for it, the prefetch cost FP8 as much as it saved
        // and cost MLX 4-bit 20-40%; from the extents it saves 20-30%.
        // `copy_extents` is told so and does not prefetch them again (MLX
        // 4-bit, old and new alternated: 1792 rows 308-310 -> 299 us, 16
        // rows 2.18 -> 2.04 us, medians).
        let ahead = self
            .shared
            .table
            .single_region()
            .and_then(|r| Some((self.mapping_of(r.file)?, r.range.start)));
        let prefetch = |from: usize| {
            let ids = from.min(n)..(from + WINDOW).min(n);
            if let Some((m, start)) = ahead {
                for &r in &rows[ids] {
                    if let Some(at) = r.checked_mul(rb as u64).and_then(|o| o.checked_add(start)) {
                        m.prefetch(at, rb as u64);
                    }
                }
            } else if let Some(e) = extents {
                self.prefetch_extents(&e[ids.start * per..ids.end * per]);
            }
        };
        prefetch(0);
        prefetch(WINDOW);
        let clock = BudgetClock::new(WINDOW_BUDGET);
        let mut i = 0;
        while i < n {
            let end = (i + WINDOW).min(n);
            prefetch(end + WINDOW);
            let started = (end < n).then(|| clock.stamp());
            let window = &rows[i..end];
            let known = extents.map(|e| &e[i * per..end * per]);
            let warm = match known {
                Some(parts) => parts.iter().all(|p| res.extent_resident(&p.extent)),
                None => window.iter().all(|&r| res.is_resident(r)),
            };
            if warm {
                // The warm case: the window as it is.
                let at = st.slots.len() * rb;
                let dst = &mut st.bytes[at..at + window.len() * rb];
                match known {
                    Some(parts) => {
                        self.copy_extents(guard, window, parts, true, dst, &mut ps.addrs, &mut ps.spill)?
                    }
                    None => self.copy_mapped(guard, window, dst)?,
                }
                st.slots.extend(i..end);
            } else {
                sequential = false;
                let mut k = 0;
                for (j, &row) in rows.iter().enumerate().take(end).skip(i) {
                    if res.is_resident(row) {
                        ids[k] = row;
                        slots[k] = j;
                        k += 1;
                    } else {
                        cold.push(j);
                    }
                }
                if k > 0 {
                    stage(st, ps, &ids[..k], &slots[..k])?;
                }
            }
            i = end;
            if started.is_some_and(|s| clock.over(s)) {
                // Eviction signature: before touching more rows, probe the
                // next window's. One believed resident but gone confirms an
                // eviction: the bitmap is stale, so the rest of the batch
                // is read as cold. Otherwise it was noise (preemption) and
                // the warm path carries on.
                let next = &rows[i..(i + WINDOW).min(n)];
                if next
                    .iter()
                    .any(|&r| res.is_resident(r) && !self.probe_resident(r))
                {
                    evicted = true;
                    cold.extend(i..n);
                    break;
                }
            }
        }
        if evicted {
            res.clear();
            stats.rearmed = true;
        } else if cold
            .iter()
            .take(PROBE)
            .any(|&j| self.probe_resident(rows[j]))
        {
            // The bitmap knows only the pages pleio read itself; the page
            // cache may hold more (an earlier process, another reader).
            // Some of the first rows believed cold are resident, so every
            // one is checked: the resident ones are copied from the mapping
            // and learned, the rest go to the device.
            let mut still = Vec::with_capacity(cold.len());
            for &j in &cold {
                if self.probe_resident(rows[j]) {
                    stage(st, ps, &rows[j..=j], &[j])?;
                    res.mark(rows[j]);
                    stats.found_resident += 1;
                } else {
                    still.push(j);
                }
            }
            cold = still;
        }
        if !cold.is_empty() {
            // Every cold page advised at once, then copied out in request
            // order (the module docs say why).
            let cold_rows: Vec<u64> = cold.iter().map(|&j| rows[j]).collect();
            let pages = stats.pages;
            self.plan(&cold_rows, stats, true);
            stats.pages = pages;
            stage(st, ps, &cold_rows, &cold)?;
            for &row in &cold_rows {
                res.mark(row);
            }
            stats.cold_rows += cold.len() as u64;
        }
        let staged = st.slots.len() * rb;
        // Every row staged in request order (a warm batch): no slot lookups.
        let in_order = sequential && st.slots.len() == n;
        let slots = (!in_order).then_some(&st.slots[..]);
        self.put_staged(&st.bytes[..staged], slots, out)?;
        if evicted {
            // Everything this batch touched is resident now.
            for &row in rows {
                res.mark(row);
            }
        }
        Ok(())
    }
}
