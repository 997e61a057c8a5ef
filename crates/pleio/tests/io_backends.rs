//! Every read backend on the same span lists must fill the staging buffer
//! with exactly the bytes of a plain read of the file, touch nothing else,
//! name the offset when the file is too short, and work from 8 threads at
//! once. io_uring cases skip (with a printed reason) where the kernel or
//! sandbox refuses io_uring or the file system refuses `O_DIRECT`.
#![cfg(unix)]

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use pleio::io::{
    IoError, PoolBackend, PoolConfig, PreadBackend, ReadBackend, ReadPlan, Span, UringBackend,
    UringConfig,
};
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

fn make_file(dir: &Path, len: usize) -> (std::path::PathBuf, Vec<u8>) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
    let path = dir.join("data.bin");
    let mut f = File::create(&path).unwrap();
    f.write_all(&bytes).unwrap();
    f.sync_all().unwrap();
    (path, bytes)
}

/// Every backend configuration under test, with a name. io_uring variants
/// are left out, with a printed reason, where unavailable.
fn backends(path: &Path) -> Vec<(String, Box<dyn ReadBackend>)> {
    let mut out: Vec<(String, Box<dyn ReadBackend>)> = vec![
        ("pread".into(), Box::new(PreadBackend::open(path).unwrap())),
        (
            "pool".into(),
            Box::new(PoolBackend::open(path, PoolConfig::default()).unwrap()),
        ),
        (
            // Tiny pieces and no inline path: every span split and spread.
            "pool-small-pieces".into(),
            Box::new(
                PoolBackend::open(
                    path,
                    PoolConfig {
                        threads: 4,
                        inline_below: 0,
                        piece_bytes: 1000,
                    },
                )
                .unwrap(),
            ),
        ),
    ];
    let urings = [
        ("uring", UringConfig::default()),
        (
            "uring-qd1-small-reads",
            UringConfig {
                queue_depth: 1,
                max_read_bytes: 777,
                ..UringConfig::default()
            },
        ),
        (
            "uring-direct",
            UringConfig {
                direct: true,
                ..UringConfig::default()
            },
        ),
        (
            "uring-direct-qd3-small-reads",
            UringConfig {
                queue_depth: 3,
                direct: true,
                max_read_bytes: 4096,
            },
        ),
    ];
    for (name, cfg) in urings {
        match UringBackend::open(path, cfg) {
            Ok(b) => out.push((name.into(), Box::new(b))),
            Err(e @ (IoError::UringUnavailable(_) | IoError::DirectUnsupported { .. })) => {
                skip_case!("{name}: {e}")
            }
            Err(e) => panic!("{name}: {e}"),
        }
    }
    out
}

/// Staging as a plain copy from `file` would fill it; untouched bytes keep
/// `FILL`.
const FILL: u8 = 0xA5;

fn expected(plan: &ReadPlan, file: &[u8], staging_len: usize) -> Vec<u8> {
    let mut out = vec![FILL; staging_len];
    for s in plan.spans() {
        let f = s.file_offset as usize;
        out[s.dst_offset..s.dst_offset + s.len].copy_from_slice(&file[f..f + s.len]);
    }
    out
}

/// The span lists every backend must agree on.
fn cases(file: &[u8]) -> Vec<(&'static str, ReadPlan)> {
    let len = file.len() as u64;
    let mut rng = Rng(42);
    // Random offsets and lengths, spaced out in staging (gaps must stay FILL).
    let mut offs: Vec<u64> = (0..300).map(|_| rng.below(len - 400)).collect();
    offs.sort_unstable();
    let mut dst = 0usize;
    let random: Vec<Span> = offs
        .iter()
        .map(|&o| {
            let n = 1 + rng.below(300) as usize;
            let s = Span {
                file_offset: o,
                len: n,
                dst_offset: dst + 3,
            };
            dst += n + 3 + rng.below(5) as usize;
            s
        })
        .collect();
    // Sorted random rows of a 90-byte table starting at an odd offset.
    let mut rows: Vec<u64> = (0..500).map(|_| rng.below((len - 77) / 90)).collect();
    rows.sort_unstable();
    rows.dedup();
    let adjacent: Vec<u64> = (1000..1100).chain(5000..5003).collect();
    vec![
        ("random", ReadPlan::new(random).unwrap()),
        (
            "adjacent rows",
            ReadPlan::for_rows(77, 90, &adjacent, 0).unwrap().plan,
        ),
        (
            "random rows, no coalescing",
            ReadPlan::for_rows(77, 90, &rows, 0).unwrap().plan,
        ),
        (
            "random rows coalesced with gaps",
            ReadPlan::for_rows(77, 90, &rows, 4096).unwrap().plan,
        ),
        (
            "span ending at EOF",
            ReadPlan::packed([(0, 10), (len - 4097, 4097)]).unwrap(),
        ),
        ("last byte", ReadPlan::packed([(len - 1, 1)]).unwrap()),
        ("empty", ReadPlan::new(vec![]).unwrap()),
        (
            "zero-length spans",
            ReadPlan::packed([(5, 0), (6, 3), (len, 0)]).unwrap(),
        ),
        (
            "one huge span",
            ReadPlan::packed([(0, file.len())]).unwrap(),
        ),
        (
            "overlapping in the file",
            ReadPlan::packed([(100, 5000), (200, 10), (4000, 9000)]).unwrap(),
        ),
    ]
}

#[test]
fn every_backend_matches_a_plain_read() {
    let dir = scratch();
    let (path, file) = make_file(dir.path(), FILE_LEN);
    let backends = backends(&path);
    for (case, plan) in cases(&file) {
        let staging_len = plan.staging_len() + 17;
        let want = expected(&plan, &file, staging_len);
        for (name, b) in &backends {
            let mut staging = vec![FILL; staging_len];
            let stats = b
                .read(&plan, &mut staging)
                .unwrap_or_else(|e| panic!("{name} on {case}: {e}"));
            assert!(staging == want, "{name} on {case}: staging differs");
            if !plan.is_empty() {
                assert!(stats.requests > 0 && stats.bytes >= plan.bytes().min(1));
            }
        }
    }
}

#[test]
fn rows_land_at_their_staging_offsets() {
    let dir = scratch();
    let (path, file) = make_file(dir.path(), FILE_LEN);
    let rows: Vec<u64> = (0..2000)
        .map(|i| i * i % 30_000)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    for (name, b) in backends(&path) {
        for gap in [0, 100, 5000] {
            let r = ReadPlan::for_rows(33, 97, &rows, gap).unwrap();
            let mut staging = vec![0u8; r.plan.staging_len()];
            b.read(&r.plan, &mut staging).unwrap();
            for (&row, &at) in rows.iter().zip(&r.staging_offsets) {
                let f = 33 + row as usize * 97;
                assert_eq!(
                    &staging[at..at + 97],
                    &file[f..f + 97],
                    "{name} gap {gap} row {row}"
                );
            }
        }
    }
}

#[test]
fn short_staging_is_an_error() {
    let dir = scratch();
    let (path, _) = make_file(dir.path(), 10_000);
    let plan = ReadPlan::packed([(0, 100), (500, 100)]).unwrap();
    for (name, b) in backends(&path) {
        let mut staging = vec![0u8; 150];
        match b.read(&plan, &mut staging) {
            Err(IoError::Staging {
                need: 200,
                got: 150,
            }) => {}
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn truncated_file_errors_name_the_offset() {
    let dir = scratch();
    let (path, _) = make_file(dir.path(), FILE_LEN);
    // Backends opened on the full file, which then shrinks under them.
    let backends = backends(&path);
    let new_len = 1_000_003u64;
    File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(new_len)
        .unwrap();
    // One span crosses the new end; one starts beyond it.
    let crossing = ReadPlan::packed([(0, 100), (new_len - 50, 100)]).unwrap();
    let beyond = ReadPlan::packed([(10, 10), (2_000_000, 10)]).unwrap();
    for (name, b) in &backends {
        let mut staging = vec![0u8; 200];
        match b.read(&crossing, &mut staging) {
            Err(IoError::UnexpectedEof { offset, end }) => {
                assert_eq!(offset, new_len, "{name}");
                assert!(end > new_len, "{name}: end {end}");
                let msg = IoError::UnexpectedEof { offset, end }.to_string();
                assert!(msg.contains(&new_len.to_string()), "{msg}");
            }
            other => panic!("{name}: crossing span gave {other:?}"),
        }
        match b.read(&beyond, &mut staging) {
            Err(IoError::UnexpectedEof { offset, .. }) => {
                // The real end of the file, not where the failing span (or
                // its aligned block) starts.
                assert_eq!(offset, new_len, "{name}");
            }
            other => panic!("{name}: span beyond EOF gave {other:?}"),
        }
        // The backend is still usable afterwards.
        let ok = ReadPlan::packed([(0, 10), (new_len - 10, 10)]).unwrap();
        b.read(&ok, &mut staging)
            .unwrap_or_else(|e| panic!("{name} after error: {e}"));
    }
}

#[test]
fn eight_threads_share_one_backend() {
    let dir = scratch();
    let (path, file) = make_file(dir.path(), FILE_LEN);
    let file = Arc::new(file);
    for (name, b) in backends(&path) {
        std::thread::scope(|scope| {
            for t in 0..8u64 {
                let (b, file, name) = (&b, &file, &name);
                scope.spawn(move || {
                    let mut rng = Rng(1000 + t);
                    for _ in 0..20 {
                        let n = 1 + rng.below(200) as usize;
                        let mut rows: Vec<u64> = (0..n)
                            .map(|_| rng.below((FILE_LEN as u64 - 5) / 131))
                            .collect();
                        rows.sort_unstable();
                        rows.dedup();
                        let r = ReadPlan::for_rows(5, 131, &rows, rng.below(600) as usize).unwrap();
                        let mut staging = vec![FILL; r.plan.staging_len()];
                        b.read(&r.plan, &mut staging).unwrap();
                        let want = expected(&r.plan, file, r.plan.staging_len());
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
    let cfg = UringConfig {
        direct: true,
        ..UringConfig::default()
    };
    let b = match UringBackend::open(&path, cfg) {
        Ok(b) => b,
        Err(e @ (IoError::UringUnavailable(_) | IoError::DirectUnsupported { .. })) => {
            skip!("{e}");
        }
        Err(e) => panic!("{e}"),
    };
    assert!(b.alignment().is_power_of_two() && b.alignment() <= 4096);
    let page = |p: u64, n: u64| p * 4096..(p + n) * 4096;
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
    let stats = b.read_extents(&extents).unwrap();
    assert_eq!(stats.requests, extents.len() as u64);
    assert_eq!(stats.bytes, 8 * 4096);
    // An extent longer than max_read_bytes is split.
    let small = UringBackend::open(
        &path,
        UringConfig {
            max_read_bytes: 8192,
            ..cfg
        },
    )
    .unwrap();
    assert_eq!(small.read_extents(&[page(10, 5)]).unwrap().requests, 3);
    assert_eq!(b.read_extents(&[page(2, 0)]).unwrap().requests, 0);
    match b.read_extents(&[page(1, 1), page(last + 1, 1)]) {
        Err(IoError::UnexpectedEof { .. }) => {}
        other => panic!("extent past EOF gave {other:?}"),
    }
    let unaligned = 100..4196;
    assert!(b.read_extents(&[unaligned]).is_err(), "unaligned extent");

    // More than the 32 MiB read in one go: chunks, every request made.
    let sparse = dir.path().join("sparse.bin");
    File::create(&sparse).unwrap().set_len(48 << 20).unwrap();
    let b = UringBackend::open(&sparse, cfg).unwrap();
    let mib = |m: u64| m << 20;
    let extents: Vec<_> = (0..10).map(|i| mib(4 * i)..mib(4 * i + 4)).collect();
    let stats = b.read_extents(&extents).unwrap();
    assert_eq!((stats.requests, stats.bytes), (40, mib(40)));

    // Several files through one ring: one request per extent, each file's
    // length its own (the 48 MiB file's page 2000 exists, the small
    // file's does not), and a file index past the list is an error.
    let small_file = UringBackend::open(&path, cfg).unwrap();
    let files = [small_file, b];
    let extents = vec![(0, page(3, 2)), (1, page(2000, 4)), (0, page(last, 1))];
    let stats = files[0].read_extents_of(&files, &extents).unwrap();
    assert_eq!(stats.requests, 3);
    assert_eq!(stats.bytes, (2 + 4 + 1) * 4096);
    match files[1].read_extents_of(&files, &[(0, page(2000, 1))]) {
        Err(IoError::UnexpectedEof { .. }) => {}
        other => panic!("page 2000 of the small file gave {other:?}"),
    }
    assert!(files[0]
        .read_extents_of(&files, &[(2, page(0, 1))])
        .is_err());
}

#[test]
fn uring_probe_reports_clearly() {
    match UringBackend::probe() {
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

    fn plan_of(pages: &[u64]) -> ReadPlan {
        ReadPlan::packed(pages.iter().map(|&p| (p * PAGE as u64, PAGE))).unwrap()
    }

    fn backend_arm(name: &str, b: Box<dyn ReadBackend>) -> Arm {
        Arm {
            name: name.into(),
            run: Box::new(move |pages, staging| {
                let plan = plan_of(pages);
                staging.resize(plan.staging_len(), 0);
                b.read(&plan, staging).unwrap();
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
        let mut arms = vec![backend_arm(
            "pread serial",
            Box::new(PreadBackend::open(path).unwrap()),
        )];
        for threads in [16, 32, 64] {
            let cfg = PoolConfig {
                threads,
                ..PoolConfig::default()
            };
            arms.push(backend_arm(
                &format!("pool {threads} threads"),
                Box::new(PoolBackend::open(path, cfg).unwrap()),
            ));
        }
        for (qd, direct) in [
            (64, false),
            (128, false),
            (32, true),
            (64, true),
            (128, true),
        ] {
            let cfg = UringConfig {
                queue_depth: qd,
                direct,
                ..UringConfig::default()
            };
            match UringBackend::open(path, cfg) {
                Ok(b) => {
                    let kind = if direct { "O_DIRECT" } else { "buffered" };
                    arms.push(backend_arm(&format!("uring {kind} QD{qd}"), Box::new(b)))
                }
                Err(e) => skip_case!("uring QD{qd} direct={direct}: {e}"),
            }
        }
        if let Ok(b) = UringBackend::open(
            path,
            UringConfig {
                direct: true,
                ..UringConfig::default()
            },
        ) {
            arms.push(Arm {
                name: "limit: read_extents O_DIRECT QD64".into(),
                run: Box::new(move |pages, _| {
                    let extents: Vec<_> = pages
                        .iter()
                        .map(|&p| p * PAGE as u64..(p + 1) * PAGE as u64)
                        .collect();
                    b.read_extents(&extents).unwrap();
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
        let inline = PreadBackend::open(path).unwrap();
        let pool = PoolBackend::open(
            path,
            PoolConfig {
                inline_below: 0,
                ..PoolConfig::default()
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
                ReadPlan::packed(pages.iter().map(|&p| (p * PAGE as u64 + 100, 96))).unwrap()
            };
            let warm_pages = random_pages(&mut rng, n, n_pages);
            let wp = plan(&warm_pages);
            let mut warm = [0f64; 2];
            for (k, b) in [&inline as &dyn ReadBackend, &pool].into_iter().enumerate() {
                b.read(&wp, &mut staging).unwrap();
                let iters = 2000;
                let t = Instant::now();
                for _ in 0..iters {
                    b.read(&wp, &mut staging).unwrap();
                }
                warm[k] = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
            }
            let mut cold = [0f64; 2];
            for (k, b) in [&inline as &dyn ReadBackend, &pool].into_iter().enumerate() {
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
