//! Every reader configuration (engine, buffered or `O_DIRECT`, queue depth,
//! request size) on the same read lists must fill the staging buffer with
//! exactly the bytes of a plain read of the files, touch nothing else, read
//! a batch spread over several files as one batch, name the file and offset
//! when a file is too short, keep its queue depth, and work from 8 threads
//! at once. io_uring cases skip (with a printed reason) where the kernel or
//! sandbox refuses io_uring or the file system refuses `O_DIRECT`.
#![cfg(unix)]

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pleio::io::{Engine, IoError, Read, Reader, ReaderConfig};
use pleio_testkit::{skip, skip_case};

/// Deterministic pseudo-random numbers (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// 3 MiB + 1234 bytes (not a multiple of any block size) of seeded noise.
const FILE_LEN: usize = (3 << 20) + 1234;

/// A scratch directory on the build's disk (`O_DIRECT` is refused by the
/// tmpfs that is the default `TMPDIR` on several distributions).
fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in(pleio_testkit::disk_dir!()).unwrap()
}

/// A file `name` of `len` bytes of noise seeded by `seed`.
fn make_named(dir: &Path, name: &str, len: usize, seed: u64) -> (PathBuf, Vec<u8>) {
    let mut rng = Rng(seed);
    let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
    let path = dir.join(name);
    let mut f = File::create(&path).unwrap();
    f.write_all(&bytes).unwrap();
    f.sync_all().unwrap();
    (path, bytes)
}

fn make_file(dir: &Path, len: usize) -> (PathBuf, Vec<u8>) {
    make_named(dir, "data.bin", len, 0x9E37_79B9_7F4A_7C15)
}

/// Every reader configuration under test, with a name.
fn configs() -> Vec<(&'static str, ReaderConfig)> {
    let pread = ReaderConfig::new(Engine::Pread);
    let pool = ReaderConfig::new(Engine::Pool);
    let uring = ReaderConfig::new(Engine::Uring);
    vec![
        ("pread", pread),
        ("pool", pool),
        (
            // Tiny requests and no inline path: every read split and spread.
            "pool-small-pieces",
            ReaderConfig {
                queue_depth: 4,
                inline_below: 0,
                max_read_bytes: 1000,
                ..pool
            },
        ),
        (
            "pool-direct",
            ReaderConfig {
                queue_depth: 8,
                direct: true,
                ..pool
            },
        ),
        ("uring", uring),
        (
            "uring-qd1-small-reads",
            ReaderConfig {
                queue_depth: 1,
                max_read_bytes: 777,
                ..uring
            },
        ),
        (
            "uring-direct",
            ReaderConfig {
                direct: true,
                ..uring
            },
        ),
        (
            "uring-direct-qd3-small-reads",
            ReaderConfig {
                queue_depth: 3,
                direct: true,
                max_read_bytes: 4096,
                ..uring
            },
        ),
    ]
}

/// Every reader configuration over `paths` that can run here, with its
/// name; io_uring and `O_DIRECT` ones are left out, with a printed reason,
/// where unavailable.
fn readers(paths: &[&Path]) -> Vec<(&'static str, Reader)> {
    let mut out = Vec::new();
    for (name, cfg) in configs() {
        match Reader::open(paths, cfg) {
            Ok(r) => out.push((name, r)),
            Err(e @ (IoError::UringUnavailable(_) | IoError::DirectUnsupported { .. })) => {
                skip_case!("{name}: {e}")
            }
            Err(e) => panic!("{name}: {e}"),
        }
    }
    out
}

/// Staging as a plain copy from `files` would fill it; untouched bytes keep
/// `FILL`.
const FILL: u8 = 0xA5;

fn expected(reads: &[Read], files: &[&[u8]], staging_len: usize) -> Vec<u8> {
    let mut out = vec![FILL; staging_len];
    for r in reads {
        let f = r.offset as usize;
        out[r.dst..r.dst + r.len].copy_from_slice(&files[r.file][f..f + r.len]);
    }
    out
}

/// Reads of file 0 placed back to back in staging, in the given order.
fn packed(extents: &[(u64, usize)]) -> Vec<Read> {
    let mut dst = 0;
    extents
        .iter()
        .map(|&(off, len)| {
            dst += len;
            Read::new(0, off, len, dst - len)
        })
        .collect()
}

/// The read lists every configuration must agree on, in file 0.
fn cases(file: &[u8]) -> Vec<(&'static str, Vec<Read>)> {
    let len = file.len() as u64;
    let mut rng = Rng(42);
    // Random offsets and lengths, spaced out in staging (gaps must stay FILL).
    let mut offs: Vec<u64> = (0..300).map(|_| rng.below(len - 400)).collect();
    offs.sort_unstable();
    let mut dst = 0usize;
    let random: Vec<Read> = offs
        .iter()
        .map(|&o| {
            let n = 1 + rng.below(300) as usize;
            let r = Read::new(0, o, n, dst + 3);
            dst += n + 3 + rng.below(5) as usize;
            r
        })
        .collect();
    // Random rows of a 90-byte table starting at an odd offset, in random
    // order; 100 adjacent rows as one read.
    let rows: Vec<(u64, usize)> = (0..500)
        .map(|_| (77 + rng.below((len - 77) / 90) * 90, 90))
        .collect();
    vec![
        ("random", random),
        ("rows", packed(&rows)),
        (
            "adjacent rows as one read",
            packed(&[(77 + 1000 * 90, 100 * 90), (77 + 5000 * 90, 3 * 90)]),
        ),
        ("read ending at EOF", packed(&[(0, 10), (len - 4097, 4097)])),
        ("last byte", packed(&[(len - 1, 1)])),
        ("empty", Vec::new()),
        ("zero-length reads", packed(&[(5, 0), (6, 3), (len, 0)])),
        ("one huge read", packed(&[(0, file.len())])),
        (
            "overlapping in the file",
            packed(&[(100, 5000), (200, 10), (4000, 9000)]),
        ),
    ]
}

fn staging_len(reads: &[Read]) -> usize {
    reads.iter().map(|r| r.dst + r.len).max().unwrap_or(0)
}

#[test]
fn every_configuration_matches_a_plain_read() {
    let dir = scratch();
    let (path, file) = make_file(dir.path(), FILE_LEN);
    let readers = readers(&[&path]);
    for (case, reads) in cases(&file) {
        let len = staging_len(&reads) + 17;
        let want = expected(&reads, &[&file], len);
        for (name, r) in &readers {
            let mut staging = vec![FILL; len];
            let stats = r
                .read(&reads, &mut staging)
                .unwrap_or_else(|e| panic!("{name} on {case}: {e}"));
            assert!(staging == want, "{name} on {case}: staging differs");
            if reads.iter().any(|r| r.len > 0) {
                assert!(stats.requests > 0 && stats.bytes > 0, "{name} on {case}");
            }
        }
    }
}

/// `r.read_each` of `reads`: checks every read is handed over once, in
/// order, with the bytes it landed in `staging`, and returns the staging.
fn read_each_checked(name: &str, r: &Reader, reads: &[Read], len: usize, align: usize) -> Vec<u8> {
    let mut raw = vec![FILL; len + align];
    let skip = raw.as_ptr().align_offset(align);
    let staging = &mut raw[skip..skip + len];
    let mut seen: Vec<(usize, Vec<u8>)> = Vec::new();
    r.read_each(reads, staging, &mut |i, bytes| {
        seen.push((i, bytes.to_vec()))
    })
    .unwrap_or_else(|e| panic!("{name}: read_each: {e}"));
    let order: Vec<usize> = seen.iter().map(|s| s.0).collect();
    assert_eq!(
        order,
        (0..reads.len()).collect::<Vec<_>>(),
        "{name}: handed over out of order"
    );
    for ((i, bytes), rd) in seen.iter().zip(reads) {
        assert!(
            bytes[..] == staging[rd.dst..rd.dst + rd.len],
            "{name}: read {i}'s bytes"
        );
    }
    staging.to_vec()
}

#[test]
fn read_each_hands_over_every_read_once_in_order_with_its_bytes() {
    let dir = scratch();
    let (path, file) = make_file(dir.path(), FILE_LEN);
    let readers = readers(&[&path]);
    // The unaligned cases (read as covering blocks where `O_DIRECT`), and
    // 4096-aligned reads in aligned staging: in place even with `O_DIRECT`,
    // handed over as they complete on the ring (one of 2 MiB, past the
    // ring engine's 1 MiB cut, stays one request).
    let mut rng = Rng(99);
    let mut pages: Vec<u64> = (0..400)
        .map(|_| rng.below(FILE_LEN as u64 / 4096 - 600))
        .collect();
    pages.sort_unstable();
    pages.dedup();
    let mut aligned: Vec<(u64, usize)> = pages
        .iter()
        .map(|&p| (p * 4096, 4096 * (1 + p as usize % 3)))
        .collect();
    aligned.push((0, 2 << 20));
    let mut all = cases(&file);
    all.push(("aligned pages", packed(&aligned)));
    for (case, reads) in all {
        let len = staging_len(&reads) + 4096;
        let want = expected(&reads, &[&file], len);
        for (name, r) in &readers {
            let got = read_each_checked(&format!("{name} on {case}"), r, &reads, len, 4096);
            assert!(got == want, "{name} on {case}: staging differs");
        }
    }
}

#[test]
fn a_table_split_over_three_files_is_one_batch_equal_to_pread() {
    // Three files of different lengths; reads of all three interleaved in
    // one batch (not grouped by file), rows of a 97-byte table at an odd
    // offset in each, some adjacent, one reaching each file's end.
    let dir = scratch();
    let files: Vec<(PathBuf, Vec<u8>)> = [(FILE_LEN, 1), (FILE_LEN / 3 + 5, 2), (700_001, 3)]
        .iter()
        .enumerate()
        .map(|(i, &(len, seed))| make_named(dir.path(), &format!("part-{i}.bin"), len, seed))
        .collect();
    let paths: Vec<&Path> = files.iter().map(|f| f.0.as_path()).collect();
    let bytes: Vec<&[u8]> = files.iter().map(|f| f.1.as_slice()).collect();
    let mut rng = Rng(7);
    let mut reads = Vec::new();
    let mut dst = 0usize;
    for i in 0..900usize {
        let k = rng.below(3) as usize;
        let len = bytes[k].len() as u64;
        let (offset, n) = match i % 100 {
            0 => (len - 97, 97),
            1 => (33 + 20 * 97, 40 * 97),
            _ => (33 + rng.below((len - 33) / 97) * 97, 97),
        };
        reads.push(Read::new(k, offset, n, dst));
        dst += n + (i % 3);
    }
    let want = expected(&reads, &bytes, dst);
    let pread = Reader::open(&paths, ReaderConfig::new(Engine::Pread)).unwrap();
    let mut by_pread = vec![FILL; dst];
    pread.read(&reads, &mut by_pread).unwrap();
    assert!(by_pread == want, "pread differs from the files");
    for (name, r) in readers(&paths) {
        assert_eq!(r.files(), 3);
        let mut staging = vec![FILL; dst];
        let stats = r
            .read(&reads, &mut staging)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(staging == by_pread, "{name}: differs from pread");
        // One batch: the ring keeps reads of different files in flight
        // together, up to its depth.
        if name == "uring" || name == "uring-direct" {
            assert_eq!(stats.peak_in_flight, 64, "{name}: {stats:?}");
        }
    }
}

#[test]
fn queue_depth_is_respected() {
    let dir = scratch();
    let (a, _) = make_named(dir.path(), "a.bin", FILE_LEN, 1);
    let (b, _) = make_named(dir.path(), "b.bin", FILE_LEN, 2);
    // 200 reads of one page each, alternating between the files, far apart
    // (no merging of O_DIRECT blocks).
    let reads: Vec<Read> = (0..200u64)
        .map(|i| Read::new((i % 2) as usize, (i / 2) * 8192, 4096, i as usize * 4096))
        .collect();
    let mut staging = vec![0u8; 200 * 4096];
    for qd in [1u32, 3, 16] {
        for (engine, direct) in [
            (Engine::Uring, false),
            (Engine::Uring, true),
            (Engine::Pool, false),
        ] {
            let cfg = ReaderConfig {
                queue_depth: qd,
                direct,
                inline_below: 0,
                ..ReaderConfig::new(engine)
            };
            let r = match Reader::open(&[&a, &b], cfg) {
                Ok(r) => r,
                Err(e @ (IoError::UringUnavailable(_) | IoError::DirectUnsupported { .. })) => {
                    skip_case!("{engine:?} direct={direct}: {e}");
                    continue;
                }
                Err(e) => panic!("{e}"),
            };
            let stats = r.read(&reads, &mut staging).unwrap();
            let peak = stats.peak_in_flight;
            assert!(
                peak >= 1 && peak <= u64::from(qd),
                "{engine:?} QD{qd}: {stats:?}"
            );
            if engine == Engine::Uring {
                // The ring is filled to its depth (its size is rounded up to
                // a power of two, the depth is not).
                assert_eq!(peak, u64::from(qd), "{engine:?} QD{qd}");
            }
        }
    }
    let pread = Reader::open(&[&a, &b], ReaderConfig::new(Engine::Pread)).unwrap();
    assert_eq!(pread.read(&reads, &mut staging).unwrap().peak_in_flight, 1);
    // A batch smaller than the depth has every read in flight at once.
    if let Ok(r) = Reader::open(&[&a, &b], ReaderConfig::new(Engine::Uring)) {
        assert_eq!(
            r.read(&reads[..10], &mut staging).unwrap().peak_in_flight,
            10
        );
    }
}

#[test]
fn bad_batches_are_errors() {
    let dir = scratch();
    let (path, _) = make_file(dir.path(), 10_000);
    for (name, r) in readers(&[&path]) {
        let mut staging = vec![0u8; 150];
        match r.read(&packed(&[(0, 100), (500, 100)]), &mut staging) {
            Err(IoError::Staging {
                need: 200,
                got: 150,
            }) => {}
            other => panic!("{name}: short staging gave {other:?}"),
        }
        let bad = [
            vec![Read::new(1, 0, 10, 0)],
            vec![Read::new(0, 0, 10, 20), Read::new(0, 0, 10, 25)],
            vec![Read {
                need: 11,
                ..Read::new(0, 0, 10, 0)
            }],
        ];
        for reads in bad {
            match r.read(&reads, &mut staging) {
                Err(IoError::BadRead { .. }) => {}
                other => panic!("{name}: {reads:?} gave {other:?}"),
            }
        }
    }
}

#[test]
fn a_truncated_file_is_an_error_naming_it_and_the_offset() {
    let dir = scratch();
    let (first, _) = make_named(dir.path(), "first.bin", FILE_LEN, 1);
    let (path, _) = make_named(dir.path(), "second.bin", FILE_LEN, 2);
    // Readers opened on the full files; the second then shrinks under them.
    let readers = readers(&[&first, &path]);
    let new_len = 1_000_003u64;
    File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(new_len)
        .unwrap();
    let of = |k: usize, extents: &[(u64, usize)]| -> Vec<Read> {
        packed(extents)
            .into_iter()
            .map(|r| Read { file: k, ..r })
            .collect()
    };
    // One read crosses the new end; one starts beyond it. Reads of the
    // intact first file at the same offsets come first.
    let crossing: Vec<Read> = [(0, 100), (new_len - 50, 100)]
        .iter()
        .flat_map(|&e| of(0, &[e]).into_iter().chain(of(1, &[e])))
        .enumerate()
        .map(|(i, r)| Read { dst: i * 100, ..r })
        .collect();
    let beyond = of(1, &[(10, 10), (2_000_000, 10)]);
    for (name, r) in &readers {
        let mut staging = vec![0u8; 400];
        match r.read(&crossing, &mut staging) {
            Err(e @ IoError::UnexpectedEof { .. }) => {
                let IoError::UnexpectedEof {
                    path: p,
                    offset,
                    end,
                } = &e
                else {
                    unreachable!()
                };
                assert_eq!(p, &path, "{name}");
                assert_eq!(*offset, new_len, "{name}");
                assert!(*end > new_len, "{name}: end {end}");
                let msg = e.to_string();
                assert!(msg.contains(&new_len.to_string()), "{msg}");
                assert!(msg.contains(&path.display().to_string()), "{msg}");
                assert_eq!(e.path(), Some(path.as_path()));
                assert_eq!(e.offset(), Some(new_len));
            }
            other => panic!("{name}: crossing read gave {other:?}"),
        }
        match r.read(&beyond, &mut staging) {
            Err(IoError::UnexpectedEof {
                path: p, offset, ..
            }) => {
                // The real end of the file, not where the failing read (or
                // its aligned block) starts.
                assert_eq!((p, offset), (path.clone(), new_len), "{name}");
            }
            other => panic!("{name}: read beyond EOF gave {other:?}"),
        }
        // read_each fails the same way; what it handed over first is right.
        let mut handed = Vec::new();
        match r.read_each(&crossing, &mut staging, &mut |i, b| {
            handed.push((i, b.to_vec()))
        }) {
            Err(IoError::UnexpectedEof {
                path: p, offset, ..
            }) => {
                assert_eq!((p, offset), (path.clone(), new_len), "{name}");
            }
            other => panic!("{name}: read_each of a crossing read gave {other:?}"),
        }
        for (k, (i, b)) in handed.iter().enumerate() {
            assert_eq!(*i, k, "{name}: in order");
            let rd = &crossing[*i];
            let src = if rd.file == 0 { &first } else { &path };
            let want = &std::fs::read(src).unwrap()[rd.offset as usize..][..rd.len];
            assert!(
                b[..] == want[..],
                "{name}: read {i} handed over wrong bytes"
            );
        }
        // The reader is still usable afterwards.
        let ok = of(1, &[(0, 10), (new_len - 10, 10)]);
        r.read(&ok, &mut staging)
            .unwrap_or_else(|e| panic!("{name} after error: {e}"));
    }
}

#[test]
fn eight_threads_share_one_reader() {
    let dir = scratch();
    let (a, fa) = make_named(dir.path(), "a.bin", FILE_LEN, 1);
    let (b, fb) = make_named(dir.path(), "b.bin", FILE_LEN / 2, 2);
    let files: Arc<[Vec<u8>; 2]> = Arc::new([fa, fb]);
    for (name, r) in readers(&[&a, &b]) {
        std::thread::scope(|scope| {
            for t in 0..8u64 {
                let (r, files) = (&r, &files);
                scope.spawn(move || {
                    let bytes: [&[u8]; 2] = [&files[0], &files[1]];
                    let mut rng = Rng(1000 + t);
                    for _ in 0..20 {
                        let n = 1 + rng.below(200) as usize;
                        let reads: Vec<Read> = (0..n)
                            .map(|i| {
                                let k = rng.below(2) as usize;
                                let row = rng.below((bytes[k].len() as u64 - 5) / 131);
                                Read::new(k, 5 + row * 131, 131, i * 131)
                            })
                            .collect();
                        let mut staging = vec![FILL; n * 131];
                        r.read(&reads, &mut staging).unwrap();
                        let want = expected(&reads, &bytes, n * 131);
                        assert!(staging == want, "{name} thread {t}");
                    }
                });
            }
        });
    }
}

#[test]
fn direct_extent_reads_for_the_device_floor() {
    let dir = scratch();
    let (path, _) = make_file(dir.path(), FILE_LEN);
    let cfg = ReaderConfig {
        direct: true,
        ..ReaderConfig::new(Engine::Uring)
    };
    let b = match Reader::open(&[&path], cfg) {
        Ok(b) => b,
        Err(e @ (IoError::UringUnavailable(_) | IoError::DirectUnsupported { .. })) => {
            skip!("{e}");
        }
        Err(e) => panic!("{e}"),
    };
    let align = b.alignment(0).unwrap();
    assert!(align.is_power_of_two() && align <= 4096);
    let page = |p: u64, n: u64| (0, p * 4096..(p + n) * 4096);
    let last = (FILE_LEN / 4096) as u64; // the partial last page
                                         // One request per extent, however many pages it covers; the last
                                         // extent reaches past the end of the file and reads what it has.
    let extents = vec![
        page(0, 1),
        page(3, 2),
        page(7, 3),
        page(100, 1),
        page(last, 1),
    ];
    let stats = b.discard(&extents).unwrap();
    assert_eq!(stats.requests, extents.len() as u64);
    assert_eq!(stats.bytes, 8 * 4096);
    // An extent longer than max_read_bytes is split.
    let small = Reader::open(
        &[&path],
        ReaderConfig {
            max_read_bytes: 8192,
            ..cfg
        },
    )
    .unwrap();
    assert_eq!(small.discard(&[page(10, 5)]).unwrap().requests, 3);
    assert_eq!(b.discard(&[page(2, 0)]).unwrap().requests, 0);
    match b.discard(&[page(1, 1), page(last + 1, 1)]) {
        Err(IoError::UnexpectedEof { path: p, .. }) => assert_eq!(p, path),
        other => panic!("extent past EOF gave {other:?}"),
    }
    match b.discard(&[(0, 100..4196)]) {
        Err(IoError::Misaligned { offset: 100, .. }) => {}
        other => panic!("unaligned extent gave {other:?}"),
    }

    // More than the 32 MiB read in one go: rounds, every request made.
    let sparse = dir.path().join("sparse.bin");
    File::create(&sparse).unwrap().set_len(48 << 20).unwrap();
    let mib = |m: u64| m << 20;
    let extents: Vec<_> = (0..10).map(|i| (1, mib(4 * i)..mib(4 * i + 4))).collect();
    let two = Reader::open(&[&path, &sparse], cfg).unwrap();
    let stats = two.discard(&extents).unwrap();
    assert_eq!((stats.requests, stats.bytes), (40, mib(40)));

    // Several files through one ring: one request per extent, each file's
    // length its own (the 48 MiB file's page 2000 exists, the small
    // file's does not), and a file index past the list is an error.
    let extents = vec![page(3, 2), (1, 2000 * 4096..2004 * 4096), page(last, 1)];
    let stats = two.discard(&extents).unwrap();
    assert_eq!(stats.requests, 3);
    assert_eq!(stats.bytes, (2 + 4 + 1) * 4096);
    match two.discard(&[page(2000, 1)]) {
        Err(IoError::UnexpectedEof { path: p, .. }) => assert_eq!(p, path),
        other => panic!("page 2000 of the small file gave {other:?}"),
    }
    assert!(matches!(
        two.discard(&[(2, 0..4096)]),
        Err(IoError::BadRead { .. })
    ));
}

#[test]
fn uring_probe_reports_clearly() {
    match Reader::probe_uring() {
        Ok(()) => {}
        Err(e) => {
            assert!(matches!(e, IoError::UringUnavailable(_)), "{e:?}");
            assert!(e.to_string().starts_with("io_uring is unavailable"));
            skip_case!("io_uring unavailable here: {e}");
        }
    }
}

/// Cold random page reads on a big file, for the report (no assertions on
/// time). Run with
/// `cargo test --release -p pleio --test io_backends -- --ignored --nocapture measure`
/// (`PLEIO_IO_FILE` picks the file, default `/work/big.gguf`).
mod measure {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant};

    const PAGE: usize = 4096;

    /// Drop `file`'s cached pages. This process holds no mapping of it, so
    /// `POSIX_FADV_DONTNEED` can drop every clean page (pages mapped by other
    /// processes stay; [`resident`] checks).
    fn evict(file: &File) {
        // SAFETY: plain syscall on an open fd; no memory is passed.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(
            rc,
            0,
            "posix_fadvise: {}",
            std::io::Error::from_raw_os_error(rc)
        );
    }

    /// How many of `pages` are in the page cache (`mincore` through a
    /// temporary mapping that is never touched, so it faults nothing in).
    fn resident(file: &File, len: u64, pages: &[u64]) -> usize {
        // SAFETY: a fresh read-only shared mapping of an open file; we never
        // dereference it, only pass it to mincore, and unmap it before return.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            let mut vec = vec![0u8; (len as usize).div_ceil(PAGE)];
            let rc = libc::mincore(p, len as usize, vec.as_mut_ptr());
            libc::munmap(p, len as usize);
            assert_eq!(rc, 0);
            pages
                .iter()
                .filter(|&&pg| vec[pg as usize] & 1 != 0)
                .count()
        }
    }

    /// Bytes this process has caused to be read from storage.
    fn read_bytes() -> u64 {
        std::fs::read_to_string("/proc/self/io")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| {
                        l.strip_prefix("read_bytes: ")
                            .map(|v| v.trim().parse().ok())
                    })
                    .flatten()
            })
            .unwrap_or(0)
    }

    fn random_pages(rng: &mut Rng, n: usize, n_pages: u64) -> Vec<u64> {
        let mut set = std::collections::BTreeSet::new();
        while set.len() < n {
            set.insert(rng.below(n_pages));
        }
        set.into_iter().collect()
    }

    /// Reads the given pages, staging in the given buffer.
    type ReadPages = Box<dyn Fn(&[u64], &mut Vec<u8>)>;

    struct Arm {
        name: String,
        run: ReadPages,
    }

    fn reads_of(pages: &[u64]) -> Vec<Read> {
        packed(
            &pages
                .iter()
                .map(|&p| (p * PAGE as u64, PAGE))
                .collect::<Vec<_>>(),
        )
    }

    fn reader_arm(name: &str, r: Reader) -> Arm {
        Arm {
            name: name.into(),
            run: Box::new(move |pages, staging| {
                let reads = reads_of(pages);
                staging.resize(pages.len() * PAGE, 0);
                r.read(&reads, staging).unwrap();
            }),
        }
    }

    fn stats(mut t: Vec<Duration>) -> (f64, f64, f64) {
        t.sort();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let mean = t.iter().map(|&d| us(d)).sum::<f64>() / t.len() as f64;
        let p99 = t[((t.len() * 99).div_ceil(100)).saturating_sub(1)];
        (mean, us(t[t.len() / 2]), us(p99))
    }

    #[test]
    #[ignore = "measurement: needs a multi-GiB file and minutes"]
    fn measure_cold_random_pages() {
        let path = std::env::var("PLEIO_IO_FILE").unwrap_or_else(|_| "/work/big.gguf".into());
        let path = Path::new(&path);
        let Ok(file) = File::open(path) else {
            skip!("no {}", path.display());
        };
        let len = file.metadata().unwrap().len();
        let n_pages = len / PAGE as u64;
        let mut arms = vec![reader_arm(
            "pread serial",
            Reader::open(&[path], ReaderConfig::new(Engine::Pread)).unwrap(),
        )];
        for threads in [16, 32, 64] {
            let cfg = ReaderConfig {
                queue_depth: threads,
                ..ReaderConfig::new(Engine::Pool)
            };
            arms.push(reader_arm(
                &format!("pool {threads} threads"),
                Reader::open(&[path], cfg).unwrap(),
            ));
        }
        for (qd, direct) in [
            (64, false),
            (128, false),
            (32, true),
            (64, true),
            (128, true),
        ] {
            let cfg = ReaderConfig {
                queue_depth: qd,
                direct,
                ..ReaderConfig::new(Engine::Uring)
            };
            match Reader::open(&[path], cfg) {
                Ok(b) => {
                    let kind = if direct { "O_DIRECT" } else { "buffered" };
                    arms.push(reader_arm(&format!("uring {kind} QD{qd}"), b))
                }
                Err(e) => skip_case!("uring QD{qd} direct={direct}: {e}"),
            }
        }
        if let Ok(b) = Reader::open(
            &[path],
            ReaderConfig {
                direct: true,
                ..ReaderConfig::new(Engine::Uring)
            },
        ) {
            arms.push(Arm {
                name: "limit: discard O_DIRECT QD64".into(),
                run: Box::new(move |pages, _| {
                    let extents: Vec<_> = pages
                        .iter()
                        .map(|&p| (0, p * PAGE as u64..(p + 1) * PAGE as u64))
                        .collect();
                    b.discard(&extents).unwrap();
                }),
            });
        }
        let sizes: Vec<usize> = std::env::var("PLEIO_IO_SIZES")
            .ok()
            .map(|s| s.split(',').map(|v| v.parse().unwrap()).collect())
            .unwrap_or_else(|| vec![16, 1792, 8192]);
        println!("file {} ({} pages of {PAGE})", path.display(), n_pages);
        println!(
            "{:>6} {:<34} {:>5} {:>11} {:>11} {:>11} {:>9} {:>10} {:>9}",
            "pages",
            "arm",
            "reps",
            "mean_us",
            "median_us",
            "p99_us",
            "IOPS",
            "dev_KiB/pg",
            "resident"
        );
        let mut staging = Vec::new();
        for &n in &sizes {
            let reps = match n {
                0..=64 => 30,
                65..=2048 => 10,
                _ => 5,
            };
            // Arms interleaved within each repetition, so drift in the
            // device (other tenants) spreads over all arms alike.
            let mut rng = Rng(7 + n as u64);
            let mut times = vec![Vec::new(); arms.len()];
            let mut dev = vec![0u64; arms.len()];
            let mut still = vec![0usize; arms.len()];
            for _ in 0..reps {
                for (k, arm) in arms.iter().enumerate() {
                    let pages = random_pages(&mut rng, n, n_pages);
                    evict(&file);
                    still[k] += resident(&file, len, &pages);
                    let before = read_bytes();
                    let t = Instant::now();
                    (arm.run)(&pages, &mut staging);
                    times[k].push(t.elapsed());
                    dev[k] += read_bytes() - before;
                }
            }
            for (k, arm) in arms.iter().enumerate() {
                let (mean, median, p99) = stats(std::mem::take(&mut times[k]));
                println!(
                    "{n:>6} {:<34} {reps:>5} {mean:>11.0} {median:>11.0} {p99:>11.0} {:>9.0} {:>10.1} {:>9}",
                    arm.name,
                    n as f64 / (mean / 1e6),
                    dev[k] as f64 / 1024.0 / (n * reps) as f64,
                    still[k]
                );
            }
        }
    }

    /// Where the pool's inline split should sit: small batches read inline
    /// versus handed to the pool, warm and cold.
    #[test]
    #[ignore = "measurement: needs a multi-GiB file"]
    fn measure_pool_split_point() {
        let path = std::env::var("PLEIO_IO_FILE").unwrap_or_else(|_| "/work/big.gguf".into());
        let path = Path::new(&path);
        let Ok(file) = File::open(path) else {
            skip!("no {}", path.display());
        };
        let len = file.metadata().unwrap().len();
        let n_pages = len / PAGE as u64;
        let inline = Reader::open(&[path], ReaderConfig::new(Engine::Pread)).unwrap();
        let pool = Reader::open(
            &[path],
            ReaderConfig {
                inline_below: 0,
                ..ReaderConfig::new(Engine::Pool)
            },
        )
        .unwrap();
        let mut rng = Rng(99);
        println!(
            "{:>5} {:>14} {:>14} {:>14} {:>14}",
            "pages", "warm inline us", "warm pool us", "cold inline us", "cold pool us"
        );
        for n in [1usize, 2, 3, 4, 8, 16, 64] {
            let mut staging = vec![0u8; n * PAGE];
            // Rows of 96 bytes inside random pages: what a row gather reads.
            let plan = |pages: &[u64]| {
                packed(
                    &pages
                        .iter()
                        .map(|&p| (p * PAGE as u64 + 100, 96))
                        .collect::<Vec<_>>(),
                )
            };
            let warm_pages = random_pages(&mut rng, n, n_pages);
            let wp = plan(&warm_pages);
            let mut warm = [0f64; 2];
            for (k, b) in [&inline, &pool].into_iter().enumerate() {
                b.read(&wp, &mut staging).unwrap();
                let iters = 2000;
                let t = Instant::now();
                for _ in 0..iters {
                    b.read(&wp, &mut staging).unwrap();
                }
                warm[k] = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
            }
            let mut cold = [0f64; 2];
            for (k, b) in [&inline, &pool].into_iter().enumerate() {
                let mut times = Vec::new();
                for _ in 0..20 {
                    let p = plan(&random_pages(&mut rng, n, n_pages));
                    evict(&file);
                    let t = Instant::now();
                    b.read(&p, &mut staging).unwrap();
                    times.push(t.elapsed());
                }
                cold[k] = stats(times).0;
            }
            println!(
                "{n:>5} {:>14.2} {:>14.2} {:>14.0} {:>14.0}",
                warm[0], warm[1], cold[0], cold[1]
            );
        }
    }
}
