//! The [`Engine::Uring`](super::Engine::Uring) engine: io_uring reads at
//! a configurable queue depth, over any number of files.
//!
//! One ring per reader, created once and kept behind a `Mutex`: a batch
//! holds the ring from first submission to last completion, so concurrent
//! callers take turns. A per-thread ring would let them overlap, but one ring
//! at queue depth 64 already keeps the device saturated (more parallel rings
//! only split the same device queue), and a mutex keeps kernel resources
//! bounded (one ring) however many threads gather.
//!
//! The ring belongs to the process that set it up: its queues are memory
//! the kernel shares with every process forked from it, so a child that
//! submitted to it would corrupt the parent's queues and its own (both
//! hang). A forked child sets up its own ring on first use
//! ([`PerProcess`]) and never touches the parent's, nor the lock a parent
//! thread may have held at the fork.
//!
//! All `unsafe` obligations of io_uring (the buffer of every submitted read
//! stays valid and untouched until its completion) are discharged in one
//! function, [`run_ops`]: it takes the destination buffers as exclusive
//! borrows for its whole duration and never returns, or unwinds, while a
//! read is in flight (a drain guard reaps every outstanding completion).

use std::io;
use std::os::fd::AsRawFd;
use std::sync::{Mutex, MutexGuard};

use io_uring::{opcode, types, IoUring};

use super::process::PerProcess;
use super::{IoError, Op, ReadStats, Ready};

/// A ring locked for one batch ([`Ring::lock`]).
pub(super) type Guard<'a> = MutexGuard<'a, IoUring>;

/// One io_uring per process using it (see the module documentation).
pub(super) struct Ring {
    queue_depth: u32,
    ring: PerProcess<Mutex<IoUring>>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("queue_depth", &self.queue_depth)
            .finish()
    }
}

impl Ring {
    /// Sets up a ring of `queue_depth` entries and proves it works;
    /// [`IoError::UringUnavailable`] where io_uring cannot be used.
    pub(super) fn new(queue_depth: u32) -> Result<Ring, IoError> {
        Ok(Ring {
            queue_depth,
            ring: PerProcess::new(Mutex::new(probe_ring(queue_depth)?)),
        })
    }

    /// Checks io_uring works here (ring setup, `IORING_OP_READ`, one no-op
    /// round trip).
    pub(super) fn probe() -> Result<(), IoError> {
        probe_ring(1).map(drop)
    }

    /// This process's ring, locked for a batch; a process forked since the
    /// ring was set up sets up its own first.
    pub(super) fn lock(&self) -> Result<Guard<'_>, IoError> {
        let ring = self
            .ring
            .get_or_try_init(|| probe_ring(self.queue_depth).map(Mutex::new))?;
        // A panic cannot leave reads in flight (run_ops drains on unwind),
        // so a poisoned ring is still consistent.
        Ok(ring.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Runs `ops` on `ring` (this ring, locked) at its queue depth, handing
    /// each op to `ready` (with its index) in order, as soon as it and every
    /// op before it are complete, while later ops are still in flight.
    pub(super) fn run(
        &self,
        ring: &mut Guard<'_>,
        ops: &mut [Op<'_>],
        ready: Ready<'_>,
    ) -> Result<ReadStats, IoError> {
        run_ops(ring, ops, self.queue_depth.clamp(1, MAX_QD) as usize, ready)
    }
}

/// Largest queue depth accepted (the ring is sized to it).
const MAX_QD: u32 = 4096;

/// Set up a ring of `queue_depth` entries and prove it works: the kernel
/// supports `IORING_OP_READ` and a no-op completes. Any failure means
/// io_uring is unusable here.
fn probe_ring(queue_depth: u32) -> Result<IoUring, IoError> {
    let entries = queue_depth.clamp(1, MAX_QD).next_power_of_two();
    let mut ring = IoUring::new(entries).map_err(IoError::UringUnavailable)?;
    let mut probe = io_uring::Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(IoError::UringUnavailable)?;
    if !probe.is_supported(opcode::Read::CODE) {
        return Err(IoError::UringUnavailable(io::Error::new(
            io::ErrorKind::Unsupported,
            "kernel lacks IORING_OP_READ",
        )));
    }
    let nop = opcode::Nop::new().build().user_data(u64::MAX);
    // SAFETY: a no-op references no memory.
    unsafe { ring.submission().push(&nop) }
        .map_err(|_| IoError::UringUnavailable(io::Error::other("fresh ring has no free entry")))?;
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(IoError::UringUnavailable(e)),
        }
    }
    let result = ring.completion().next().map(|c| c.result());
    match result {
        Some(r) if r >= 0 => Ok(ring),
        Some(r) => Err(IoError::UringUnavailable(io::Error::from_raw_os_error(-r))),
        None => Err(IoError::UringUnavailable(io::Error::other(
            "no-op did not complete",
        ))),
    }
}

/// Run `ops` on `ring` with up to `queue_depth` in flight, refilling as
/// completions arrive and resubmitting short reads for the remainder. A
/// short read that stops off its file's `O_DIRECT` alignment has hit the
/// end of the file. Once op `i` and every op before it are complete, and
/// nothing has failed, op `i` is handed to `ready`, while later ops are
/// still in flight (a complete op is never submitted again, and the shared
/// borrow `ready` gets touches only its buffer, which no read in flight
/// overlaps).
///
/// This is the only place buffer addresses are handed to the kernel. Its
/// safety rests on two facts: every `buf` is exclusively borrowed for the
/// whole call, and the call does not return or unwind while any read is in
/// flight (see [`Drain`]).
fn run_ops(
    ring: &mut IoUring,
    ops: &mut [Op<'_>],
    queue_depth: usize,
    mut ready: Ready<'_>,
) -> Result<ReadStats, IoError> {
    // Raw destinations taken once up front; the `&mut` borrows in `ops` stay
    // alive (unused) until we return, so nothing else can touch the bytes.
    let dst: Vec<(*mut u8, usize)> = ops
        .iter_mut()
        .map(|o| (o.buf.as_mut_ptr(), o.buf.len()))
        .collect();
    let mut done = vec![0usize; ops.len()];
    let mut stats = ReadStats::default();
    let mut retry: Vec<usize> = Vec::new();
    let mut next = 0usize;
    // Ops handed to `ready` so far (a prefix).
    let mut delivered = 0usize;
    let mut failed: Option<IoError> = None;
    let mut ring = Drain { ring, in_flight: 0 };
    let capacity = queue_depth.min(ring.ring.params().sq_entries() as usize);

    // Hands the complete prefix of `ops` past `delivered` to `ready`.
    let deliver = |ready: &mut Ready<'_>, delivered: &mut usize, upto: usize, ops: &[Op<'_>], done: &[usize]| {
        if let Some(ready) = ready.as_deref_mut() {
            while *delivered < upto && done[*delivered] >= ops[*delivered].want {
                ready(*delivered, &ops[*delivered]);
                *delivered += 1;
            }
        }
    };
    loop {
        {
            let mut sq = ring.ring.submission();
            while failed.is_none() && ring.in_flight < capacity {
                let i = match retry.pop() {
                    Some(i) => i,
                    None if next < ops.len() => {
                        next += 1;
                        next - 1
                    }
                    None => break,
                };
                if done[i] >= ops[i].want {
                    continue;
                }
                let (ptr, len) = dst[i];
                let remaining = len - done[i];
                // `remaining <= MAX_READ` (ops are cut to it), so it fits u32.
                let entry = opcode::Read::new(
                    types::Fd(ops[i].file.file.as_raw_fd()),
                    ptr.wrapping_add(done[i]),
                    remaining as u32,
                )
                .offset(ops[i].offset + done[i] as u64)
                .build()
                .user_data(i as u64);
                // SAFETY: the entry points at `remaining` bytes inside
                // `ops[i].buf`, exclusively borrowed for this whole call and
                // not accessed until its completion; `Drain` guarantees we do
                // not return or unwind before that completion is reaped.
                if unsafe { sq.push(&entry) }.is_err() {
                    retry.push(i);
                    break;
                }
                ring.in_flight += 1;
                stats.peak_in_flight = stats.peak_in_flight.max(ring.in_flight as u64);
                stats.requests += 1;
                stats.bytes += remaining as u64;
            }
        }
        if ring.in_flight == 0 {
            break;
        }
        if failed.is_none()
            && ready.is_some()
            && delivered < next
            && done[delivered] >= ops[delivered].want
        {
            // Start the reads just queued before handing out the complete
            // ones; a failed submit is retried and reported just below.
            let _ = ring.ring.submit();
            deliver(&mut ready, &mut delivered, next, ops, &done);
        }
        if let Err(e) = ring.submit_and_wait_one() {
            failed.get_or_insert(IoError::Os {
                what: "io_uring submit",
                error: e,
            });
            // Drain (below, or in Drop) reaps what the kernel accepted.
            ring.drain();
            break;
        }
        for cqe in ring.ring.completion() {
            ring.in_flight -= 1;
            let i = cqe.user_data() as usize;
            let Some(op) = ops.get(i) else { continue };
            let at = op.offset + done[i] as u64;
            let res = cqe.result();
            if res == -libc::EINTR || res == -libc::EAGAIN {
                retry.push(i);
            } else if res < 0 {
                failed.get_or_insert_with(|| {
                    op.file
                        .failed(at, dst[i].1 - done[i], io::Error::from_raw_os_error(-res))
                });
            } else if res == 0 {
                failed.get_or_insert_with(|| op.file.eof(at, op.offset + op.want as u64));
            } else {
                done[i] += res as usize;
                if done[i] < op.want {
                    stats.short_reads += 1;
                    if done[i].is_multiple_of(op.file.align) {
                        retry.push(i);
                    } else {
                        // O_DIRECT stopped off alignment: end of file.
                        let (at, end) = (op.offset + done[i] as u64, op.offset + op.want as u64);
                        failed.get_or_insert_with(|| op.file.eof(at, end));
                    }
                }
            }
        }
    }
    match failed {
        Some(e) => Err(e),
        None => {
            deliver(&mut ready, &mut delivered, ops.len(), ops, &done);
            Ok(stats)
        }
    }
}

/// Counts reads in flight on a ring and, if dropped with any outstanding
/// (early return or unwind), waits for all of them, so no buffer is freed
/// or reused while the kernel may still write to it.
struct Drain<'r> {
    ring: &'r mut IoUring,
    in_flight: usize,
}

impl Drain<'_> {
    /// Submit queued entries and wait for at least one completion, retrying
    /// on `EINTR`/`EAGAIN`/`EBUSY` (completions are reaped by the caller).
    fn submit_and_wait_one(&mut self) -> io::Result<()> {
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => return Ok(()),
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                    ) =>
                {
                    if !self.ring.completion().is_empty() {
                        return Ok(());
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Reap every outstanding completion. If the kernel will not let us wait
    /// (a broken ring), the only sound move is to abort: returning would
    /// free buffers the kernel may still write.
    fn drain(&mut self) {
        while self.in_flight > 0 {
            if let Err(e) = self.submit_and_wait_one() {
                eprintln!("pleio: io_uring wait failed with reads in flight: {e}; aborting");
                std::process::abort();
            }
            let n = self.ring.completion().count();
            self.in_flight -= n.min(self.in_flight);
        }
    }
}

impl Drop for Drain<'_> {
    fn drop(&mut self) {
        self.drain();
    }
}
