//! The `shared` strategy: one row cache per machine in shared memory.
//! Several OS processes (this test binary run again as children) gather
//! random overlapping batches and every row equals `pread`'s; clients
//! SIGKILLed mid-gather leave the cache usable; a removed segment, a
//! rewritten table and a foreign file in the segment's place are handled.
//! Results only, never timings.

mod fetch_fixture;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fetch_fixture::{Fixture, Rng};
use pleio::cache::segment::{Probe, Segment};
use pleio::{OpenOptions, Strategy, Table};

/// Set in a child: the table's path.
const CHILD_PATH: &str = "PLEIO_SHARED_TEST_PATH";
/// Set in a child: its seed.
const CHILD_SEED: &str = "PLEIO_SHARED_TEST_SEED";
/// Set in a child: the file whose existence says "go" (role "once").
const CHILD_GO: &str = "PLEIO_SHARED_TEST_GO";
/// Set in a child: what to do ("gather", "loop", "once", "claim").
const CHILD_ROLE: &str = "PLEIO_SHARED_TEST_ROLE";

const BUDGET: u64 = 1 << 20;

/// Skips (counted) in a build without shared memory.
macro_rules! need_shm {
    () => {
        if pleio::sys::NOOP {
            pleio_testkit::skip!("no shared memory in this build");
        }
    };
}

fn open(path: &Path, strategy: Strategy) -> Table {
    OpenOptions::new()
        .strategy(strategy)
        .cache_budget(BUDGET)
        .open(path)
        .unwrap()
}

/// The raw stored bytes of `rows` by `t`.
fn raw(t: &Table, rows: &[u64]) -> Vec<u8> {
    let mut out = vec![0u8; rows.len() * t.row_bytes() as usize];
    t.gather_as(pleio::Dtype::Raw, rows, &mut out).unwrap();
    out
}

/// Random overlapping batches: a hot range every process shares and a tail.
fn batch(rng: &mut Rng, n_rows: u64) -> Vec<u64> {
    (0..200)
        .map(|k| {
            if k % 2 == 0 {
                rng.below(n_rows / 8)
            } else {
                rng.below(n_rows)
            }
        })
        .collect()
}

/// What a child does; true if this process is one.
fn child() -> bool {
    let Some(path) = std::env::var_os(CHILD_PATH) else {
        return false;
    };
    let path = Path::new(&path);
    let seed: u64 = std::env::var(CHILD_SEED).unwrap().parse().unwrap();
    let role = std::env::var(CHILD_ROLE).unwrap();
    let shared = open(path, Strategy::Shared);
    let pread = open(path, Strategy::Pread);
    let n = shared.rows();
    let mut rng = Rng::new(seed);
    match role.as_str() {
        "gather" => {
            for _ in 0..40 {
                let rows = batch(&mut rng, n);
                assert_eq!(raw(&shared, &rows), raw(&pread, &rows), "seed {seed}");
            }
        }
        "loop" => loop {
            let rows = batch(&mut rng, n);
            assert_eq!(raw(&shared, &rows), raw(&pread, &rows), "seed {seed}");
        },
        "once" => {
            // Waits for the parent's go, then gathers the common batch.
            let go = std::env::var_os(CHILD_GO).unwrap();
            while !Path::new(&go).exists() {
                std::thread::sleep(Duration::from_millis(1));
            }
            let rows: Vec<u64> = (0..1792).map(|k| k * 11 % n).collect();
            assert_eq!(raw(&shared, &rows), raw(&pread, &rows));
        }
        "claim" => {
            // Claims a slot and dies without filling it.
            let seg = shared.shared_segment().unwrap();
            let mut dst = vec![0u8; shared.row_bytes() as usize];
            let mut ev = 0;
            for row in seed..n {
                if let Probe::Claimed(_) = seg.probe(row, &mut dst, &mut ev) {
                    std::process::exit(0);
                }
            }
            panic!("no row to claim");
        }
        r => panic!("unknown role {r}"),
    }
    std::process::exit(0);
}

fn spawn(test: &str, path: &Path, seed: u64, role: &str) -> Child {
    spawn_with(test, path, seed, role, Path::new(""))
}

fn spawn_with(test: &str, path: &Path, seed: u64, role: &str, go: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .env(CHILD_GO, go)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_PATH, path)
        .env(CHILD_SEED, seed.to_string())
        .env(CHILD_ROLE, role)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn wait_ok(c: Child) {
    let out = c.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "child ended with {:?}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every row of the table through `shared` equals `pread`'s.
fn check_all(shared: &Table, pread: &Table) {
    let n = shared.rows();
    let rows: Vec<u64> = (0..n).collect();
    for chunk in rows.chunks(997) {
        assert_eq!(raw(shared, chunk), raw(pread, chunk));
    }
}

#[test]
fn four_processes_share_one_cache_and_match_pread() {
    need_shm!();
    const NAME: &str = "four_processes_share_one_cache_and_match_pread";
    if child() {
        return;
    }
    let fx = Fixture::qwen(20_000, 31);
    let path = fx.file.path();
    // The parent stays attached, so the counters outlive the children.
    let shared = open(path, Strategy::Shared);
    let pread = open(path, Strategy::Pread);
    let seg = shared.shared_segment().unwrap();
    let kids: Vec<Child> = (0..4).map(|k| spawn(NAME, path, k, "gather")).collect();
    for c in kids {
        wait_ok(c);
    }
    let st = seg.stats();
    assert!(st.hits > 0 && st.misses > 0, "{st:?}");
    assert!(st.evictions > 0, "a 1 MiB budget must evict: {st:?}");
    assert_eq!(seg.bytes(), seg.bytes().min(BUDGET));
    assert_eq!(seg.attached(), vec![std::process::id()]);
    check_all(&shared, &pread);
}

#[test]
fn sigkilled_clients_leave_a_usable_cache() {
    need_shm!();
    const NAME: &str = "sigkilled_clients_leave_a_usable_cache";
    if child() {
        return;
    }
    let fx = Fixture::qwen(20_000, 32);
    let path = fx.file.path();
    let shared = open(path, Strategy::Shared);
    let pread = open(path, Strategy::Pread);
    let seg = shared.shared_segment().unwrap();
    let mut rng = Rng::new(7);
    for round in 0..6u64 {
        let mut kids: Vec<Child> = (0..3)
            .map(|k| spawn(NAME, path, round * 10 + k, "loop"))
            .collect();
        std::thread::sleep(Duration::from_millis(50 + rng.below(150)));
        for c in &mut kids {
            c.kill().unwrap();
        }
        for mut c in kids {
            let st = c.wait().unwrap();
            // Killed, not failed: a child that found a wrong row exits 101.
            assert_ne!(
                st.code(),
                Some(101),
                "round {round}: a client saw a wrong row"
            );
        }
        let rows = batch(&mut rng, shared.rows());
        assert_eq!(raw(&shared, &rows), raw(&pread, &rows), "round {round}");
    }
    // A slot claimed by a process that died before filling it is taken
    // back, never served.
    wait_ok(spawn(NAME, path, 4242, "claim"));
    assert_eq!(raw(&shared, &[4242]), raw(&pread, &[4242]));
    check_all(&shared, &pread);
    // A fresh process attaches and reads correct rows.
    wait_ok(spawn(NAME, path, 99, "gather"));
    assert!(seg.stats().hits > 0);
}

/// The segment's memory is taken whole when it is made (so no later write
/// finds a hole: no allocating fault on the cold path, and a full
/// `/dev/shm` fails the attach instead of a write).
#[test]
fn a_new_segment_is_allocated_whole() {
    need_shm!();
    use std::os::unix::fs::MetadataExt;
    let fx = Fixture::qwen(5_000, 37);
    let shared = open(fx.file.path(), Strategy::Shared);
    assert_eq!(
        raw(&shared, &[1]),
        raw(&open(fx.file.path(), Strategy::Pread), &[1])
    );
    let seg = shared.shared_segment().unwrap();
    let m = std::fs::metadata(seg.path()).unwrap();
    assert_eq!(m.len(), seg.bytes());
    assert!(
        m.blocks() * 512 >= m.len(),
        "{} of {} bytes allocated",
        m.blocks() * 512,
        m.len()
    );
}

#[test]
fn repeats_and_evictions_in_large_batches_match_pread_counting_each_row_once() {
    need_shm!();
    // 3000 rows of 90 B in a 1 MiB budget: batches of up to 1500 ids with
    // repeats, some found, some missed, some evicted by the same gather's
    // claims (batches above 256 ids take the packed radix sort of the
    // missed ids, whose request indices exceed their count).
    let fx = Fixture::qwen(3_000, 35);
    let path = fx.file.path();
    let shared = open(path, Strategy::Shared);
    let pread = open(path, Strategy::Pread);
    let mut rng = Rng::new(35);
    for round in 0..24u64 {
        let n = 1 + (round * 97) % 1500;
        let rows: Vec<u64> = (0..n).map(|_| rng.below(3_000)).collect();
        let mut got = vec![0u8; rows.len() * shared.row_bytes() as usize];
        let st = shared
            .gather_as(pleio::Dtype::Raw, &rows, &mut got)
            .unwrap();
        assert!(got == raw(&pread, &rows), "round {round}: {n} ids");
        let mut distinct = rows.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            st.cache_hits + st.cache_misses,
            distinct.len() as u64,
            "round {round}: {st:?}"
        );
    }
}

#[test]
fn a_removed_segment_is_replaced_and_rows_stay_exact() {
    need_shm!();
    let fx = Fixture::qwen(5_000, 33);
    let path = fx.file.path();
    let shared = open(path, Strategy::Shared);
    let pread = open(path, Strategy::Pread);
    let rows: Vec<u64> = (0..500).map(|r| r * 7 % 5000).collect();
    assert_eq!(raw(&shared, &rows), raw(&pread, &rows));
    let old = shared.shared_segment().unwrap();
    let p = old.path().to_path_buf();
    // As `pleio cache rm` does: marked removed, then unlinked.
    old.remove().unwrap();
    assert!(!p.exists());
    assert_eq!(raw(&shared, &rows), raw(&pread, &rows));
    let new = shared.shared_segment().unwrap();
    assert!(!new.removed() && p.exists());
    assert_eq!(new.stats().hits, 0, "a fresh segment");
    // Unlinked by hand (no flag): this process keeps its mapping.
    std::fs::remove_file(&p).unwrap();
    assert_eq!(raw(&shared, &rows), raw(&pread, &rows));
    assert!(new.stats().hits >= 500);
}

#[test]
fn a_rewritten_table_never_serves_old_rows() {
    need_shm!();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.gguf");
    let write = |seed| {
        let spec = pleio_lab::synth::SynthSpec::qwen(pleio::quant::GgmlType::IQ4_NL, 3_000, seed);
        spec.write(std::fs::File::create(&path).unwrap(), &mut |_| {})
            .unwrap();
    };
    write(1);
    let shared = open(&path, Strategy::Shared);
    let rows: Vec<u64> = (0..3000).step_by(3).collect();
    let before = raw(&shared, &rows);
    assert_eq!(before, raw(&open(&path, Strategy::Pread), &rows));
    let seg1 = shared.shared_segment().unwrap().path().to_path_buf();
    // Same size, new contents, in place.
    std::thread::sleep(Duration::from_millis(20));
    write(2);
    let after = raw(&shared, &rows);
    assert_ne!(before, after);
    assert_eq!(after, raw(&open(&path, Strategy::Pread), &rows));
    let seg2 = shared.shared_segment().unwrap().path().to_path_buf();
    assert_ne!(seg1, seg2, "a new identity, a new segment");
}

#[test]
fn a_foreign_or_scribbled_segment_is_refused_or_survived() {
    need_shm!();
    let fx = Fixture::qwen(4_000, 34);
    let path = fx.file.path();
    let t = open(path, Strategy::Shared);
    let rows: Vec<u64> = (0..4000).step_by(5).collect();
    let good = raw(&open(path, Strategy::Pread), &rows);
    assert_eq!(raw(&t, &rows), good);
    let seg = t.shared_segment().unwrap();
    let p = seg.path().to_path_buf();
    let len = seg.bytes();
    drop(seg);
    drop(t);
    // A file of garbage where the segment belongs: a typed error naming it.
    assert!(!p.exists(), "the last process removed it");
    std::fs::write(&p, vec![0xa5u8; 8192]).unwrap();
    let t = open(path, Strategy::Shared);
    let mut out = vec![0u8; rows.len() * t.row_bytes() as usize];
    let e = t.gather_as(pleio::Dtype::Raw, &rows, &mut out).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&p.display().to_string()) && msg.contains("magic"),
        "{msg}"
    );
    std::fs::remove_file(&p).unwrap();
    // A real segment whose slot table is scribbled over: no panic, no
    // hang, and a symlink in its place is never followed.
    assert_eq!(raw(&t, &rows), good);
    let seg = t.shared_segment().unwrap();
    assert_eq!(seg.bytes(), len);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        let mut rng = Rng::new(5);
        let mut junk = vec![0u8; 64 << 10];
        rng.fill_bytes(&mut junk);
        f.write_all_at(&junk, 1024).unwrap();
    }
    let mut out = vec![0u8; rows.len() * t.row_bytes() as usize];
    let _ = t.gather_as(pleio::Dtype::Raw, &rows, &mut out);
    seg.remove().unwrap();
    std::os::unix::fs::symlink(path, &p).unwrap();
    let e = t.gather_as(pleio::Dtype::Raw, &rows, &mut out).unwrap_err();
    assert!(e.to_string().contains(&p.display().to_string()), "{e}");
    std::fs::remove_file(&p).unwrap();
    assert_eq!(raw(&t, &rows), good);
    drop(seg);
}

#[test]
fn the_segment_is_removed_when_the_last_process_detaches() {
    need_shm!();
    let fx = Fixture::qwen(2_000, 35);
    let path = fx.file.path();
    let a = open(path, Strategy::Shared);
    let b = open(path, Strategy::Shared);
    let sa = a.shared_segment().unwrap();
    let sb = b.shared_segment().unwrap();
    assert_eq!(sa.path(), sb.path());
    let p = sa.path().to_path_buf();
    assert_eq!(raw(&a, &[1, 2, 3]), raw(&b, &[1, 2, 3]));
    assert!(Segment::inspect(&p).unwrap().info().resident >= 3);
    drop((a, sa));
    assert!(p.exists());
    drop((b, sb));
    assert!(!p.exists());
}

#[test]
fn the_segment_gives_access_only_to_readers_of_the_table() {
    need_shm!();
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let fx = Fixture::qwen(1_000, 36);
    let path = fx.file.path();
    for (table_mode, want) in [
        (0o600, 0o600),
        (0o640, 0o660),
        (0o604, 0o606),
        (0o444, 0o666),
    ] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(table_mode)).unwrap();
        let t = open(path, Strategy::Shared);
        assert_eq!(raw(&t, &[1, 2]), raw(&open(path, Strategy::Pread), &[1, 2]));
        let seg = t.shared_segment().unwrap();
        let m = std::fs::metadata(seg.path()).unwrap();
        let tm = std::fs::metadata(path).unwrap();
        assert_eq!(m.mode() & 0o777, want, "table {table_mode:o}");
        assert_eq!(m.gid(), tm.gid(), "the table's group");
        if m.uid() != tm.uid() {
            // Not root: the owner is the creator, and no one else gains access.
            assert_eq!(m.uid(), my_uid());
        }
        // The mode is set at creation: the next mode needs a new segment.
        seg.remove().unwrap();
    }
}

/// This process's uid, from a file it just made.
fn my_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    let f = tempfile::NamedTempFile::new().unwrap();
    f.as_file().metadata().unwrap().uid()
}

#[test]
fn four_processes_missing_the_same_rows_read_each_once() {
    const NAME: &str = "four_processes_missing_the_same_rows_read_each_once";
    need_shm!();
    if child() {
        return;
    }
    let fx = Fixture::qwen(50_000, 37);
    let path = fx.file.path();
    // A budget that holds the batch whole: nothing evicted, nothing uncached.
    let shared = OpenOptions::new()
        .strategy(Strategy::Shared)
        .cache_budget(64 << 20)
        .open(path)
        .unwrap();
    let seg = shared.shared_segment().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let kids: Vec<Child> = (0..4)
        .map(|k| spawn_with(NAME, path, k, "once", &go))
        .collect();
    std::fs::write(&go, b"").unwrap();
    for c in kids {
        wait_ok(c);
    }
    let mut distinct: Vec<u64> = (0..1792).map(|k| k * 11 % 50_000).collect();
    distinct.sort_unstable();
    distinct.dedup();
    let st = seg.stats();
    // Each row read from the device once machine-wide; the other three
    // processes found it there or waited for it.
    assert_eq!(
        (st.misses, st.uncached),
        (distinct.len() as u64, 0),
        "{st:?}"
    );
    assert_eq!(st.hits, 3 * distinct.len() as u64, "{st:?}");
}

#[test]
fn a_truncated_table_is_an_error_never_old_rows() {
    need_shm!();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.gguf");
    let spec = pleio_lab::synth::SynthSpec::qwen(pleio::quant::GgmlType::IQ4_NL, 4_000, 3);
    spec.write(std::fs::File::create(&path).unwrap(), &mut |_| {})
        .unwrap();
    let shared = open(&path, Strategy::Shared);
    let rows: Vec<u64> = (0..4000).step_by(7).collect();
    let before = raw(&shared, &rows);
    let seg1 = shared.shared_segment().unwrap().path().to_path_buf();
    // Cut the file in the middle of the table: its last rows are gone.
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - 100 * shared.row_bytes())
        .unwrap();
    let mut out = vec![0u8; rows.len() * shared.row_bytes() as usize];
    let e = shared
        .gather_as(pleio::Dtype::Raw, &rows, &mut out)
        .unwrap_err();
    assert!(out.iter().all(|&b| b == 0), "the output is untouched");
    assert!(e.to_string().contains("t.gguf"), "{e}");
    // Rows still in the file come from the file as it is now, through a new
    // segment (the old one held the whole table's rows).
    let head: Vec<u64> = (0..3000).step_by(7).collect();
    let n = head.len() * shared.row_bytes() as usize;
    assert_eq!(raw(&shared, &head), before[..n].to_vec());
    assert_ne!(shared.shared_segment().unwrap().path(), seg1);
}

/// Shrinks the segment file at `p` (whatever is there now) to `len`, if
/// it is longer (never grows it: a zero-filled file is a foreign one).
fn shrink(p: &Path, len: u64) {
    if let Ok(f) = std::fs::OpenOptions::new().write(true).open(p) {
        if f.metadata().is_ok_and(|m| m.len() > len) {
            let _ = f.set_len(len);
        }
    }
}

#[test]
fn a_segment_shrunk_by_a_co_reader_is_survived_by_every_process() {
    need_shm!();
    const NAME: &str = "a_segment_shrunk_by_a_co_reader_is_survived_by_every_process";
    if child() {
        return;
    }
    let fx = Fixture::qwen(20_000, 36);
    let path = fx.file.path();
    let shared = open(path, Strategy::Shared);
    if shared.sigbus_guard() != pleio::SigbusGuard::Active {
        pleio_testkit::skip!("no SIGBUS guard on this target");
    }
    let pread = open(path, Strategy::Pread);
    let rows: Vec<u64> = (0..2000).map(|r| r * 9 % 20_000).collect();
    let good = raw(&pread, &rows);
    assert_eq!(raw(&shared, &rows), good);
    let seg = shared.shared_segment().unwrap();
    let p = seg.path().to_path_buf();
    // Any process that may write the segment can shrink it: the next
    // access here raises SIGBUS, which loses the mapping, not the process;
    // the rows of that gather come from the device.
    for len in [4096, 0] {
        shrink(&p, len);
        assert_eq!(raw(&shared, &rows), good, "shrunk to {len}");
        let lost = shared.shared_segment().unwrap();
        assert_eq!(raw(&shared, &rows), good, "shrunk to {len}");
        let new = shared.shared_segment().unwrap();
        assert!(!new.lost() && new.bytes() == seg.bytes(), "a fresh segment");
        assert_eq!(raw(&shared, &rows), good);
        assert!(new.stats().hits >= rows.len() as u64, "{:?}", new.stats());
        drop(lost);
    }
    assert!(seg.lost());
    // Children gathering while the segment is shrunk again and again:
    // every row they get is exact (a wrong row exits 101), none dies.
    let mut kids: Vec<Child> = (0..3).map(|k| spawn(NAME, path, k, "gather")).collect();
    let mut rng = Rng::new(9);
    let mut running = kids.len();
    while running > 0 {
        std::thread::sleep(Duration::from_millis(2 + rng.below(8)));
        shrink(&p, [0, 4096, 1 << 16][rng.below(3) as usize]);
        running = kids
            .iter_mut()
            .map(|c| c.try_wait().unwrap().is_none())
            .filter(|&alive| alive)
            .count();
    }
    for c in kids {
        wait_ok(c);
    }
    assert_eq!(raw(&shared, &rows), good);
    // A segment shrunk after its last reader left stays behind (its last
    // detach removes only the file it attached): this table's is removed
    // here, so a bare `cargo test` leaves nothing in /dev/shm.
    drop((shared, seg));
    let _ = std::fs::remove_file(&p);
}
