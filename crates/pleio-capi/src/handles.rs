//! Opaque handles: what a C caller holds instead of a pointer.
//!
//! A handle is a token, an integer in pointer clothing that encodes a slot
//! index and the kind of object (table, prefetch, sequence). The token is
//! looked up in that kind's [`Registry`] and never dereferenced, so a handle
//! that was closed, belongs to another kind, or was never issued is reported
//! as `PLEIO_ERR_HANDLE` instead of being followed
//! into freed memory. Slots are never reused: a stale handle cannot alias a
//! newer object.
//!
//! A call works on the object under the registry's read lock
//! ([`Registry::with`]: two atomic operations, no reference count to bump),
//! so any number of threads use objects at once, and ending a handle (a
//! write) waits for the calls in flight on that kind of object to finish
//! before it takes the object out; the object is dropped after the lock is
//! released.

use std::sync::RwLock;

use crate::status::{Failure, Status};

/// Low bits of a token that hold its kind.
const KIND_BITS: u32 = 4;

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

/// The live objects of one kind, by slot.
#[derive(Debug)]
pub struct Registry<T> {
    kind: Kind,
    slots: RwLock<Vec<Option<T>>>,
}

impl<T> Registry<T> {
    /// An empty registry of `kind` (usable in a `static`).
    pub const fn new(kind: Kind) -> Registry<T> {
        Registry {
            kind,
            slots: RwLock::new(Vec::new()),
        }
    }

    /// Stores `value` and returns its token (never 0).
    pub fn insert(&self, value: T) -> Result<usize, Failure> {
        let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
        let index = slots.len();
        let token = index
            .checked_add(1)
            .and_then(|n| n.checked_mul(1 << KIND_BITS))
            .map(|n| n | self.kind as usize)
            .ok_or_else(|| {
                Failure::new(
                    Status::PLEIO_ERR_SETUP,
                    format!("too many {} handles opened", self.kind.c_name()),
                )
            })?;
        slots.push(Some(value));
        Ok(token)
    }

    /// The slot of `token`, if it is one of this registry's tokens.
    #[inline]
    fn slot(&self, token: usize) -> Option<usize> {
        if token & ((1 << KIND_BITS) - 1) != self.kind as usize {
            return None;
        }
        (token >> KIND_BITS).checked_sub(1)
    }

    fn unknown(&self, token: usize) -> Failure {
        let what = if token == 0 {
            "is NULL".to_string()
        } else if self.slot(token).is_none() {
            format!("{token:#x} is not a {} handle", self.kind.c_name())
        } else {
            format!("{token:#x} was closed (or never opened)")
        };
        Failure::new(
            Status::PLEIO_ERR_HANDLE,
            format!("{} {what}", self.kind.c_name()),
        )
    }

    /// Runs `f` on the object of `token`, under the read lock; a closed,
    /// foreign or unknown token is a `PLEIO_ERR_HANDLE` failure.
    #[inline]
    pub fn with<R>(
        &self,
        token: usize,
        f: impl FnOnce(&T) -> Result<R, Failure>,
    ) -> Result<R, Failure> {
        let Some(i) = self.slot(token) else {
            return Err(self.unknown(token));
        };
        let slots = self.slots.read().unwrap_or_else(|e| e.into_inner());
        match slots.get(i) {
            Some(Some(value)) => f(value),
            _ => Err(self.unknown(token)),
        }
    }

    /// Takes the object of `token` out of the registry (the token is dead
    /// from now on), once the calls using objects of this kind are done.
    pub fn remove(&self, token: usize) -> Result<T, Failure> {
        let taken = self.slot(token).and_then(|i| {
            let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
            slots.get_mut(i).and_then(Option::take)
        });
        taken.ok_or_else(|| self.unknown(token))
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
        for bad in [s, 0, 0xdead_beef, b + (1 << KIND_BITS)] {
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
        // slots are not reused
        let c = tables.insert(10).unwrap();
        assert!(c != a && c != b);
        assert_eq!(get(&tables, b).unwrap(), 8);
    }
}
