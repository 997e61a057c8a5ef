//! A clock for budgets checked on hot paths: the CPU's time-stamp counter,
//! read without a fence, where the kernel itself keeps time by it.
//!
//! `Instant::now` (the vDSO's `clock_gettime`) orders the counter read
//! after every earlier load, so a loop that reads it between batches of
//! random memory reads waits out a memory round trip each time; measured on
//! warm `auto` gathers of 1792 GGUF rows (a read per 16 rows): 103 us, and
//! 97 us with no clock read at all. An unfenced `rdtsc` does not wait. The
//! counter is converted with a rate learned from `Instant` itself, once at
//! least [`CALIBRATION`] has passed since the first use in this process;
//! until then (and on other CPUs, or where the kernel's clock source is not
//! the TSC) the clock is `Instant`. Good enough for a budget whose only use
//! is a heuristic: a window read as slow costs a few probes, never a wrong
//! row.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long after its first reading the counter's rate is learned.
const CALIBRATION: Duration = Duration::from_millis(2);

/// The first `(Instant, counter)` pair, if the counter is usable here.
static EPOCH: OnceLock<Option<(Instant, u64)>> = OnceLock::new();
/// Counter ticks per microsecond, times 2^16; 0 while unknown.
static RATE: AtomicU64 = AtomicU64::new(0);

#[cfg(target_arch = "x86_64")]
fn counter() -> u64 {
    // SAFETY: `rdtsc` reads a register; every x86-64 CPU has it, and it has
    // no effect on memory.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// True if the kernel keeps time by the TSC (so it runs at a constant rate
/// and agrees across CPUs).
#[cfg(target_arch = "x86_64")]
fn counter_usable() -> bool {
    std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .is_ok_and(|s| s.trim() == "tsc")
}

#[cfg(not(target_arch = "x86_64"))]
fn counter() -> u64 {
    0
}

#[cfg(not(target_arch = "x86_64"))]
fn counter_usable() -> bool {
    false
}

/// The counter's rate (ticks per us, times 2^16), once known.
fn rate() -> Option<u64> {
    let r = RATE.load(Ordering::Relaxed);
    if r != 0 {
        return Some(r);
    }
    let (t0, c0) = (*EPOCH.get_or_init(|| counter_usable().then(|| (Instant::now(), counter()))))?;
    let (el, c1) = (t0.elapsed(), counter());
    if el < CALIBRATION {
        return None;
    }
    let us = el.as_nanos().max(1);
    let r = u64::try_from((u128::from(c1.wrapping_sub(c0)) << 16) * 1000 / us).ok()?;
    (r > 0).then(|| {
        RATE.store(r, Ordering::Relaxed);
        r
    })
}

/// Tells whether a stretch of work ran past a budget, cheaply.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BudgetClock {
    /// The budget in counter ticks, or `None` to use `Instant`.
    ticks: Option<u64>,
    budget: Duration,
}

/// A reading of a [`BudgetClock`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum Stamp {
    Counter(u64),
    Instant(Instant),
}

impl BudgetClock {
    /// A clock for `budget`: the counter where its rate is known, else
    /// `Instant`.
    pub(crate) fn new(budget: Duration) -> BudgetClock {
        let ticks = rate().and_then(|r| {
            let t = (budget.as_nanos() * u128::from(r) / 1000) >> 16;
            u64::try_from(t).ok()
        });
        BudgetClock { ticks, budget }
    }

    /// Now.
    pub(crate) fn stamp(&self) -> Stamp {
        match self.ticks {
            Some(_) => Stamp::Counter(counter()),
            None => Stamp::Instant(Instant::now()),
        }
    }

    /// True if more than the budget has passed since `since`.
    pub(crate) fn over(&self, since: Stamp) -> bool {
        match (since, self.ticks) {
            (Stamp::Counter(c), Some(t)) => counter().wrapping_sub(c) > t,
            (Stamp::Instant(i), _) => i.elapsed() > self.budget,
            (Stamp::Counter(_), None) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_is_over_when_it_has_passed_and_not_before() {
        let budget = Duration::from_millis(50);
        // Before and after the counter's rate is learned.
        for _ in 0..2 {
            let c = BudgetClock::new(budget);
            let s = c.stamp();
            assert!(!c.over(s), "{c:?}: over at once");
            std::thread::sleep(budget * 3);
            assert!(c.over(s), "{c:?}: not over after 3 budgets");
        }
        if counter_usable() {
            assert!(BudgetClock::new(budget).ticks.is_some(), "rate not learned");
        }
    }
}
