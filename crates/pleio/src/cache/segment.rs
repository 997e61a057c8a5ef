//! The machine-wide row cache: one segment file in shared memory
//! (`/dev/shm/pleio-<identity>`) that every process serving the same table
//! maps, with lock-free readers (a seqlock per slot) and one device read
//! per missing row machine-wide. See docs/cache.md, "The shared cache".
//!
//! Layout, in 64-bit words (all access atomic; every value read from the
//! segment is validated or only compared, never used as an index):
//! - a header of [`HEADER_WORDS`]: magic, version, geometry, the table's
//!   identity, counters, an attach table of pids and a label;
//! - per set of [`WAYS`] slots, two words: the set's claim lock (the
//!   holder's pid and thread token, 0 when free) and its CLOCK hand;
//! - from a page boundary, per set, one block of whole cache lines: its
//!   slots' tags (the row id + 1 of each, 0: none; 8 words, one line, so a
//!   lookup reads one line), then its slots: three words each, the seqlock
//!   version (odd while a writer owns the slot), the state (empty, ready,
//!   or filling by pid and thread token) and the CLOCK reference bit, then
//!   the row's stored bytes in whole words. A hit reads the tag line and
//!   its slot's consecutive words, on one page unless the block crosses one.
//!
//! The segment's geometry is fixed at creation from the budget of the
//! process that made it: one budget per machine.

use std::fs::File;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::sys::shm::{self, SharedWords};

/// "PLEIOSHM" little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"PLEIOSHM");
/// The segment layout's version.
pub const VERSION: u64 = 3;
/// Slots per set (rows map to a set by hash; a set is searched whole).
pub const WAYS: usize = 8;
/// Words of the header.
pub const HEADER_WORDS: usize = 128;
/// Segment file names start with this.
pub const PREFIX: &str = "pleio-";

const H_MAGIC: usize = 0;
const H_VERSION: usize = 1;
const H_SETS: usize = 2;
const H_STRIDE: usize = 3;
const H_ROW_BYTES: usize = 4;
const H_ROWS: usize = 5;
const H_BUDGET: usize = 6;
const H_ID0: usize = 7;
const H_ID1: usize = 8;
const H_TOTAL: usize = 9;
/// Set to 1 by `pleio cache rm`: attached processes move to a new segment.
const H_REMOVED: usize = 10;
const C_HITS: usize = 16;
const C_MISSES: usize = 17;
const C_READS: usize = 18;
const C_BYTES: usize = 19;
const C_EVICTIONS: usize = 20;
const C_WAITS: usize = 21;
const C_RECLAIMS: usize = 22;
const C_UNCACHED: usize = 23;
const H_ATTACH: usize = 32;
/// Entries of the attach table (pids; 0 when free).
pub const ATTACH_SLOTS: usize = 64;
const H_LABEL: usize = 96;
const LABEL_BYTES: usize = 8 * (HEADER_WORDS - H_LABEL - 1);

/// Words before a slot's row bytes: version, state, reference bit.
const SLOT_META: usize = 3;

const EMPTY: u64 = 0;
const READY: u64 = 1 << 62;
const FILLING: u64 = 2 << 62;
const KIND: u64 = 3 << 62;

/// How long a process waits for another live one to fill a row before
/// reading it itself (without caching it).
const FILL_WAIT: Duration = Duration::from_secs(5);
/// The first sleep of a gather's waits for rows other processes fill.
pub const FIRST_NAP: Duration = Duration::from_micros(20);
/// How long a set's claim lock is waited for before it is taken anyway
/// (it only keeps two processes from reading the same row; the slots stay
/// exclusive by their own state words).
const LOCK_WAIT: Duration = Duration::from_secs(1);
/// Seqlock retries of one hit before it counts as a miss.
const READ_TRIES: usize = 16;

/// Why a segment cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    /// The OS refused an operation on the segment file.
    #[error("{}: {what}: {error}", path.display())]
    Os {
        /// The segment.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        error: std::io::Error,
    },
    /// The file is not a segment of this layout, or belongs to another table.
    #[error("{}: {reason}", path.display())]
    Foreign {
        /// The segment.
        path: PathBuf,
        /// What does not match.
        reason: String,
    },
    /// The file is shorter than a segment, or than its header says: not a
    /// segment, or one another process shrank.
    #[error("{}: short file ({reason})", path.display())]
    Short {
        /// The segment.
        path: PathBuf,
        /// Its length, and what it should be.
        reason: String,
    },
    /// A segment of another layout version (made by another pleio build).
    #[error("{}: segment layout version {found} (this build: {VERSION}); `pleio cache rm` removes it", path.display())]
    Version {
        /// The segment.
        path: PathBuf,
        /// Its layout version.
        found: u64,
    },
    /// The budget cannot hold one set of slots.
    #[error("a shared row cache budget of {budget} bytes is too small: rows of {row_bytes} bytes need at least {need}")]
    BudgetTooSmall {
        /// The budget asked for.
        budget: u64,
        /// Bytes per row.
        row_bytes: u64,
        /// The smallest budget that works.
        need: u64,
    },
}

/// What makes a segment's rows the rows of one table: a hash of every file's
/// device, inode, size and modification time and of the rows' geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Two independent 64-bit hashes.
    pub id: [u64; 2],
    /// Rows of the table.
    pub rows: u64,
    /// Stored bytes per row.
    pub row_bytes: u64,
}

impl Identity {
    /// The identity of a table of `rows` rows of `row_bytes` stored bytes
    /// whose files are `files` and whose geometry (tensor names, offsets) is
    /// described by `geometry`.
    pub fn new(files: &[&File], rows: u64, row_bytes: u64, geometry: &[u8]) -> std::io::Result<Identity> {
        let mut a = Fnv::new(0xcbf2_9ce4_8422_2325);
        let mut b = Fnv::new(0x6c62_272e_07bb_0142);
        let mut put = |v: &[u8]| {
            a.put(v);
            b.put(v);
        };
        put(&VERSION.to_le_bytes());
        for f in files {
            let m = f.metadata()?;
            for v in [m.dev(), m.ino(), m.size(), m.mtime() as u64, m.mtime_nsec() as u64] {
                put(&v.to_le_bytes());
            }
        }
        put(&rows.to_le_bytes());
        put(&row_bytes.to_le_bytes());
        put(geometry);
        Ok(Identity {
            id: [a.0, b.0],
            rows,
            row_bytes,
        })
    }

    /// The segment's file name.
    pub fn file_name(&self) -> String {
        format!("{PREFIX}{:016x}{:016x}", self.id[0], self.id[1])
    }
}

/// FNV-1a, 64-bit: stable across builds (the name must be the same in
/// every process, whatever compiler built it).
struct Fnv(u64);

impl Fnv {
    fn new(seed: u64) -> Fnv {
        Fnv(seed)
    }
    fn put(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// The directory segments live in: `PLEIO_SHM_DIR` if set, else `/dev/shm`.
pub fn shm_dir() -> PathBuf {
    std::env::var_os("PLEIO_SHM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/shm"))
}

/// A segment's geometry, derived from its set count and stride only (so a
/// header that passes validation gives in-bounds indices).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Geometry {
    sets: usize,
    stride_words: usize,
    sets_at: usize,
    /// Where the set blocks start (a 4 KiB boundary).
    blocks_at: usize,
    /// Words of one slot: [`SLOT_META`] and the stride, padded so a slot
    /// spans no more cache lines than it must (a power of two up to a
    /// line, whole lines above).
    slot: usize,
    /// Words of one set block: its tag line, then its slots.
    block: usize,
    total: usize,
}

impl Geometry {
    fn new(sets: usize, stride_words: usize) -> Option<Geometry> {
        let sets_at = HEADER_WORDS;
        let meta = SLOT_META.checked_add(stride_words)?;
        let slot = if meta <= 8 {
            meta.next_power_of_two()
        } else {
            meta.checked_add(7)? / 8 * 8
        };
        let block = WAYS.checked_add(WAYS.checked_mul(slot)?)?.checked_add(7)? / 8 * 8;
        let end = sets_at.checked_add(sets.checked_mul(2)?)?;
        let blocks_at = end.checked_add(511)? / 512 * 512;
        let total = blocks_at.checked_add(sets.checked_mul(block)?)?;
        (total <= (isize::MAX as usize) / 8).then_some(Geometry {
            sets,
            stride_words,
            sets_at,
            blocks_at,
            slot,
            block,
            total,
        })
    }

    /// The most sets `budget` bytes hold for rows of `stride_words`.
    fn for_budget(budget: u64, stride_words: usize) -> Option<Geometry> {
        let block = Geometry::new(1, stride_words)?.block;
        let per_set = (2 + block) as u64 * 8;
        let mut sets = (budget.saturating_sub((HEADER_WORDS as u64 + 512) * 8) / per_set) as usize;
        while sets > 0 {
            match Geometry::new(sets, stride_words) {
                Some(g) if (g.total as u64) * 8 <= budget => return Some(g),
                _ => sets -= 1,
            }
        }
        None
    }

    fn slots(&self) -> usize {
        self.sets * WAYS
    }

    /// The first word of `set`'s block: its tag line.
    fn tags_of(&self, set: usize) -> usize {
        self.blocks_at + set * self.block
    }
}

/// Counters of a segment (machine-wide, since creation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentStats {
    /// Rows served from the segment.
    pub hits: u64,
    /// Rows read from the device and inserted.
    pub misses: u64,
    /// Read requests sent to the device.
    pub reads: u64,
    /// Bytes read from the device.
    pub bytes_read: u64,
    /// Rows evicted to make room.
    pub evictions: u64,
    /// Rows a process waited for while another read them.
    pub waits: u64,
    /// Slots taken back from processes that died filling them.
    pub reclaims: u64,
    /// Rows read without caching (no free slot, or a wait timed out).
    pub uncached: u64,
}

/// What `pleio cache ls` shows of a segment.
#[derive(Clone, Debug)]
pub struct SegmentInfo {
    /// The segment file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// The budget it was created with.
    pub budget: u64,
    /// Slots (the rows it holds at most).
    pub slots: u64,
    /// Slots holding a row now.
    pub resident: u64,
    /// Stored bytes per row.
    pub row_bytes: u64,
    /// Rows of the table.
    pub rows: u64,
    /// The table it caches (as its creator named it).
    pub label: String,
    /// Live attached processes.
    pub attached: Vec<u32>,
    /// Counters.
    pub stats: SegmentStats,
}

/// One mapped segment.
pub struct Segment {
    map: SharedWords,
    path: PathBuf,
    geo: Geometry,
    row_bytes: usize,
    /// Device and inode of the mapped file.
    file_id: (u64, u64),
    /// This process's entry in the attach table, if it got one.
    attach: Option<usize>,
    /// Remove the segment when the last process detaches.
    remove_on_detach: bool,
}

/// What a probe for a row found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// The row's bytes were copied out.
    Hit,
    /// The caller owns `slot` and must [`Segment::publish`] or
    /// [`Segment::abandon`] it.
    Claimed(usize),
    /// Another process is filling `slot` (its state was `state`).
    Wait {
        /// The slot.
        slot: usize,
        /// Its state word when seen (the writer's pid and token).
        state: u64,
    },
    /// No slot could be had: read the row without caching it.
    Uncached,
}

/// This thread's token: a process-unique nonzero number, so threads of one
/// process tell their claims apart.
fn token() -> u64 {
    use std::sync::atomic::AtomicU32;
    static NEXT: AtomicU32 = AtomicU32::new(1);
    thread_local! {
        static TOKEN: u64 = u64::from(NEXT.fetch_add(1, Ordering::Relaxed) & 0x3fff_ffff).max(1);
    }
    TOKEN.with(|t| *t)
}

/// The owner word of this thread: token and pid.
fn me() -> u64 {
    (token() << 32) | u64::from(crate::sys::pid())
}

fn pid_of(word: u64) -> u32 {
    word as u32
}

/// A row's set: a multiplicative hash spreads neighbouring rows.
fn set_of(row: u64, sets: usize) -> usize {
    let h = row.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    ((u128::from(h >> 1) * sets as u128) >> 63) as usize
}

impl Segment {
    /// Attaches to the segment of `id` in `dir`, creating it (sized for
    /// `budget`, its mode and group taken from `like`, the table's first
    /// file; owner-only without one, for a remote table) if there is none. `label` names the table in `pleio cache ls`.
    pub fn attach(
        dir: &Path,
        id: &Identity,
        budget: u64,
        like: Option<&File>,
        label: &str,
        remove_on_detach: bool,
    ) -> Result<Segment, SegmentError> {
        let path = dir.join(id.file_name());
        for _ in 0..8 {
            match shm::open_segment(&path) {
                Ok(f) => {
                    let meta = fstat(&f, &path)?;
                    match Segment::validate(f, &meta, &path, Some(id)) {
                        Ok(mut s) => {
                            s.remove_on_detach = remove_on_detach;
                            s.register();
                            // Removed (or shrunk) between our open and our
                            // registration: find or make the current one.
                            if s.removed() || s.lost() || !same_file(&path, s.file_id) {
                                // Dropping detaches without removing.
                                s.remove_on_detach = false;
                                continue;
                            }
                            return Ok(s);
                        }
                        // Segments are linked into place whole, so a short
                        // one was shrunk by someone: it serves no one.
                        // Remove it (if it is still the file we looked at)
                        // and make a new one.
                        Err(SegmentError::Short { .. }) => {
                            if same_file(&path, (meta.dev(), meta.ino())) {
                                let _ = std::fs::remove_file(&path);
                            }
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => {
                    return Err(SegmentError::Os {
                        path,
                        what: "open",
                        error,
                    })
                }
            }
            match Segment::create(dir, &path, id, budget, like, label) {
                Ok(()) => continue,
                Err(SegmentError::Os { error, .. })
                    if error.kind() == std::io::ErrorKind::AlreadyExists =>
                {
                    continue
                }
                Err(e) => return Err(e),
            }
        }
        Err(SegmentError::Foreign {
            path,
            reason: "could not attach after 8 tries (created and removed under us)".into(),
        })
    }

    /// Makes the segment under a temporary name, fully initialised, then
    /// links it into place (fails with `AlreadyExists` if another process
    /// was first).
    fn create(
        dir: &Path,
        path: &Path,
        id: &Identity,
        budget: u64,
        like: Option<&File>,
        label: &str,
    ) -> Result<(), SegmentError> {
        let os = |what, error| SegmentError::Os {
            path: path.to_path_buf(),
            what,
            error,
        };
        let stride_words = (id.row_bytes as usize).div_ceil(8).max(1);
        let geo = Geometry::for_budget(budget, stride_words).ok_or_else(|| {
            let need = Geometry::new(1, stride_words).map_or(u64::MAX, |g| g.total as u64 * 8);
            SegmentError::BudgetTooSmall {
                budget,
                row_bytes: id.row_bytes,
                need,
            }
        })?;
        let meta = match like {
            Some(f) => Some(f.metadata().map_err(|e| os("fstat of the table", e))?),
            None => None,
        };
        // Every class that may read the table may read and write the cache
        // (the owner only, for a table with no file).
        let r = meta.as_ref().map_or(0o400, |m| m.mode());
        let mode = (0..3).fold(0, |m, k| {
            if r & (0o4 << (3 * k)) != 0 {
                m | (0o6 << (3 * k))
            } else {
                m
            }
        }) | 0o600;
        let tmp = dir.join(format!(
            ".{}.{}.{:x}",
            id.file_name(),
            std::process::id(),
            token()
        ));
        let f = shm::create_segment(&tmp, 0o600).map_err(|e| os("create", e))?;
        let cleanup = |e: SegmentError| {
            let _ = std::fs::remove_file(&tmp);
            e
        };
        // Owner and group as the table's where we may; else the group only;
        // else ours, with the group and other bits dropped, so no one gets
        // access the table does not give.
        let mut mode = mode;
        if let Some(meta) = &meta {
            if std::os::unix::fs::fchown(&f, Some(meta.uid()), Some(meta.gid())).is_err()
                && std::os::unix::fs::fchown(&f, None, Some(meta.gid())).is_err()
            {
                mode &= 0o600;
            }
        }
        f.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(|e| cleanup(os("fchmod", e)))?;
        f.set_len(geo.total as u64 * 8)
            .map_err(|e| cleanup(os("ftruncate", e)))?;
        shm::allocate(&f, geo.total as u64 * 8).map_err(|e| cleanup(os("fallocate", e)))?;
        let map = SharedWords::map(&f, geo.total).map_err(|e| cleanup(os("mmap", e)))?;
        let w = map.words();
        let set = |i: usize, v: u64| w[i].store(v, Ordering::Relaxed);
        set(H_VERSION, VERSION);
        set(H_SETS, geo.sets as u64);
        set(H_STRIDE, geo.stride_words as u64);
        set(H_ROW_BYTES, id.row_bytes);
        set(H_ROWS, id.rows);
        set(H_BUDGET, budget);
        set(H_ID0, id.id[0]);
        set(H_ID1, id.id[1]);
        set(H_TOTAL, geo.total as u64);
        let label = label.as_bytes();
        let label = &label[..label.len().min(LABEL_BYTES)];
        set(H_LABEL, label.len() as u64);
        for (k, c) in label.chunks(8).enumerate() {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            set(H_LABEL + 1 + k, u64::from_le_bytes(b));
        }
        w[H_MAGIC].store(MAGIC, Ordering::Release);
        drop(map);
        // link(2) fails if the name exists: the first process wins.
        let linked = std::fs::hard_link(&tmp, path);
        let _ = std::fs::remove_file(&tmp);
        linked.map_err(|e| os("link", e))
    }

    /// Opens the segment at `path` for inspection (`pleio cache`), checking
    /// its header but not its identity.
    pub fn inspect(path: &Path) -> Result<Segment, SegmentError> {
        let f = shm::open_segment(path).map_err(|error| SegmentError::Os {
            path: path.to_path_buf(),
            what: "open",
            error,
        })?;
        let meta = fstat(&f, path)?;
        Segment::validate(f, &meta, path, None)
    }

    /// Maps `f` and checks every header field the geometry depends on, and
    /// the identity when given (`meta`: `f`'s).
    fn validate(
        f: File,
        meta: &std::fs::Metadata,
        path: &Path,
        id: Option<&Identity>,
    ) -> Result<Segment, SegmentError> {
        let short = |reason: String| SegmentError::Short {
            path: path.to_path_buf(),
            reason,
        };
        let len = meta.len();
        if len < HEADER_WORDS as u64 * 8 {
            return Err(short(format!("{len} bytes: not a segment")));
        }
        let hmap = SharedWords::map(&f, HEADER_WORDS).map_err(|error| SegmentError::Os {
            path: path.to_path_buf(),
            what: "mmap",
            error,
        })?;
        let h = |i: usize| hmap.words()[i].load(Ordering::Acquire);
        // Shrunk under us: the header now reads as zeros.
        let foreign = |reason: String| {
            if hmap.lost() {
                short("shrunk while being opened".into())
            } else {
                SegmentError::Foreign {
                    path: path.to_path_buf(),
                    reason,
                }
            }
        };
        if h(H_MAGIC) != MAGIC {
            return Err(foreign("no pleio segment magic".into()));
        }
        if h(H_VERSION) != VERSION {
            return Err(SegmentError::Version {
                path: path.to_path_buf(),
                found: h(H_VERSION),
            });
        }
        let sets = usize::try_from(h(H_SETS)).unwrap_or(0);
        let stride = usize::try_from(h(H_STRIDE)).unwrap_or(0);
        let row_bytes = h(H_ROW_BYTES);
        let geo = Geometry::new(sets, stride)
            .filter(|g| sets > 0 && g.total as u64 == h(H_TOTAL))
            .filter(|_| row_bytes > 0 && row_bytes.div_ceil(8) == stride as u64)
            .ok_or_else(|| foreign("inconsistent header (sets, stride, length)".into()))?;
        if len != geo.total as u64 * 8 {
            return Err(short(format!(
                "{len} bytes, header says {}",
                geo.total * 8
            )));
        }
        if let Some(id) = id {
            if [h(H_ID0), h(H_ID1)] != id.id || h(H_ROWS) != id.rows || row_bytes != id.row_bytes {
                return Err(foreign("belongs to another table".into()));
            }
        }
        drop(hmap);
        let map = SharedWords::map(&f, geo.total).map_err(|error| SegmentError::Os {
            path: path.to_path_buf(),
            what: "mmap",
            error,
        })?;
        Ok(Segment {
            map,
            path: path.to_path_buf(),
            geo,
            row_bytes: row_bytes as usize,
            file_id: (meta.dev(), meta.ino()),
            attach: None,
            remove_on_detach: false,
        })
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        &self.map.words()[i]
    }

    /// The segment file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Slots (rows the segment holds at most).
    pub fn slots(&self) -> usize {
        self.geo.slots()
    }

    /// Bytes of the segment.
    pub fn bytes(&self) -> u64 {
        self.geo.total as u64 * 8
    }

    /// True once another process shrank the segment file under this
    /// mapping (it now reads as zeros: nothing is served from it, and the
    /// next gather attaches a new segment).
    pub fn lost(&self) -> bool {
        self.map.lost()
    }

    /// True once `pleio cache rm` marked the segment removed.
    pub fn removed(&self) -> bool {
        self.word(H_REMOVED).load(Ordering::Acquire) != 0
    }

    /// Marks the segment removed (attached processes move on at their next
    /// gather) and unlinks it.
    pub fn remove(&self) -> std::io::Result<()> {
        self.word(H_REMOVED).store(1, Ordering::Release);
        std::fs::remove_file(&self.path)
    }

    /// Takes an entry of the attach table (a free one or a dead process's).
    fn register(&mut self) {
        let pid = u64::from(crate::sys::pid());
        for k in 0..ATTACH_SLOTS {
            let w = self.word(H_ATTACH + k);
            let cur = w.load(Ordering::Acquire);
            let free = cur == 0 || !shm::process_alive(pid_of(cur));
            if free && w.compare_exchange(cur, pid, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                self.attach = Some(k);
                return;
            }
        }
    }

    /// Live attached processes.
    pub fn attached(&self) -> Vec<u32> {
        (0..ATTACH_SLOTS)
            .map(|k| pid_of(self.word(H_ATTACH + k).load(Ordering::Acquire)))
            .filter(|&p| p != 0 && shm::process_alive(p))
            .collect()
    }

    /// The counters.
    pub fn stats(&self) -> SegmentStats {
        let c = |i| self.word(i).load(Ordering::Relaxed);
        SegmentStats {
            hits: c(C_HITS),
            misses: c(C_MISSES),
            reads: c(C_READS),
            bytes_read: c(C_BYTES),
            evictions: c(C_EVICTIONS),
            waits: c(C_WAITS),
            reclaims: c(C_RECLAIMS),
            uncached: c(C_UNCACHED),
        }
    }

    /// Adds a gather's counts to the counters.
    pub fn count(&self, d: SegmentStats) {
        for (i, v) in [
            (C_HITS, d.hits),
            (C_MISSES, d.misses),
            (C_READS, d.reads),
            (C_BYTES, d.bytes_read),
            (C_EVICTIONS, d.evictions),
            (C_WAITS, d.waits),
            (C_RECLAIMS, d.reclaims),
            (C_UNCACHED, d.uncached),
        ] {
            if v != 0 {
                self.word(i).fetch_add(v, Ordering::Relaxed);
            }
        }
    }

    /// What `pleio cache ls` shows.
    pub fn info(&self) -> SegmentInfo {
        let h = |i: usize| self.word(i).load(Ordering::Relaxed);
        let n = (h(H_LABEL) as usize).min(LABEL_BYTES);
        let mut label = Vec::with_capacity(n);
        for k in 0..n.div_ceil(8) {
            label.extend_from_slice(&h(H_LABEL + 1 + k).to_le_bytes());
        }
        label.truncate(n);
        let resident = (0..self.slots())
            .filter(|&s| self.state(s).load(Ordering::Relaxed) == READY)
            .count() as u64;
        SegmentInfo {
            path: self.path.clone(),
            bytes: self.bytes(),
            budget: h(H_BUDGET),
            slots: self.slots() as u64,
            resident,
            row_bytes: self.row_bytes as u64,
            rows: h(H_ROWS),
            label: String::from_utf8_lossy(&label).into_owned(),
            attached: self.attached(),
            stats: self.stats(),
        }
    }

    /// `slot`'s seqlock version (odd while its payload is written).
    fn version(&self, slot: usize) -> &AtomicU64 {
        self.word(self.slot_at(slot))
    }

    /// `slot`'s tag: its row id + 1 (0: none), in the tag line of its set.
    fn tag(&self, slot: usize) -> &AtomicU64 {
        self.word(self.geo.tags_of(slot / WAYS) + slot % WAYS)
    }

    /// `slot`'s state (free, being filled, ready, or a claimant's token).
    fn state(&self, slot: usize) -> &AtomicU64 {
        self.word(self.slot_at(slot) + 1)
    }

    /// `slot`'s reference bit for the clock sweep.
    fn referenced(&self, slot: usize) -> &AtomicU64 {
        self.word(self.slot_at(slot) + 2)
    }

    /// The first word of `slot` in the slot area.
    fn slot_at(&self, slot: usize) -> usize {
        self.geo.tags_of(slot / WAYS) + WAYS + slot % WAYS * self.geo.slot
    }

    fn payload(&self, slot: usize) -> &[AtomicU64] {
        let at = self.slot_at(slot) + SLOT_META;
        &self.map.words()[at..at + self.geo.stride_words]
    }

    /// Copies `slot`'s payload to `dst` (relaxed loads; whole words first,
    /// so the copies have a constant length).
    fn copy_out(&self, slot: usize, dst: &mut [u8]) {
        let words = self.payload(slot);
        let at = dst.len() / 8;
        let mut full = dst.chunks_exact_mut(8);
        for (w, d) in words.iter().zip(&mut full) {
            d.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        let tail = full.into_remainder();
        if !tail.is_empty() {
            if let Some(w) = words.get(at) {
                let b = w.load(Ordering::Relaxed).to_le_bytes();
                tail.copy_from_slice(&b[..tail.len()]);
            }
        }
    }

    /// Reads `row` from `slot` if it holds it, consistently (seqlock).
    /// `None`: the slot does not hold the row (now).
    fn read_slot(&self, slot: usize, row: u64, dst: &mut [u8]) -> Option<()> {
        let v = self.version(slot);
        for _ in 0..READ_TRIES {
            let v1 = v.load(Ordering::Acquire);
            if v1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            if self.state(slot).load(Ordering::Relaxed) != READY
                || self.tag(slot).load(Ordering::Relaxed) != row.wrapping_add(1)
            {
                return None;
            }
            self.copy_out(slot, dst);
            fence(Ordering::Acquire);
            if v.load(Ordering::Relaxed) == v1 {
                let r = self.referenced(slot);
                if r.load(Ordering::Relaxed) == 0 {
                    r.store(1, Ordering::Relaxed);
                }
                return Some(());
            }
        }
        None
    }

    /// Software-prefetches the tag line of `row`'s set (where
    /// [`Segment::find`] looks), for a find a few rows later.
    #[inline]
    pub fn prefetch_set(&self, row: u64) {
        self.map
            .prefetch(self.geo.tags_of(set_of(row, self.geo.sets)), WAYS);
    }

    /// Software-prefetches what [`Segment::probe`] of `row` reads: its
    /// set's tag line and claim lock, and each way's state and reference
    /// words, which the clock sweep of a miss reads one after another
    /// (a segment on huge pages: probing 20% of a cold batch's client CPU
    /// before, 10% after; on 4 KiB pages the prefetches wait on the same
    /// TLB misses the loads did, and it is about even).
    #[inline]
    pub fn prefetch_probe(&self, row: u64) {
        let set = set_of(row, self.geo.sets);
        self.map.prefetch(self.geo.tags_of(set), WAYS);
        self.map.prefetch(self.geo.sets_at + set * 2, 2);
        for s in set * WAYS..(set + 1) * WAYS {
            self.map.prefetch(self.slot_at(s) + 1, 2);
        }
    }

    /// Software-prefetches what [`Segment::publish`] of `slot` writes: its
    /// state, version and payload (a slot claimed a batch ago has long left
    /// the CPU's caches and TLB once the batch's reads are done).
    #[inline]
    pub fn prefetch_slot(&self, slot: usize) {
        if slot < self.slots() {
            self.map.prefetch(self.slot_at(slot), self.geo.slot);
        }
    }

    /// The slots of `row`'s set whose tag is `row`'s (not yet checked to
    /// be ready).
    fn tagged(&self, row: u64) -> impl Iterator<Item = usize> + '_ {
        let base = set_of(row, self.geo.sets) * WAYS;
        let want = row.wrapping_add(1);
        (base..base + WAYS).filter(move |&s| self.tag(s).load(Ordering::Relaxed) == want)
    }

    /// The slot whose row id is `row`'s, if any (not yet checked to be
    /// ready), with its payload software-prefetched for a
    /// [`Segment::read`] a few rows later.
    #[inline]
    pub fn find(&self, row: u64) -> Option<usize> {
        let s = self.tagged(row).next()?;
        self.map.prefetch(self.slot_at(s), self.geo.slot);
        Some(s)
    }

    /// Copies `row` out of `slot` (from [`Segment::find`]) if the slot
    /// still holds it, ready and consistent; false otherwise (then
    /// [`Segment::probe`] it).
    pub fn read(&self, slot: usize, row: u64, dst: &mut [u8]) -> bool {
        slot < self.slots() && self.read_slot(slot, row, dst).is_some()
    }

    /// Looks `row` up without any lock or system call.
    pub fn lookup(&self, row: u64, dst: &mut [u8]) -> bool {
        self.tagged(row).any(|s| self.read_slot(s, row, dst).is_some())
    }

    /// Looks `row` up, and on a miss claims a slot for it (one claim per
    /// row machine-wide: decided under the set's claim lock) or reports
    /// the slot another process is filling it in.
    pub fn probe(&self, row: u64, dst: &mut [u8], evicted: &mut u64) -> Probe {
        if self.lookup(row, dst) {
            return Probe::Hit;
        }
        let set = set_of(row, self.geo.sets);
        let lock = self.word(self.geo.sets_at + set * 2);
        let held = self.lock(lock);
        let r = self.probe_locked(set, row, dst, evicted);
        if held {
            let _ = lock.compare_exchange(me(), 0, Ordering::Release, Ordering::Relaxed);
        }
        r
    }

    /// Takes a set's claim lock: waits for a live holder up to
    /// [`LOCK_WAIT`], takes it from a dead one. False when it proceeds
    /// without it.
    fn lock(&self, lock: &AtomicU64) -> bool {
        let me = me();
        // Read the clock only once the lock is contended (a probe takes an
        // uncontended lock: no clock read per row).
        let mut start = None;
        let mut spins = 0u32;
        loop {
            let cur = lock.load(Ordering::Relaxed);
            if cur == 0 || (spins > 64 && spins.is_multiple_of(64) && !shm::process_alive(pid_of(cur))) {
                if lock
                    .compare_exchange(cur, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return true;
                }
                continue;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
                if start.get_or_insert_with(Instant::now).elapsed() > LOCK_WAIT {
                    return false;
                }
            }
        }
    }

    fn probe_locked(&self, set: usize, row: u64, dst: &mut [u8], evicted: &mut u64) -> Probe {
        let base = set * WAYS;
        let want = row.wrapping_add(1);
        for s in base..base + WAYS {
            if self.tag(s).load(Ordering::Acquire) != want {
                continue;
            }
            let st = self.state(s).load(Ordering::Acquire);
            match st & KIND {
                READY if self.read_slot(s, row, dst).is_some() => return Probe::Hit,
                FILLING if shm::process_alive(pid_of(st)) => {
                    return Probe::Wait { slot: s, state: st };
                }
                _ => {}
            }
        }
        // CLOCK over the set from its hand: take an empty, foreign or dead
        // writer's slot, or an unreferenced row (clearing references on the
        // way); two passes.
        let hand = self.word(self.geo.sets_at + set * 2 + 1);
        let start = hand.load(Ordering::Relaxed) as usize % WAYS;
        for k in 0..2 * WAYS {
            let s = base + (start + k) % WAYS;
            let st = self.state(s).load(Ordering::Acquire);
            let take = match st & KIND {
                EMPTY => true,
                READY if st == READY => {
                    let r = self.referenced(s);
                    if r.load(Ordering::Relaxed) == 0 {
                        true
                    } else {
                        r.store(0, Ordering::Relaxed);
                        false
                    }
                }
                FILLING => !shm::process_alive(pid_of(st)),
                // Garbage: nobody can be using it.
                _ => true,
            };
            if take && self.claim(s, st, row) {
                hand.store(((start + k + 1) % WAYS) as u64, Ordering::Relaxed);
                if st == READY {
                    *evicted += 1;
                }
                return Probe::Claimed(s);
            }
        }
        Probe::Uncached
    }

    /// Takes `slot` (state `seen`) for `row`: the version goes odd before
    /// the row id changes, so no reader takes the old bytes for the new row.
    fn claim(&self, slot: usize, seen: u64, row: u64) -> bool {
        let st = self.state(slot);
        if st
            .compare_exchange(seen, FILLING | me(), Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        let v = self.version(slot);
        let cur = v.load(Ordering::Acquire);
        if cur & 1 == 0 {
            v.store(cur.wrapping_add(1), Ordering::Relaxed);
        }
        fence(Ordering::Release);
        self.referenced(slot).store(0, Ordering::Relaxed);
        self.tag(slot).store(row.wrapping_add(1), Ordering::Release);
        true
    }

    /// Stores `bytes` in `slot` (claimed by this thread) and makes it
    /// readable. False if the slot is no longer ours (never, unless another
    /// process wrote garbage into the segment).
    pub fn publish(&self, slot: usize, bytes: &[u8]) -> bool {
        let st = self.state(slot);
        if st.load(Ordering::Acquire) != FILLING | me() {
            return false;
        }
        for (w, c) in self.payload(slot).iter().zip(bytes.chunks(8)) {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            w.store(u64::from_le_bytes(b), Ordering::Relaxed);
        }
        let v = self.version(slot);
        let cur = v.load(Ordering::Relaxed);
        v.store((cur | 1).wrapping_add(1), Ordering::Release);
        st.compare_exchange(FILLING | me(), READY, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    /// Empties every ready slot (benchmarks' cold runs; `pleio cache`).
    /// Slots being filled are left to their writers.
    pub fn clear(&self) {
        for s in 0..self.slots() {
            if self.state(s).load(Ordering::Acquire) == READY && self.claim(s, READY, u64::MAX) {
                self.abandon(s);
            }
        }
    }

    /// Gives back a claimed `slot` without a row.
    pub fn abandon(&self, slot: usize) {
        let st = self.state(slot);
        if st.load(Ordering::Acquire) != FILLING | me() {
            return;
        }
        self.tag(slot).store(0, Ordering::Relaxed);
        let v = self.version(slot);
        let cur = v.load(Ordering::Relaxed);
        v.store((cur | 1).wrapping_add(1), Ordering::Release);
        let _ = st.compare_exchange(FILLING | me(), EMPTY, Ordering::Release, Ordering::Relaxed);
    }

    /// Waits for the process filling `slot` (seen in `state`) with `row`:
    /// `Hit` once the row is there, `Claimed` if its writer died (the slot
    /// is now ours), `Uncached` after [`FILL_WAIT`] or if the slot moved on
    /// to something else (the caller probes again or reads the row).
    /// Polls with sleeps of `nap`, doubled after each up to 1 ms; a gather
    /// waiting for many rows passes the same `nap` (starting at
    /// [`FIRST_NAP`]) to every wait, so the rows that follow a slow one
    /// do not restart at short sleeps that wake the waiter thousands of
    /// times, taking the CPU from the process reading the rows.
    pub fn wait(
        &self,
        slot: usize,
        state: u64,
        row: u64,
        dst: &mut [u8],
        reclaimed: &mut u64,
        nap: &mut Duration,
    ) -> Probe {
        let start = Instant::now();
        loop {
            let st = self.state(slot).load(Ordering::Acquire);
            if st == READY {
                return if self.read_slot(slot, row, dst).is_some() {
                    Probe::Hit
                } else {
                    Probe::Uncached
                };
            }
            if st != state {
                return Probe::Uncached;
            }
            if !shm::process_alive(pid_of(st)) {
                if self.claim(slot, st, row) {
                    *reclaimed += 1;
                    return Probe::Claimed(slot);
                }
                continue;
            }
            if start.elapsed() > FILL_WAIT {
                return Probe::Uncached;
            }
            std::thread::sleep(*nap);
            *nap = (*nap * 2).min(Duration::from_millis(1));
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        let Some(k) = self.attach else { return };
        self.word(H_ATTACH + k).store(0, Ordering::Release);
        if self.remove_on_detach && self.attached().is_empty() && !self.removed() {
            // Only the file we mapped: a newer segment under the same name
            // is someone else's.
            if same_file(&self.path, self.file_id) {
                let _ = self.remove();
            }
        }
    }
}

/// `f`'s metadata, an error naming `path` if fstat fails.
fn fstat(f: &File, path: &Path) -> Result<std::fs::Metadata, SegmentError> {
    f.metadata().map_err(|error| SegmentError::Os {
        path: path.to_path_buf(),
        what: "fstat",
        error,
    })
}

/// True if `path` (not followed) is the file of device and inode `id`.
fn same_file(path: &Path, id: (u64, u64)) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == id)
}

/// True for the names [`Identity::file_name`] makes: the prefix and 32 hex
/// digits (not a segment being made, nor anything else named `pleio-*`).
fn is_segment_name(name: &str) -> bool {
    name.strip_prefix(PREFIX)
        .is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The segments in `dir` (entries named `pleio-` and 32 hex digits, not directories).
pub fn list(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if is_segment_name(&e.file_name().to_string_lossy()) && !e.file_type()?.is_dir() {
            v.push(e.path());
        }
    }
    v.sort();
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_fits_the_budget_and_rejects_nonsense() {
        for budget in [64u64 << 10, 1 << 20, 300_000_123] {
            for rb in [1usize, 8, 90, 4096, 8960] {
                let w = rb.div_ceil(8);
                let one = Geometry::new(1, w).unwrap().total as u64 * 8;
                let Some(g) = Geometry::for_budget(budget, w) else {
                    assert!(one > budget, "{budget} holds a set of {rb} B rows");
                    continue;
                };
                assert!(g.total as u64 * 8 <= budget);
                assert!(g.blocks_at.is_multiple_of(512) && g.blocks_at >= g.sets_at + 2 * g.sets);
                assert!(g.block.is_multiple_of(8) && g.block >= WAYS * (1 + g.slot));
                assert!(g.slot >= SLOT_META + w && (g.slot.is_multiple_of(8) || 8 % g.slot == 0));
                assert_eq!(g.total, g.blocks_at + g.sets * g.block);
            }
        }
        assert!(Geometry::for_budget(4096, 1024).is_none());
        assert!(Geometry::new(usize::MAX / 2, 8).is_none());
    }

    #[test]
    fn only_segment_names_are_listed() {
        let id = Identity {
            id: [1, u64::MAX],
            rows: 1,
            row_bytes: 1,
        };
        assert!(is_segment_name(&id.file_name()));
        for other in ["pleio-", "pleio-lead32", "pleio-fuzz-ple-store-1", ".pleio-0.1.2"] {
            assert!(!is_segment_name(other), "{other}");
        }
        assert!(!is_segment_name(&format!(".{}.1.2", id.file_name())));
    }

    #[test]
    fn sets_are_in_range() {
        for sets in [1usize, 3, 1000, 1 << 20] {
            for row in [0u64, 1, 77, u64::MAX] {
                assert!(set_of(row, sets) < sets);
            }
        }
    }
}
