//! [`Reader`]: one reader over all of a table's files (see the module
//! documentation of [`crate::io`]).

use std::fs::File;
use std::io;
use std::ops::Range;
use std::path::Path;
use std::sync::Mutex;

use super::pool::Pool;
use super::uring::{Guard, Ring};
use super::{pread, FileEntry, IoError, Op, ReadStats};

/// Scratch kept between calls up to this size; larger is freed after use.
const SCRATCH_KEEP: usize = 16 << 20;

/// Scratch one round of reads uses (unaligned `O_DIRECT` reads, or the
/// floor's discarded extents): more is read in rounds, one after the
/// other, each of at most this much (or of one read, if larger).
const SCRATCH_CHUNK: usize = 32 << 20;

/// Largest single request (the kernel caps one read at just under 2 GiB).
const MAX_READ: usize = 1 << 30;

/// Largest queue depth accepted.
const MAX_QD: u32 = 4096;

/// How a [`Reader`] performs its requests (see the module documentation of
/// [`crate::io`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// Positioned reads on the caller's thread, one at a time.
    Pread,
    /// Positioned reads spread over a persistent pool of reader threads.
    Pool,
    /// One persistent io_uring (Linux only).
    Uring,
}

/// Settings of a [`Reader`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReaderConfig {
    /// How requests are performed.
    pub engine: Engine,
    /// Requests in flight at most (1..=4096): the ring's size, or the
    /// pool's reader threads, created once with the reader. `Pread` has
    /// one in flight whatever this says.
    pub queue_depth: u32,
    /// Read with `O_DIRECT` (bypassing the page cache) instead of buffered.
    pub direct: bool,
    /// Reads longer than this are cut into several requests in flight
    /// together (rounded down to a multiple of the file's alignment).
    pub max_read_bytes: usize,
    /// `Pool`: batches of fewer requests than this run inline on the
    /// caller's thread (no thread hop); a single request always does.
    pub inline_below: usize,
}

impl ReaderConfig {
    /// The defaults of `engine`, buffered.
    ///
    /// - `Pread`: reads are not cut.
    /// - `Pool`: 32 threads. On the build machine 16 / 32 / 64 threads
    ///   read cold random 4 KiB pages at ~54-61k / ~59-67k / ~60-66k IOPS
    ///   (1792 and 8192 pages). Batches of fewer than 3 requests run
    ///   inline: measured (`measure_pool_split_point` in
    ///   `tests/io_backends.rs`, medians of noisy runs), cold, 2 pages cost
    ///   ~170 us inline and ~180 us through the pool, 3 pages ~250 vs
    ///   ~170-190 us, 4 pages ~330 vs ~150-210 us, so the pool wins from 3
    ///   on. Warm, the hop to the pool costs 7-70 us against ~1 us inline
    ///   at every size up to 64, so warm batches should not be sent here at
    ///   all (the caller's residency check decides that, not this
    ///   threshold). Reads over 1 MiB are cut, the pieces read in parallel.
    /// - `Uring`: queue depth 64, reads over 1 MiB cut.
    pub fn new(engine: Engine) -> ReaderConfig {
        let (queue_depth, max_read_bytes) = match engine {
            Engine::Pread => (1, MAX_READ),
            Engine::Pool => (32, 1 << 20),
            Engine::Uring => (64, 1 << 20),
        };
        ReaderConfig {
            engine,
            queue_depth,
            direct: false,
            max_read_bytes,
            inline_below: 3,
        }
    }
}

/// One read of a batch: `len` bytes of file `file` (an index into the
/// reader's files) at `offset`, landing at `staging[dst..dst + len]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    /// The file, as an index into the paths the reader was opened with.
    pub file: usize,
    /// File offset.
    pub offset: u64,
    /// Bytes to read.
    pub len: usize,
    /// Where they land in staging.
    pub dst: usize,
    /// Bytes that must arrive (at most `len`); the rest may lie past the
    /// end of the file (`O_DIRECT` slack), and is unspecified when it does.
    pub need: usize,
}

impl Read {
    /// `len` bytes of file `file` at `offset`, all needed, landing at `dst`.
    pub fn new(file: usize, offset: u64, len: usize, dst: usize) -> Read {
        Read {
            file,
            offset,
            len,
            dst,
            need: len,
        }
    }
}

/// How the requests are performed.
enum Exec {
    Pread,
    Pool(Pool),
    Uring(Box<Ring>),
}

/// One reader over all of a table's files: a batch of [`Read`]s, in any
/// files, is read with up to the queue depth in flight across them.
///
/// Contract of [`Reader::read`]: on `Ok`, `staging[r.dst..][..r.len]` holds
/// the file's bytes `[r.offset, r.offset + r.len)` for every read `r` (the
/// first `r.need` of them at least), and no other staging byte was written.
/// On `Err`, the staging contents are unspecified, but no read is still in
/// flight. A reader is `Send + Sync` and may be called from many threads at
/// once; the engines' threads and ring are made once, never per call.
pub struct Reader {
    files: Vec<FileEntry>,
    cfg: ReaderConfig,
    exec: Exec,
    /// Aligned scratch for unaligned `O_DIRECT` reads and discarded
    /// extents, reused between calls (a caller that finds it in use, or a
    /// forked child whose parent held it, takes a fresh one).
    scratch: Mutex<AlignedBuf>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("files", &self.files)
            .field("cfg", &self.cfg)
            .finish()
    }
}

/// The engine performing one batch's requests (the ring locked for it).
enum Runner<'r> {
    Pread,
    Pool(&'r Pool),
    Uring(&'r Ring, Guard<'r>),
}

impl Runner<'_> {
    /// Runs `ops` until every one is complete.
    fn run(&mut self, ops: &mut [Op<'_>]) -> Result<ReadStats, IoError> {
        match self {
            Runner::Pread => pread::run(ops),
            Runner::Pool(p) => p.run(ops),
            Runner::Uring(r, g) => r.run(g, ops, None),
        }
    }
}

impl Reader {
    /// Opens every file of `paths` read-only (with `O_DIRECT` if
    /// `cfg.direct`, each through [`crate::sys::open_regular_direct`] or
    /// [`crate::sys::open_regular`]) and starts the engine. Fails with
    /// [`IoError::UringUnavailable`] where io_uring cannot be used and with
    /// [`IoError::DirectUnsupported`] where the file system refuses
    /// `O_DIRECT` for any of the files (the caller falls back to another
    /// configuration).
    pub fn open<P: AsRef<Path>>(paths: &[P], cfg: ReaderConfig) -> Result<Reader, IoError> {
        let qd = cfg.queue_depth.clamp(1, MAX_QD);
        let exec = match cfg.engine {
            Engine::Pread => Exec::Pread,
            Engine::Pool => Exec::Pool(Pool::new(qd as usize, cfg.inline_below)?),
            Engine::Uring => Exec::Uring(Box::new(Ring::new(qd)?)),
        };
        let files = paths
            .iter()
            .map(|p| open_file(p.as_ref(), cfg.direct))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Reader {
            files,
            cfg,
            exec,
            scratch: Mutex::new(AlignedBuf::default()),
        })
    }

    /// Checks io_uring works here (ring setup, `IORING_OP_READ`, one no-op
    /// round trip), without opening any file.
    pub fn probe_uring() -> Result<(), IoError> {
        Ring::probe()
    }

    /// Short name: `pread`, `pool`, `uring`, with `-direct` for `O_DIRECT`.
    pub fn name(&self) -> &'static str {
        match (self.cfg.engine, self.cfg.direct) {
            (Engine::Pread, false) => "pread",
            (Engine::Pread, true) => "pread-direct",
            (Engine::Pool, false) => "pool",
            (Engine::Pool, true) => "pool-direct",
            (Engine::Uring, false) => "uring",
            (Engine::Uring, true) => "uring-direct",
        }
    }

    /// The settings in force.
    pub fn config(&self) -> ReaderConfig {
        self.cfg
    }

    /// The number of files.
    pub fn files(&self) -> usize {
        self.files.len()
    }

    /// The path of file `k`.
    pub fn path(&self, k: usize) -> Option<&Path> {
        self.files.get(k).map(|f| f.path.as_path())
    }

    /// The open file `k` (to `fstat` it).
    pub fn file(&self, k: usize) -> Option<&File> {
        self.files.get(k).map(|f| &f.file)
    }

    /// The `O_DIRECT` alignment of file `k` in bytes (1 when buffered):
    /// from `statx`'s `dio_offset_align`/`dio_mem_align` where the kernel
    /// reports them, else 4096.
    pub fn alignment(&self, k: usize) -> Option<usize> {
        self.files.get(k).map(|f| f.align)
    }

    /// The alignment every file's reads satisfy: the least common multiple
    /// of the files' [`alignment`](Reader::alignment)s (1 when buffered).
    pub fn common_alignment(&self) -> usize {
        fn gcd(a: usize, b: usize) -> usize {
            if b == 0 {
                a
            } else {
                gcd(b, a % b)
            }
        }
        self.files
            .iter()
            .fold(1, |l, f| l / gcd(l, f.align) * f.align)
    }

    /// Reads `reads` into `staging` (see the [`Reader`] contract). Reads
    /// must land in ascending, non-overlapping staging ranges (in any files
    /// and at any offsets); empty reads read nothing. With `O_DIRECT`, a
    /// read whose offset, length and staging address are multiples of its
    /// file's alignment lands in place; any other is read as the aligned
    /// blocks covering it (blocks of neighbouring reads of one file that
    /// touch merged into one request) into scratch of at most 32 MiB per
    /// round, and copied out.
    pub fn read(&self, reads: &[Read], staging: &mut [u8]) -> Result<ReadStats, IoError> {
        let dsts = self.split(reads, staging)?;
        let mut batch = Batch {
            reader: self,
            runner: None,
            scratch: None,
            own: AlignedBuf::default(),
            stats: ReadStats::default(),
        };
        let result = batch.read(reads, dsts);
        let stats = batch.stats;
        batch.finish();
        result.map(|()| stats)
    }

    /// Reads `reads` into `staging` as [`Reader::read`] does and hands each
    /// read's bytes (`staging[r.dst..][..r.len]`) to `each` with its index,
    /// every read once, in order. On io_uring, when every read lands in
    /// place (buffered, or aligned for `O_DIRECT`), a read is handed over as
    /// soon as it and every read before it are in, while later reads are
    /// still in flight, so the caller's work on the first rows overlaps the
    /// device's on the last; each such read is one request, however long.
    /// Otherwise every read is handed over once the batch is in. On `Err`,
    /// the reads handed over before it are complete and correct.
    pub fn read_each(
        &self,
        reads: &[Read],
        staging: &mut [u8],
        each: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<ReadStats, IoError> {
        let base = staging.as_ptr() as usize;
        let in_place = |r: &Read| {
            r.len <= MAX_READ
                && self.files.get(r.file).is_some_and(|f| {
                    f.in_place(r.offset, r.len, base.wrapping_add(r.dst), self.cfg.direct)
                })
        };
        // (the guard runs only on io_uring: pread and the pool never stream)
        let ring = match &self.exec {
            Exec::Uring(ring) if reads.iter().all(in_place) => ring,
            _ => {
                let stats = self.read(reads, staging)?;
                for (i, r) in reads.iter().enumerate() {
                    each(i, &staging[r.dst..r.dst + r.len]);
                }
                return Ok(stats);
            }
        };
        let dsts = self.split(reads, staging)?;
        let mut ops = Vec::with_capacity(reads.len());
        // The read of each op (empty reads have none).
        let mut of_op = Vec::with_capacity(reads.len());
        for (i, (r, buf)) in reads.iter().zip(dsts).enumerate() {
            if r.len > 0 {
                ops.push(Op {
                    file: &self.files[r.file],
                    offset: r.offset,
                    buf,
                    want: r.need,
                });
                of_op.push(i);
            }
        }
        // Reads handed over so far (a prefix; empty ones with the next).
        let mut next = 0usize;
        let stats = {
            let mut ready = |k: usize, op: &Op<'_>| {
                let i = of_op[k];
                for e in next..i {
                    each(e, &[]);
                }
                each(i, &op.buf[..]);
                next = i + 1;
            };
            ring.run(&mut ring.lock()?, &mut ops, Some(&mut ready))?
        };
        for e in next..reads.len() {
            each(e, &[]);
        }
        Ok(stats)
    }

    /// Checks `reads` against the files and `staging` (see
    /// [`Reader::read`]) and splits each one's destination off `staging`.
    fn split<'s>(&self, reads: &[Read], staging: &'s mut [u8]) -> Result<Vec<&'s mut [u8]>, IoError> {
        let mut end = 0usize;
        for (index, r) in reads.iter().enumerate() {
            let bad = |reason: String| IoError::BadRead { index, reason };
            if r.file >= self.files.len() {
                return Err(bad(format!(
                    "names file {} of {}",
                    r.file,
                    self.files.len()
                )));
            }
            if r.need > r.len {
                return Err(bad(format!("needs {} of its {} bytes", r.need, r.len)));
            }
            if r.offset.checked_add(r.len as u64).is_none() {
                return Err(bad("ends past the largest file offset".into()));
            }
            if r.dst < end {
                return Err(bad(format!(
                    "lands at staging offset {}, before the end of the previous read ({end})",
                    r.dst
                )));
            }
            end = r
                .dst
                .checked_add(r.len)
                .ok_or_else(|| bad("ends past the largest staging offset".into()))?;
        }
        if staging.len() < end {
            return Err(IoError::Staging {
                need: end,
                got: staging.len(),
            });
        }
        // No unsafe code: each destination is split off the rest.
        let mut dsts = Vec::with_capacity(reads.len());
        let mut rest = staging;
        let mut base = 0usize;
        for r in reads {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(r.dst - base);
            let (dst, tail) = tail.split_at_mut(r.len);
            rest = tail;
            base = r.dst + r.len;
            dsts.push(dst);
        }
        Ok(dsts)
    }

    /// The device floor's reads: each extent `(k, range)` of file `k` as
    /// one request (an extent longer than [`ReaderConfig::max_read_bytes`]
    /// as several), all in flight together at up to the queue depth
    /// whatever file they are in, into scratch that is then discarded
    /// (rounds of at most 32 MiB, or one extent). With `O_DIRECT` every
    /// extent's start and length must be multiples of its file's
    /// [`alignment`](Reader::alignment) ([`IoError::Misaligned`]
    /// otherwise). An extent starting at or past the end of its file is
    /// [`IoError::UnexpectedEof`]; one reaching past it reads what the
    /// file has. Empty extents read nothing.
    pub fn discard(&self, extents: &[(usize, Range<u64>)]) -> Result<ReadStats, IoError> {
        let mut lens: Vec<Option<u64>> = vec![None; self.files.len()];
        let mut reads = Vec::with_capacity(extents.len());
        let mut rounds = vec![0usize];
        let mut round_bytes = 0usize;
        let mut widest = 0usize;
        for (index, (k, e)) in extents.iter().enumerate() {
            if e.end <= e.start {
                continue;
            }
            let f = self.files.get(*k).ok_or_else(|| IoError::BadRead {
                index,
                reason: format!("names file {k} of {}", self.files.len()),
            })?;
            let len = usize::try_from(e.end - e.start).map_err(|_| IoError::BadRead {
                index,
                reason: "is longer than memory".into(),
            })?;
            let a = f.align as u64;
            if !e.start.is_multiple_of(a) || !(len as u64).is_multiple_of(a) {
                return Err(IoError::Misaligned {
                    path: f.path.clone(),
                    offset: e.start,
                    len,
                    align: f.align,
                });
            }
            let file_len = match lens[*k] {
                Some(n) => n,
                None => *lens[*k].insert(f.file.metadata().map(|m| m.len()).map_err(|error| {
                    IoError::Os {
                        what: "fstat",
                        error,
                    }
                })?),
            };
            if e.start >= file_len {
                return Err(IoError::UnexpectedEof {
                    path: f.path.clone(),
                    offset: file_len,
                    end: e.end,
                });
            }
            if round_bytes > 0 && round_bytes + len > SCRATCH_CHUNK {
                rounds.push(reads.len());
                round_bytes = 0;
            }
            reads.push(Read {
                file: *k,
                offset: e.start,
                len,
                dst: round_bytes,
                need: (file_len - e.start).min(len as u64) as usize,
            });
            round_bytes += len;
            widest = widest.max(round_bytes);
        }
        rounds.push(reads.len());
        let align = self.files.iter().map(|f| f.align).max().unwrap_or(1);
        let mut own = AlignedBuf::default();
        let mut held = self.scratch.try_lock().ok();
        let scratch = held.as_deref_mut().unwrap_or(&mut own);
        let mut stats = ReadStats::default();
        let mut result = Ok(());
        for w in rounds.windows(2) {
            let buf = scratch.get(widest, align.max(4096));
            match self.read(&reads[w[0]..w[1]], buf) {
                Ok(s) => stats.add(s),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        scratch.trim();
        result.map(|()| stats)
    }

    /// Largest request to file `f`: the configured cut, a multiple of its
    /// alignment.
    fn max_request(&self, f: &FileEntry) -> usize {
        (self.cfg.max_read_bytes.clamp(1, MAX_READ) / f.align).max(1) * f.align
    }

    /// The engine, ready for a batch (the ring locked).
    fn runner(&self) -> Result<Runner<'_>, IoError> {
        Ok(match &self.exec {
            Exec::Pread => Runner::Pread,
            Exec::Pool(p) => Runner::Pool(p),
            Exec::Uring(r) => Runner::Uring(r, r.lock()?),
        })
    }
}

/// The aligned blocks covering unaligned `O_DIRECT` reads of one file,
/// read into scratch at `at`: bytes `start..end` of file `file`, those
/// before `need_end` needed.
struct Cover {
    file: usize,
    start: u64,
    end: u64,
    need_end: u64,
    at: usize,
}

/// One call of [`Reader::read`]: the engine and the scratch, each taken
/// when first needed.
struct Batch<'r> {
    reader: &'r Reader,
    runner: Option<Runner<'r>>,
    scratch: Option<std::sync::MutexGuard<'r, AlignedBuf>>,
    /// Scratch of this call when the reader's is in use.
    own: AlignedBuf,
    stats: ReadStats,
}

impl<'r> Batch<'r> {
    /// Reads `reads` into their destinations `dsts`, in rounds bounded by
    /// scratch.
    fn read(&mut self, reads: &[Read], dsts: Vec<&mut [u8]>) -> Result<(), IoError> {
        let reader = self.reader;
        let direct = reader.cfg.direct;
        let mut in_place = Vec::new();
        let mut covers: Vec<Cover> = Vec::new();
        let mut copies = Vec::new();
        let mut scratch_len = 0usize;
        for (r, dst) in reads.iter().zip(dsts) {
            if r.len == 0 {
                continue;
            }
            let f = &reader.files[r.file];
            let a = f.align;
            let need_end = r.offset + r.need as u64;
            if f.in_place(r.offset, r.len, dst.as_ptr() as usize, direct) {
                push_reads(
                    &mut in_place,
                    f,
                    dst,
                    r.offset,
                    need_end,
                    reader.max_request(f),
                );
                continue;
            }
            let a = a as u64;
            let start = r.offset / a * a;
            let end = (r.offset + r.len as u64).div_ceil(a) * a;
            match covers.last_mut() {
                Some(c) if c.file == r.file && c.start <= start && start <= c.end => {
                    let grow = end.saturating_sub(c.end) as usize;
                    c.end += grow as u64;
                    c.need_end = c.need_end.max(need_end);
                    scratch_len += grow;
                    copies.push((dst, c.at + (r.offset - c.start) as usize));
                }
                _ => {
                    let span = (end - start) as usize;
                    if scratch_len > 0 && scratch_len + span > SCRATCH_CHUNK {
                        self.round(&mut in_place, &covers, &mut copies, scratch_len)?;
                        covers.clear();
                        scratch_len = 0;
                    }
                    covers.push(Cover {
                        file: r.file,
                        start,
                        end,
                        need_end,
                        at: scratch_len,
                    });
                    copies.push((dst, scratch_len + (r.offset - start) as usize));
                    scratch_len += span;
                }
            }
        }
        self.round(&mut in_place, &covers, &mut copies, scratch_len)
    }

    /// Runs the in-place requests and the covers' (read into `scratch_len`
    /// bytes of scratch) together, then copies each unaligned read out of
    /// scratch.
    fn round<'b>(
        &mut self,
        in_place: &mut Vec<Op<'b>>,
        covers: &[Cover],
        copies: &mut Vec<(&'b mut [u8], usize)>,
        scratch_len: usize,
    ) -> Result<(), IoError> {
        let reader = self.reader;
        if in_place.is_empty() && covers.is_empty() {
            return Ok(());
        }
        let runner = match &mut self.runner {
            Some(r) => r,
            None => self.runner.insert(reader.runner()?),
        };
        let mut ops: Vec<Op<'_>> = Vec::with_capacity(in_place.len() + covers.len());
        for op in in_place.drain(..) {
            ops.push(op);
        }
        if covers.is_empty() {
            self.stats.add(runner.run(&mut ops)?);
            return Ok(());
        }
        if self.scratch.is_none() {
            self.scratch = reader.scratch.try_lock().ok();
        }
        let scratch = self.scratch.as_deref_mut().unwrap_or(&mut self.own);
        let align = reader.files.iter().map(|f| f.align).max().unwrap_or(1);
        let mut rest = scratch.get(scratch_len, align.max(4096));
        for c in covers {
            let f = &reader.files[c.file];
            let (buf, tail) = std::mem::take(&mut rest).split_at_mut((c.end - c.start) as usize);
            rest = tail;
            push_reads(&mut ops, f, buf, c.start, c.need_end, reader.max_request(f));
        }
        let stats = runner.run(&mut ops);
        drop(ops);
        self.stats.add(stats?);
        let src = scratch.get(scratch_len, align.max(4096));
        for (dst, at) in copies.drain(..) {
            let n = dst.len();
            dst.copy_from_slice(&src[at..at + n]);
        }
        Ok(())
    }

    /// Frees large scratch.
    fn finish(mut self) {
        if let Some(s) = self.scratch.as_deref_mut() {
            s.trim();
        }
    }
}

/// Appends the requests reading `buf` (file `f`'s bytes from `offset`) to
/// `ops`, each at most `max` bytes; of each, the bytes before `need_end`
/// must arrive.
fn push_reads<'a>(
    ops: &mut Vec<Op<'a>>,
    f: &'a FileEntry,
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
            file: f,
            offset,
            buf: head,
            want,
        });
        offset += n as u64;
        buf = tail;
    }
}

/// Opens `path` read-only: buffered for random reads (readahead off), or
/// with `O_DIRECT` and its alignment.
fn open_file(path: &Path, direct: bool) -> Result<FileEntry, IoError> {
    if !direct {
        let file = crate::sys::open_regular(path).map_err(|error| IoError::Open {
            path: path.to_path_buf(),
            error,
        })?;
        crate::sys::random_reads(&file);
        return Ok(FileEntry {
            path: path.to_path_buf(),
            file,
            align: 1,
        });
    }
    let file = crate::sys::open_regular_direct(path).map_err(|error| {
        if error.raw_os_error() == Some(libc::EINVAL) || error.kind() == io::ErrorKind::Unsupported
        {
            IoError::DirectUnsupported {
                path: path.to_path_buf(),
                reason: error.to_string(),
            }
        } else {
            IoError::Open {
                path: path.to_path_buf(),
                error,
            }
        }
    })?;
    let align = direct_alignment(&file, path)?;
    Ok(FileEntry {
        path: path.to_path_buf(),
        file,
        align,
    })
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

    /// Free a large buffer so memory stays bounded between batches.
    fn trim(&mut self) {
        if self.raw.len() > SCRATCH_KEEP {
            self.raw = Vec::new();
        }
    }
}
