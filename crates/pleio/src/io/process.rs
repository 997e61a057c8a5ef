//! State that belongs to one process and must be made again after
//! `fork()`: an io_uring (its submission and completion rings are memory
//! shared with the parent, so a child using the parent's ring corrupts it
//! for both), a pool of reader threads or a worker thread (only the forking
//! thread exists in the child, so work sent to the parent's threads is
//! never done).
//!
//! [`PerProcess`] holds the value of the process that made it and, after a
//! fork, makes the child its own value on first use (a process is told by
//! its pid). The child never touches the parent's value: not its lock,
//! which another thread of the parent may have held at the fork, not its
//! threads, not its ring. Values of other processes are never dropped
//! either (only forgotten when the holder is dropped): a ring's memory, a
//! pool's queues and a channel's locks may be in any state in the copy the
//! child inherited.
//!
//! Costs one `getpid` per use; the backends that use it do I/O on every
//! use anyway.

use std::sync::OnceLock;

/// A value per process: the maker's, and one made lazily in each forked
/// child that uses it (see the module documentation).
#[derive(Debug)]
pub struct PerProcess<T> {
    head: Entry<T>,
}

#[derive(Debug)]
struct Entry<T> {
    pid: u32,
    /// `Some` until the holder is dropped.
    value: Option<T>,
    /// The value of a process forked (directly or not) from `pid`.
    next: OnceLock<Box<Entry<T>>>,
}

impl<T> Entry<T> {
    fn new(value: T) -> Entry<T> {
        Entry {
            pid: crate::sys::pid(),
            value: Some(value),
            next: OnceLock::new(),
        }
    }
}

impl<T> PerProcess<T> {
    /// Holds `value` for the calling process.
    pub fn new(value: T) -> PerProcess<T> {
        PerProcess {
            head: Entry::new(value),
        }
    }

    /// Holds no value yet: every process using it, this one included,
    /// makes its own on first use.
    pub fn lazy() -> PerProcess<T> {
        PerProcess {
            head: Entry {
                // No process has id 0 here (it is the kernel's), so every
                // process goes on to an entry of its own.
                pid: 0,
                value: None,
                next: OnceLock::new(),
            },
        }
    }

    /// The calling process's value if it has made one.
    pub fn get(&self) -> Option<&T> {
        Self::find(&self.head, crate::sys::pid()).ok()
    }

    /// From `entry` on: the value of process `me`, or the last entry.
    fn find(mut entry: &Entry<T>, me: u32) -> Result<&T, &Entry<T>> {
        loop {
            if entry.pid == me {
                if let Some(v) = &entry.value {
                    return Ok(v);
                }
            }
            match entry.next.get() {
                Some(next) => entry = next,
                None => return Err(entry),
            }
        }
    }

    /// [`PerProcess::get_or_try_init`] for a `make` that cannot fail.
    pub fn get_or_init(&self, make: impl FnOnce() -> T) -> &T {
        match self.get_or_try_init(|| Ok::<T, std::convert::Infallible>(make())) {
            Ok(v) => v,
            Err(never) => match never {},
        }
    }

    /// The calling process's value; in a process forked since the first
    /// value was made, `make`'s on first use (another thread of the same
    /// process racing it keeps the first one made). An error from `make`
    /// is returned and nothing is kept: the next call tries again.
    pub fn get_or_try_init<E>(&self, make: impl FnOnce() -> Result<T, E>) -> Result<&T, E> {
        let me = crate::sys::pid();
        let mut make = Some(make);
        let mut from = &self.head;
        loop {
            let last = match Self::find(from, me) {
                Ok(v) => return Ok(v),
                Err(last) => last,
            };
            let Some(make) = make.take() else {
                // `make` ran and its entry (or a racing thread's of this
                // process) follows `last`: the walk above found it.
                unreachable!("a set OnceLock is never empty again")
            };
            // Err: another thread of this process set it first; ours is
            // dropped (it was never used).
            let _ = last.next.set(Box::new(Entry::new(make()?)));
            from = last;
        }
    }
}

impl<T> Default for PerProcess<T> {
    /// [`PerProcess::lazy`].
    fn default() -> PerProcess<T> {
        PerProcess::lazy()
    }
}

impl<T> Drop for PerProcess<T> {
    fn drop(&mut self) {
        let me = crate::sys::pid();
        let mut entry = Some(&mut self.head);
        while let Some(e) = entry {
            if let Some(v) = e.value.take() {
                if e.pid == me {
                    drop(v);
                } else {
                    // Another process's: its locks, threads or ring are not
                    // ours to release (see the module documentation).
                    std::mem::forget(v);
                }
            }
            entry = e.next.get_mut().map(|b| &mut **b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_maker_keeps_its_value_and_is_never_asked_to_make_another() {
        let p = PerProcess::new(7u32);
        let got = p
            .get_or_try_init(|| -> Result<u32, ()> { panic!("made again") })
            .unwrap();
        assert_eq!(*got, 7);
    }

    #[test]
    fn a_lazy_value_is_made_once_on_first_use() {
        let p = PerProcess::<u32>::lazy();
        assert_eq!(
            p.get_or_try_init(|| Err::<u32, &str>("no")).unwrap_err(),
            "no"
        );
        assert_eq!(p.get(), None);
        assert_eq!(*p.get_or_try_init(|| Ok::<_, ()>(3)).unwrap(), 3);
        assert_eq!(p.get(), Some(&3));
        assert_eq!(
            *p.get_or_try_init(|| -> Result<u32, ()> { panic!("made again") })
                .unwrap(),
            3
        );
    }

    #[test]
    fn another_process_gets_its_own_value() {
        // What a forked child sees: the first entry belongs to another pid.
        let mut p = PerProcess::new(1u32);
        p.head.pid = p.head.pid.wrapping_add(1);
        assert_eq!(p.get(), None);
        assert_eq!(
            p.get_or_try_init(|| Err::<u32, &str>("no")).unwrap_err(),
            "no"
        );
        assert_eq!(*p.get_or_try_init(|| Ok::<_, ()>(2)).unwrap(), 2);
        // made once, then kept
        assert_eq!(
            *p.get_or_try_init(|| -> Result<u32, ()> { panic!("made again") })
                .unwrap(),
            2
        );
    }
}
