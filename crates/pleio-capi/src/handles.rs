//! Opaque handles: what a C caller holds instead of a pointer.
//!
//! A handle is a token, an integer in pointer clothing that encodes the
//! kind of object (table, prefetch, sequence), a slot index and the slot's
//! generation. The token is looked up in that kind's [`Registry`] and never
//! dereferenced, so a handle that was closed, belongs to another kind, or
//! was never issued is reported as `PLEIO_ERR_HANDLE` instead of being
//! followed into freed memory.
//!
//! Slots are reused: ending a handle bumps its slot's generation and puts
//! the slot on a free list, so a program that opens and closes (or
//! prefetches and waits) forever keeps as many slots as it ever had handles
//! alive at once. A stale token still fails: its generation no longer
//! matches the slot's. A slot whose generation would wrap around is retired
//! instead of reused, so a stale token can never alias a newer object.
//!
//! Each slot has its own lock. A call works on its object under that
//! slot's read lock ([`Registry::with`]: two atomic operations on the
//! handle's own cache line, no reference count to bump), so any number of
//! threads use one object at once, and calls on different handles never
//! wait for each other. Ending a handle (a write) waits for the calls in
//! flight on that handle only, or for at most a timeout
//! ([`Registry::remove_within`]); the object is dropped after the lock is
//! released. Slots live in chunks that are allocated once and never move
//! or shrink, so finding a slot takes no registry-wide lock either; the
//! free list has a mutex, taken only to open and to end handles.

use std::sync::{Mutex, OnceLock, RwLock, TryLockError};
use std::time::{Duration, Instant};

use crate::status::{Failure, Status};

/// Low bits of a token that hold its kind.
const KIND_BITS: u32 = 4;
/// Bits of a token above the kind that hold the slot index plus one.
const INDEX_BITS: u32 = if usize::BITS >= 64 { 28 } else { 14 };
/// Bits of a token above the index that hold the slot's generation.
const GEN_BITS: u32 = usize::BITS - KIND_BITS - INDEX_BITS;
/// Slots a registry can hold (index + 1 must fit in [`INDEX_BITS`]).
const MAX_SLOTS: usize = (1 << INDEX_BITS) - 1;
/// Slots of the first chunk; chunk `c` holds `FIRST_CHUNK << c`.
const FIRST_CHUNK: usize = 16;
/// Chunks enough for [`MAX_SLOTS`].
const CHUNKS: usize = (INDEX_BITS - FIRST_CHUNK.trailing_zeros()) as usize + 1;

/// Which registry a token belongs to (nonzero, below `1 << KIND_BITS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Kind {
    /// `pleio_table`.
    Table = 1,
    /// `pleio_batch`.
    Prefetch = 2,
    /// `pleio_sequence`.
    Sequence = 3,
}

impl Kind {
    fn c_name(self) -> &'static str {
        match self {
            Kind::Table => "pleio_table",
            Kind::Prefetch => "pleio_batch",
            Kind::Sequence => "pleio_sequence",
        }
    }
}

/// One slot: the generation of its current (or next) handle and the
/// object, if a handle is open on it.
#[derive(Debug)]
struct Cell<T> {
    generation: usize,
    value: Option<T>,
}

type Slot<T> = RwLock<Cell<T>>;

/// Which slots are free.
#[derive(Debug)]
struct Alloc {
    /// Ended slots, ready for reuse.
    free: Vec<usize>,
    /// Slots ever made (the next new index).
    made: usize,
}

/// The live objects of one kind, by slot.
#[derive(Debug)]
pub struct Registry<T> {
    kind: Kind,
    chunks: [OnceLock<Box<[Slot<T>]>>; CHUNKS],
    alloc: Mutex<Alloc>,
}

/// The chunk of slot `index` and its place in it.
#[inline]
fn chunk_of(index: usize) -> (usize, usize) {
    // chunk c starts at FIRST_CHUNK * (2^c - 1)
    let c = (index / FIRST_CHUNK + 1).ilog2() as usize;
    (c, index - FIRST_CHUNK * ((1 << c) - 1))
}

impl<T> Registry<T> {
    /// An empty registry of `kind` (usable in a `static`).
    pub const fn new(kind: Kind) -> Registry<T> {
        Registry {
            kind,
            chunks: [const { OnceLock::new() }; CHUNKS],
            alloc: Mutex::new(Alloc {
                free: Vec::new(),
                made: 0,
            }),
        }
    }

    fn alloc(&self) -> std::sync::MutexGuard<'_, Alloc> {
        self.alloc.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The slot at `index`, if it was ever made.
    #[inline]
    fn slot(&self, index: usize) -> Option<&Slot<T>> {
        let (c, i) = chunk_of(index);
        self.chunks.get(c)?.get()?.get(i)
    }

    /// Stores `value` in a free slot (a new one when none is free) and
    /// returns its token (never 0).
    pub fn insert(&self, value: T) -> Result<usize, Failure> {
        let index = {
            let mut a = self.alloc();
            match a.free.pop() {
                Some(i) => i,
                None => {
                    let i = a.made;
                    if i >= MAX_SLOTS {
                        return Err(Failure::new(
                            Status::PLEIO_ERR_SETUP,
                            format!(
                                "too many {} handles open at once ({MAX_SLOTS})",
                                self.kind.c_name()
                            ),
                        ));
                    }
                    let (c, _) = chunk_of(i);
                    self.chunks[c].get_or_init(|| {
                        (0..FIRST_CHUNK << c)
                            .map(|_| {
                                RwLock::new(Cell {
                                    generation: 0,
                                    value: None,
                                })
                            })
                            .collect()
                    });
                    a.made += 1;
                    i
                }
            }
        };
        let slot = self.slot(index).expect("the slot was made above");
        let mut cell = slot.write().unwrap_or_else(|e| e.into_inner());
        cell.value = Some(value);
        Ok(self.token(index, cell.generation))
    }

    fn token(&self, index: usize, generation: usize) -> usize {
        (generation << (KIND_BITS + INDEX_BITS)) | ((index + 1) << KIND_BITS) | self.kind as usize
    }

    /// The slot index and generation of `token`, if it is one of this
    /// registry's tokens.
    #[inline]
    fn decode(&self, token: usize) -> Option<(usize, usize)> {
        if token & ((1 << KIND_BITS) - 1) != self.kind as usize {
            return None;
        }
        let index = ((token >> KIND_BITS) & ((1 << INDEX_BITS) - 1)).checked_sub(1)?;
        Some((index, token >> (KIND_BITS + INDEX_BITS)))
    }

    fn unknown(&self, token: usize) -> Failure {
        let what = if token == 0 {
            "is NULL".to_string()
        } else if self.decode(token).is_none() {
            format!("{token:#x} is not a {} handle", self.kind.c_name())
        } else {
            format!("{token:#x} was closed (or never opened)")
        };
        Failure::new(
            Status::PLEIO_ERR_HANDLE,
            format!("{} {what}", self.kind.c_name()),
        )
    }

    /// Runs `f` on the object of `token`, under its slot's read lock; a
    /// closed, foreign or unknown token is a `PLEIO_ERR_HANDLE` failure.
    #[inline]
    pub fn with<R>(
        &self,
        token: usize,
        f: impl FnOnce(&T) -> Result<R, Failure>,
    ) -> Result<R, Failure> {
        let Some((index, generation)) = self.decode(token) else {
            return Err(self.unknown(token));
        };
        let Some(slot) = self.slot(index) else {
            return Err(self.unknown(token));
        };
        let cell = slot.read().unwrap_or_else(|e| e.into_inner());
        match &cell.value {
            Some(value) if cell.generation == generation => f(value),
            _ => Err(self.unknown(token)),
        }
    }

    /// Takes the object of `token` out of the registry (the token is dead
    /// from now on), once the calls in flight on this handle are done.
    pub fn remove(&self, token: usize) -> Result<T, Failure> {
        self.remove_within(token, None)
    }

    /// [`Registry::remove`], waiting at most `timeout` (`None`: as long as
    /// it takes) for the calls in flight on this handle: when they are
    /// still running then, a `PLEIO_ERR_BUSY` failure, and the handle stays
    /// open.
    pub fn remove_within(&self, token: usize, timeout: Option<Duration>) -> Result<T, Failure> {
        let Some((index, generation)) = self.decode(token) else {
            return Err(self.unknown(token));
        };
        let Some(slot) = self.slot(index) else {
            return Err(self.unknown(token));
        };
        let mut cell = match timeout {
            None => slot.write().unwrap_or_else(|e| e.into_inner()),
            Some(limit) => {
                let start = Instant::now();
                loop {
                    match slot.try_write() {
                        Ok(c) => break c,
                        Err(TryLockError::Poisoned(e)) => break e.into_inner(),
                        Err(TryLockError::WouldBlock) => {}
                    }
                    if start.elapsed() >= limit {
                        return Err(Failure::new(
                            Status::PLEIO_ERR_BUSY,
                            format!(
                                "{} {token:#x}: calls on it still running after {limit:?}; \
                                 it stays open",
                                self.kind.c_name()
                            ),
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(1).min(limit));
                }
            }
        };
        if cell.generation != generation || cell.value.is_none() {
            return Err(self.unknown(token));
        }
        let value = cell.value.take();
        cell.generation += 1;
        // A generation that no longer fits a token retires the slot.
        let reuse = cell.generation < (1 << GEN_BITS);
        drop(cell);
        if reuse {
            self.alloc().free.push(index);
        }
        value.ok_or_else(|| self.unknown(token))
    }

    /// Slots ever made: the most handles of this kind that were open at
    /// once (plus any retired slots), not the number ever opened.
    pub fn slots(&self) -> usize {
        self.alloc().made
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked_not_followed() {
        let tables: Registry<u32> = Registry::new(Kind::Table);
        let seqs: Registry<u32> = Registry::new(Kind::Sequence);
        let a = tables.insert(7).unwrap();
        let b = tables.insert(8).unwrap();
        let s = seqs.insert(9).unwrap();
        assert_ne!(a, b);
        let get = |r: &Registry<u32>, t| r.with(t, |v| Ok(*v));
        assert_eq!(get(&tables, a).unwrap(), 7);
        assert_eq!(get(&tables, b).unwrap(), 8);
        // another kind's token, NULL, garbage, a slot never issued
        for bad in [s, 0, 0xdead_beef, b + (1 << KIND_BITS), usize::MAX] {
            let e = get(&tables, bad).unwrap_err();
            assert_eq!(
                e.status,
                Status::PLEIO_ERR_HANDLE,
                "{bad:#x}: {}",
                e.message
            );
        }
        assert_eq!(tables.remove(a).unwrap(), 7);
        // closed: an error, and a second close too
        assert!(get(&tables, a).unwrap_err().message.contains("closed"));
        assert_eq!(
            tables.remove(a).unwrap_err().status,
            Status::PLEIO_ERR_HANDLE
        );
        // a failure inside the call is the call's
        let e = tables
            .with(b, |_| Err::<(), _>(Failure::argument("inner")))
            .unwrap_err();
        assert_eq!(e.message, "inner");
        // the slot is reused under a new token; the old one stays dead
        let c = tables.insert(10).unwrap();
        assert!(c != a && c != b);
        assert_eq!(tables.slots(), 2);
        assert_eq!(get(&tables, c).unwrap(), 10);
        assert!(get(&tables, a).is_err());
        assert_eq!(
            tables.remove(a).unwrap_err().status,
            Status::PLEIO_ERR_HANDLE
        );
        assert_eq!(get(&tables, b).unwrap(), 8);
    }

    #[test]
    fn open_and_close_forever_keeps_the_slots_of_the_most_open_at_once() {
        let r: Registry<Vec<u8>> = Registry::new(Kind::Prefetch);
        let mut stale = Vec::new();
        for round in 0..20_000u32 {
            let a = r.insert(vec![1; 32]).unwrap();
            let b = r.insert(vec![2; 32]).unwrap();
            assert_eq!(r.remove(a).unwrap()[0], 1);
            assert_eq!(r.remove(b).unwrap()[0], 2);
            if round % 1000 == 0 {
                stale.push(a);
            }
        }
        assert_eq!(r.slots(), 2, "slots are reused, not added per handle");
        for t in stale {
            assert_eq!(
                r.with(t, |_| Ok(())).unwrap_err().status,
                Status::PLEIO_ERR_HANDLE
            );
        }
        // many at once grow it through several chunks, every token distinct
        let many: Vec<usize> = (0..1000)
            .map(|i| r.insert(vec![i as u8]).unwrap())
            .collect();
        assert_eq!(r.slots(), 1000);
        for (i, &t) in many.iter().enumerate() {
            assert_eq!(r.with(t, |v| Ok(v[0])).unwrap(), i as u8);
        }
        for t in many {
            r.remove(t).unwrap();
        }
    }

    #[test]
    fn chunks_cover_every_index_once() {
        let mut next = 0;
        for c in 0..4 {
            for i in 0..FIRST_CHUNK << c {
                assert_eq!(chunk_of(next), (c, i));
                next += 1;
            }
        }
        let (c, i) = chunk_of(MAX_SLOTS - 1);
        assert!(c < CHUNKS && i < FIRST_CHUNK << c);
    }

    #[test]
    fn a_retired_generation_is_never_reused() {
        let r: Registry<u8> = Registry::new(Kind::Table);
        let t = r.insert(1).unwrap();
        let (index, _) = r.decode(t).unwrap();
        // jump the slot to its last generation
        r.slot(index).unwrap().write().unwrap().generation = (1 << GEN_BITS) - 1;
        let last = r.token(index, (1 << GEN_BITS) - 1);
        assert_eq!(r.with(last, |v| Ok(*v)).unwrap(), 1);
        r.remove(last).unwrap();
        let next = r.insert(2).unwrap();
        assert_ne!(r.decode(next).unwrap().0, index, "the slot is retired");
        assert_eq!(r.slots(), 2);
    }

    #[test]
    fn a_busy_handle_delays_only_its_own_close() {
        use std::sync::mpsc;
        use std::sync::Arc;
        let r: Arc<Registry<u8>> = Arc::new(Registry::new(Kind::Table));
        let busy = r.insert(1).unwrap();
        let other = r.insert(2).unwrap();
        let (started_tx, started) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let held = {
            let r = r.clone();
            std::thread::spawn(move || {
                r.with(busy, |_| {
                    started_tx.send(()).unwrap();
                    // "stuck in the kernel" until the test lets go
                    release_rx.recv().unwrap();
                    Ok(())
                })
            })
        };
        started.recv().unwrap();
        // Everything on other handles goes on, in another thread so a
        // regression fails (the timeout) instead of hanging the test.
        let (done_tx, done) = mpsc::channel();
        {
            let r = r.clone();
            std::thread::spawn(move || {
                let third = r.insert(3).unwrap();
                let ok = r.with(other, |v| Ok(*v)) == Ok(2)
                    && r.remove(other) == Ok(2)
                    && r.remove(third) == Ok(3);
                done_tx.send(ok).unwrap();
            });
        }
        assert_eq!(done.recv_timeout(Duration::from_secs(60)), Ok(true));
        // Its own close gives up after the timeout, and the handle stays.
        let e = r
            .remove_within(busy, Some(Duration::from_millis(20)))
            .unwrap_err();
        assert_eq!(e.status, Status::PLEIO_ERR_BUSY, "{}", e.message);
        release.send(()).unwrap();
        held.join().unwrap().unwrap();
        assert_eq!(r.remove_within(busy, Some(Duration::from_secs(60))), Ok(1));
        assert_eq!(
            r.with(busy, |v| Ok(*v)).unwrap_err().status,
            Status::PLEIO_ERR_HANDLE
        );
    }
}
