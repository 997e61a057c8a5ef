//! io_uring reads at a configurable queue depth, buffered or `O_DIRECT`.
//!
//! One ring per backend, created once and kept behind a `Mutex`: a batch
//! holds the ring from first submission to last completion, so concurrent
//! callers take turns. A per-thread ring would let them overlap, but one ring
//! at queue depth 64 already keeps the device saturated (more parallel rings
//! only split the same device queue), and a mutex keeps kernel resources
//! bounded (one ring, one scratch buffer) however many threads gather.
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

use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use io_uring::{opcode, types, IoUring};

use super::process::PerProcess;
use super::{check_staging, pieces, IoError, ReadBackend, ReadPlan, ReadStats};

/// Settings of a [`UringBackend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UringConfig {
    /// Reads in flight at once (ring size; 1..=4096).
    pub queue_depth: u32,
    /// Read with `O_DIRECT` (bypassing the page cache) instead of buffered.
    pub direct: bool,
    /// Spans longer than this are split into several reads in flight together.
    pub max_read_bytes: usize,
}

impl Default for UringConfig {
    fn default() -> Self {
        UringConfig {
            queue_depth: 64,
            direct: false,
            max_read_bytes: 1 << 20,
        }
    }
}

/// Reads through one persistent io_uring, every span of a batch in flight
/// at up to [`UringConfig::queue_depth`], short reads resubmitted for the
/// remainder, completion errors returned naming the file offset.
///
/// Buffered by default (the page cache still serves warm bytes). With
/// [`UringConfig::direct`], the file is opened with `O_DIRECT` and each span
/// is read as the aligned blocks covering it into an aligned scratch buffer
/// (head and tail slack included), then copied to its staging place: a
/// 90-byte span never makes the kernel write past anything.
#[derive(Debug)]
pub struct UringBackend {
    file: File,
    path: PathBuf,
    cfg: UringConfig,
    /// `O_DIRECT` alignment (offset, length and memory), 1 when buffered.
    align: usize,
    /// The ring and scratch of each process using the backend.
    state: PerProcess<Mutex<State>>,
}

struct State {
    ring: IoUring,
    /// Aligned scratch for `O_DIRECT` blocks (unused when buffered).
    scratch: AlignedBuf,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("ring_entries", &self.ring.params().sq_entries())
            .field("scratch", &self.scratch.len())
            .finish()
    }
}

/// Scratch kept between calls up to this size; larger is freed after use.
const SCRATCH_KEEP: usize = 16 << 20;

/// Bytes [`UringBackend::read_extents`] reads in one go (its scratch): a
/// 8192-row batch of 4 KiB pages fits.
const EXTENT_CHUNK: usize = 32 << 20;

impl UringBackend {
    /// Open `path` read-only (with `O_DIRECT` if `cfg.direct`) and set up
    /// the ring. Fails with [`IoError::UringUnavailable`] where io_uring cannot
    /// be used (the caller falls back to another backend) and with
    /// [`IoError::DirectUnsupported`] where the file system refuses
    /// `O_DIRECT`.
    pub fn open(path: &Path, cfg: UringConfig) -> Result<UringBackend, IoError> {
        let ring = probe_ring(cfg.queue_depth)?;
        let mut opts = OpenOptions::new();
        opts.read(true);
        if cfg.direct {
            opts.custom_flags(libc::O_DIRECT);
        }
        let file = opts.open(path).map_err(|source| {
            if cfg.direct && source.raw_os_error() == Some(libc::EINVAL) {
                IoError::DirectUnsupported {
                    path: path.to_path_buf(),
                    reason: source.to_string(),
                }
            } else {
                IoError::Open {
                    path: path.to_path_buf(),
                    error: source,
                }
            }
        })?;
        let align = if cfg.direct {
            direct_alignment(&file, path)?
        } else {
            crate::sys::random_reads(&file);
            1
        };
        Ok(UringBackend {
            file,
            path: path.to_path_buf(),
            cfg,
            align,
            state: PerProcess::new(Mutex::new(State {
                ring,
                scratch: AlignedBuf::default(),
            })),
        })
    }

    /// Check io_uring works here (ring setup, `IORING_OP_READ`, one no-op
    /// round trip), without opening any file.
    pub fn probe() -> Result<(), IoError> {
        probe_ring(1).map(drop)
    }

    /// The settings in force.
    pub fn config(&self) -> UringConfig {
        self.cfg
    }

    /// The `O_DIRECT` alignment in bytes (1 when buffered): from `statx`'s
    /// `dio_offset_align`/`dio_mem_align` where the kernel reports them,
    /// else 4096 (a multiple of every common logical block size).
    pub fn alignment(&self) -> usize {
        self.align
    }

    /// The open file the reads go to.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The device-floor measurement: read each byte extent of `extents` as
    /// one request (an extent longer than [`UringConfig::max_read_bytes`]
    /// as several), all in flight at up to the configured queue depth, into
    /// scratch that is then discarded. With `O_DIRECT` every extent's start
    /// and length must be multiples of [`alignment`]. An extent starting at
    /// or past the end of the file is [`IoError::UnexpectedEof`]; one
    /// reaching past it reads what the file has. Empty extents read nothing.
    /// Scratch stays bounded: a batch of more than 32 MiB is read in chunks
    /// of at most that size (or one request), one after the other.
    ///
    /// [`alignment`]: UringBackend::alignment
    pub fn read_extents(&self, extents: &[Range<u64>]) -> Result<ReadStats, IoError> {
        let of_self: Vec<(usize, Range<u64>)> = extents.iter().map(|e| (0, e.clone())).collect();
        self.read_extents_of(std::slice::from_ref(self), &of_self)
    }

    /// [`read_extents`](UringBackend::read_extents) over several files at
    /// once: each `(k, extent)` names bytes of `files[k]`, and every request
    /// goes through this backend's ring, up to its queue depth in flight
    /// whatever file it reads (a table split over many files is read as
    /// one batch, not file after file). Each extent must be aligned to its
    /// own file's [`alignment`](UringBackend::alignment); a `k` past
    /// `files` is an error.
    pub fn read_extents_of(
        &self,
        files: &[UringBackend],
        extents: &[(usize, Range<u64>)],
    ) -> Result<ReadStats, IoError> {
        let mut lens = vec![None; files.len()];
        // (file, file offset, bytes, bytes that must arrive) of every request.
        let mut pieces: Vec<(usize, u64, usize, usize)> = Vec::with_capacity(extents.len());
        for (k, e) in extents.iter().filter(|(_, e)| e.end > e.start) {
            let f = files.get(*k).ok_or_else(|| IoError::DirectUnsupported {
                path: self.path.clone(),
                reason: format!(
                    "extent {}..{} names file {k} of {}",
                    e.start,
                    e.end,
                    files.len()
                ),
            })?;
            let a = f.align as u64;
            if !e.start.is_multiple_of(a) || !(e.end - e.start).is_multiple_of(a) {
                return Err(IoError::DirectUnsupported {
                    path: f.path.clone(),
                    reason: format!(
                        "extent {}..{} is not aligned to the O_DIRECT alignment {a}",
                        e.start, e.end
                    ),
                });
            }
            let file_len = match lens[*k] {
                Some(n) => n,
                None => *lens[*k].insert(f.file_len()?),
            };
            if e.start >= file_len {
                return Err(IoError::UnexpectedEof {
                    offset: file_len,
                    end: e.end,
                });
            }
            let max = (f.cfg.max_read_bytes.clamp(1, MAX_READ) / f.align).max(1) * f.align;
            let mut offset = e.start;
            while offset < e.end.min(file_len) {
                let n = (e.end - offset).min(max as u64) as usize;
                let want = (file_len - offset).min(n as u64) as usize;
                pieces.push((*k, offset, n, want));
                offset += n as u64;
            }
        }
        let align = files
            .iter()
            .map(|f| f.align)
            .max()
            .unwrap_or(1)
            .max(self.align);
        let mut state = self.lock()?;
        let State { ring, scratch } = &mut *state;
        let mut stats = ReadStats::default();
        let mut rest = &pieces[..];
        while !rest.is_empty() {
            // At least one piece, then as many as fit in EXTENT_CHUNK.
            let mut bytes = rest[0].2;
            let mut take = 1;
            while take < rest.len() && bytes + rest[take].2 <= EXTENT_CHUNK {
                bytes += rest[take].2;
                take += 1;
            }
            let (chunk, tail) = rest.split_at(take);
            rest = tail;
            let mut buf = scratch.get(bytes, align.max(4096));
            let mut ops = Vec::with_capacity(chunk.len());
            for &(k, offset, n, want) in chunk {
                let (head, tail) = std::mem::take(&mut buf).split_at_mut(n);
                buf = tail;
                ops.push(Op {
                    fd: files[k].file.as_raw_fd(),
                    offset,
                    buf: head,
                    want,
                });
            }
            let r = run_ops(ring, &mut ops, self.queue_depth(), align).map_err(|e| match files {
                [f] => super::with_file_end(&f.file, e),
                _ => e,
            });
            drop(ops);
            match r {
                Ok(s) => stats.add(s),
                Err(e) => {
                    scratch.trim();
                    return Err(e);
                }
            }
        }
        scratch.trim();
        Ok(stats)
    }

    /// Reads `extents` straight into `dst`, back to back (extent k lands
    /// right after extent k-1), with no intermediate buffer: the way to fill
    /// caller-owned, budgeted staging with `O_DIRECT`. Each extent's offset
    /// and length, and `dst`'s address, must be multiples of
    /// [`alignment`](UringBackend::alignment) (any values when buffered);
    /// at least `want` bytes of each must arrive (fewer than `len` only at
    /// the end of the file). Misaligned input is [`IoError::Misaligned`].
    pub fn read_into(&self, extents: &[Extent], dst: &mut [u8]) -> Result<ReadStats, IoError> {
        let a = self.align;
        let need = extents
            .iter()
            .try_fold(0usize, |n, e| n.checked_add(e.len))
            .ok_or(IoError::Staging {
                need: usize::MAX,
                got: dst.len(),
            })?;
        if dst.len() < need {
            return Err(IoError::Staging {
                need,
                got: dst.len(),
            });
        }
        if !(dst.as_ptr() as usize).is_multiple_of(a) {
            return Err(IoError::Misaligned {
                offset: 0,
                len: need,
                align: a,
            });
        }
        if let Some(e) = extents.iter().find(|e| {
            !e.offset.is_multiple_of(a as u64) || !e.len.is_multiple_of(a) || e.want > e.len
        }) {
            return Err(IoError::Misaligned {
                offset: e.offset,
                len: e.len,
                align: a,
            });
        }
        let max = (self.cfg.max_read_bytes.clamp(1, MAX_READ) / a).max(1) * a;
        let mut ops = Vec::with_capacity(extents.len());
        let mut rest = &mut dst[..need];
        for e in extents {
            let (buf, tail) = std::mem::take(&mut rest).split_at_mut(e.len);
            rest = tail;
            push_reads(
                &mut ops,
                self.file.as_raw_fd(),
                buf,
                e.offset,
                e.offset + e.want as u64,
                max,
            );
        }
        let mut state = self.lock()?;
        self.run(&mut state.ring, &mut ops, a)
    }

    /// The file's length now.
    pub fn file_len(&self) -> Result<u64, IoError> {
        self.file
            .metadata()
            .map(|m| m.len())
            .map_err(|source| IoError::Os {
                what: "fstat",
                error: source,
            })
    }

    /// [`run_ops`] on this backend's file at its queue depth and alignment
    /// (1 when buffered).
    fn run(
        &self,
        ring: &mut IoUring,
        ops: &mut [Op<'_>],
        align: usize,
    ) -> Result<ReadStats, IoError> {
        run_ops(ring, ops, self.queue_depth(), align)
            .map_err(|e| super::with_file_end(&self.file, e))
    }

    fn queue_depth(&self) -> usize {
        self.cfg.queue_depth.clamp(1, MAX_QD) as usize
    }

    /// This process's ring and scratch, locked; a process forked since
    /// the backend was opened sets up its own ring first.
    fn lock(&self) -> Result<MutexGuard<'_, State>, IoError> {
        let state = self.state.get_or_try_init(|| {
            probe_ring(self.cfg.queue_depth).map(|ring| {
                Mutex::new(State {
                    ring,
                    scratch: AlignedBuf::default(),
                })
            })
        })?;
        // A panic cannot leave reads in flight (run_ops drains on unwind),
        // so a poisoned state is still consistent.
        Ok(state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn read_buffered(&self, plan: &ReadPlan, staging: &mut [u8]) -> Result<ReadStats, IoError> {
        let max = self.cfg.max_read_bytes.clamp(1, MAX_READ);
        let mut ops: Vec<Op<'_>> = pieces(plan, staging, max)
            .into_iter()
            .map(|(offset, buf)| Op {
                fd: self.file.as_raw_fd(),
                offset,
                want: buf.len(),
                buf,
            })
            .collect();
        let mut state = self.lock()?;
        self.run(&mut state.ring, &mut ops, 1)
    }

    fn read_direct(&self, plan: &ReadPlan, staging: &mut [u8]) -> Result<ReadStats, IoError> {
        let a = self.align as u64;
        let max = (self.cfg.max_read_bytes.clamp(1, MAX_READ) / self.align).max(1) * self.align;
        // Aligned block ranges covering the spans, merged when they touch:
        // (file start, file end, end of the bytes actually needed).
        let mut ranges: Vec<(u64, u64, u64)> = Vec::new();
        // Where each span's first byte lands in scratch.
        let mut at = Vec::with_capacity(plan.spans().len());
        let mut scratch_len = 0usize;
        for s in plan.spans().iter().filter(|s| s.len > 0) {
            let start = s.file_offset / a * a;
            let end = s.file_end().div_ceil(a).saturating_mul(a);
            match ranges.last_mut() {
                Some(r) if start <= r.1 => {
                    let grow = end.saturating_sub(r.1);
                    r.1 += grow;
                    r.2 = r.2.max(s.file_end());
                    scratch_len += grow as usize;
                    at.push(scratch_len - (r.1 - s.file_offset) as usize);
                }
                _ => {
                    at.push(scratch_len + (s.file_offset - start) as usize);
                    scratch_len += (end - start) as usize;
                    ranges.push((start, end, s.file_end()));
                }
            }
        }
        let mut state = self.lock()?;
        let State { ring, scratch } = &mut *state;
        let buf = scratch.get(scratch_len, self.align.max(4096));
        let mut ops = Vec::with_capacity(ranges.len());
        let mut rest = &mut buf[..];
        for &(start, end, need_end) in &ranges {
            let (range_buf, tail) = std::mem::take(&mut rest).split_at_mut((end - start) as usize);
            rest = tail;
            push_reads(
                &mut ops,
                self.file.as_raw_fd(),
                range_buf,
                start,
                need_end,
                max,
            );
        }
        let result = self.run(ring, &mut ops, self.align);
        drop(ops);
        if result.is_ok() {
            let src = scratch.get(scratch_len, self.align.max(4096));
            for (s, &pos) in plan.spans().iter().filter(|s| s.len > 0).zip(&at) {
                staging[s.dst_offset..s.dst_offset + s.len].copy_from_slice(&src[pos..pos + s.len]);
            }
        }
        scratch.trim();
        result
    }
}

impl ReadBackend for UringBackend {
    fn name(&self) -> &'static str {
        if self.cfg.direct {
            "uring-direct"
        } else {
            "uring"
        }
    }

    fn read(&self, plan: &ReadPlan, staging: &mut [u8]) -> Result<ReadStats, IoError> {
        check_staging(plan, staging)?;
        if plan.is_empty() {
            return Ok(ReadStats::default());
        }
        if self.cfg.direct {
            self.read_direct(plan, staging)
        } else {
            self.read_buffered(plan, staging)
        }
    }
}

/// One read of [`UringBackend::read_into`]: `len` bytes of the file at
/// `offset`, of which at least `want` must arrive (the rest is alignment
/// slack that may lie past the end of the file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// File offset.
    pub offset: u64,
    /// Bytes to read.
    pub len: usize,
    /// Bytes that must arrive (at most `len`).
    pub want: usize,
}

/// Largest queue depth accepted (the ring is sized to it).
const MAX_QD: u32 = 4096;
/// Largest single read (the kernel caps one read at just under 2 GiB).
const MAX_READ: usize = 1 << 30;

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

/// `O_DIRECT` alignment for `file`: `statx(STATX_DIOALIGN)` (Linux 6.1+)
/// gives the file system's offset and memory alignment; we use the larger
/// of the two for offsets, lengths and buffers. Where the kernel does not
/// say, 4096: the page size on x86_64 and a multiple of every common
/// logical block size (512, 4096). `BLKSSZGET` would only work on a block
/// device, not on a regular file.
fn direct_alignment(file: &File, path: &Path) -> Result<usize, IoError> {
    if let Some((offset_align, mem_align)) = crate::sys::dio_alignment(file) {
        if offset_align == 0 {
            return Err(IoError::DirectUnsupported {
                path: path.to_path_buf(),
                reason: "statx reports no O_DIRECT support".into(),
            });
        }
        let a = offset_align.max(mem_align) as usize;
        if a.is_power_of_two() {
            return Ok(a);
        }
    }
    Ok(4096)
}

/// A buffer whose start is aligned, grown on demand and reused.
#[derive(Default)]
struct AlignedBuf {
    raw: Vec<u8>,
}

impl AlignedBuf {
    /// An aligned slice of `len` bytes (contents unspecified). No unsafe:
    /// the vector is over-allocated by `align` and sliced from the first
    /// aligned byte.
    fn get(&mut self, len: usize, align: usize) -> &mut [u8] {
        let need = len + align;
        if self.raw.len() < need {
            self.raw = vec![0; need];
        }
        let skip = self.raw.as_ptr().align_offset(align);
        &mut self.raw[skip..skip + len]
    }

    fn len(&self) -> usize {
        self.raw.len()
    }

    /// Free a large buffer so memory stays bounded between batches.
    fn trim(&mut self) {
        if self.raw.len() > SCRATCH_KEEP {
            self.raw = Vec::new();
        }
    }
}

/// One read: fill `buf` from file `fd` at `offset`; at least `want` bytes
/// must arrive (the rest is `O_DIRECT` slack that may lie past the end of
/// the file).
struct Op<'a> {
    /// The file read.
    fd: RawFd,
    offset: u64,
    buf: &'a mut [u8],
    want: usize,
}

/// Appends the reads of `buf` (file `fd`'s bytes from `offset`) to `ops`,
/// each at most `max` bytes; of each, the bytes before `need_end` must
/// arrive.
fn push_reads<'a>(
    ops: &mut Vec<Op<'a>>,
    fd: RawFd,
    mut buf: &'a mut [u8],
    mut offset: u64,
    need_end: u64,
    max: usize,
) {
    while !buf.is_empty() {
        let n = buf.len().min(max);
        let (head, tail) = std::mem::take(&mut buf).split_at_mut(n);
        let want = need_end.saturating_sub(offset).min(n as u64) as usize;
        ops.push(Op {
            fd,
            offset,
            buf: head,
            want,
        });
        offset += n as u64;
        buf = tail;
    }
}

/// Run `ops` on `ring` with up to `queue_depth` in flight, refilling as
/// completions arrive and resubmitting short reads for the remainder.
/// `align` is the `O_DIRECT` alignment (1 when buffered): a short read that
/// stops off alignment has hit the end of the file.
///
/// This is the only place buffer addresses are handed to the kernel. Its
/// safety rests on two facts: every `buf` is exclusively borrowed for the
/// whole call, and the call does not return or unwind while any read is in
/// flight (see [`Drain`]).
fn run_ops(
    ring: &mut IoUring,
    ops: &mut [Op<'_>],
    queue_depth: usize,
    align: usize,
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
    let mut failed: Option<IoError> = None;
    let mut ring = Drain { ring, in_flight: 0 };
    let capacity = queue_depth.min(ring.ring.params().sq_entries() as usize);

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
                    types::Fd(ops[i].fd),
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
                stats.requests += 1;
                stats.bytes += remaining as u64;
            }
        }
        if ring.in_flight == 0 {
            break;
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
                failed.get_or_insert(IoError::Read {
                    offset: at,
                    len: dst[i].1 - done[i],
                    error: io::Error::from_raw_os_error(-res),
                });
            } else if res == 0 {
                failed.get_or_insert(IoError::UnexpectedEof {
                    offset: at,
                    end: op.offset + op.want as u64,
                });
            } else {
                done[i] += res as usize;
                if done[i] < op.want {
                    stats.short_reads += 1;
                    if done[i].is_multiple_of(align) {
                        retry.push(i);
                    } else {
                        // O_DIRECT stopped off alignment: end of file.
                        failed.get_or_insert(IoError::UnexpectedEof {
                            offset: op.offset + done[i] as u64,
                            end: op.offset + op.want as u64,
                        });
                    }
                }
            }
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(stats),
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
