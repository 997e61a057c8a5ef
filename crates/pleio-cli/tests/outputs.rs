//! Files pleio writes: devices, FIFOs and symbolic links are never
//! replaced, `-` is standard output, concurrent writers to one path leave
//! exactly one writer's complete file and only that writer succeeds, and a
//! signal during a write leaves no temporary file.

mod common;

use common::{disk_dir, ok, p, pleio};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn fails(args: &[&str]) -> String {
    let out = pleio(args);
    assert_eq!(out.status.code(), Some(2), "pleio {args:?} should fail");
    String::from_utf8(out.stderr).unwrap()
}

fn synth(dir: &Path, rows: &str) -> PathBuf {
    let f = dir.join(format!("q{rows}.gguf"));
    ok(&["synth", "--rows", rows, "--seed", "3", "-o", p(&f)]);
    f
}

/// Names in `dir` that look like pleio's temporary files (or the old
/// `.partial` ones).
fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".pleio-tmp") || n.ends_with(".partial"))
        .collect()
}

fn mkfifo(path: &Path) {
    let st = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(st.success(), "mkfifo {}", path.display());
}

/// A character device node like /dev/null, made in `dir` (root only).
fn null_device(dir: &Path) -> Option<PathBuf> {
    let node = dir.join("null-node");
    let st = Command::new("mknod")
        .args([p(&node), "c", "1", "3"])
        .stderr(Stdio::null())
        .status()
        .ok()?;
    st.success().then_some(node)
}

#[test]
fn devices_fifos_and_links_are_written_or_refused_never_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let f = synth(d, "2000");
    let want = {
        let out = d.join("want.f32");
        ok(&["gather", p(&f), "--rows", "1,2,3", "-o", p(&out)]);
        std::fs::read(&out).unwrap()
    };

    // `-` is standard output.
    let r = pleio(&["gather", p(&f), "--rows", "1,2,3", "-o", "-"]);
    assert!(r.status.success());
    assert_eq!(r.stdout, want);

    // A character device (a /dev/null twin), with and without --force,
    // through a symbolic link too (as /dev/stdout is): written, not
    // replaced; the link stays a link.
    if let Some(node) = null_device(d) {
        let link = d.join("null-link");
        std::os::unix::fs::symlink(&node, &link).unwrap();
        for out in [&node, &link] {
            ok(&["gather", p(&f), "--rows", "1", "-o", p(out), "--force"]);
            ok(&["gather", p(&f), "--rows", "1", "-o", p(out)]);
            ok(&["residency", p(&f), "--plot", p(out)]);
        }
        assert!(std::fs::metadata(&node)
            .unwrap()
            .file_type()
            .is_char_device());
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
    } else {
        pleio_testkit::skip_case!("not root: no device node to test with");
    }

    // A FIFO gets the bytes, and stays a FIFO.
    let fifo = d.join("fifo");
    mkfifo(&fifo);
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut v = Vec::new();
            std::fs::File::open(fifo)
                .unwrap()
                .read_to_end(&mut v)
                .unwrap();
            v
        })
    };
    ok(&[
        "gather",
        p(&f),
        "--rows",
        "1,2,3",
        "-o",
        p(&fifo),
        "--force",
    ]);
    assert_eq!(reader.join().unwrap(), want);
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());

    // A link to a regular file is refused with --force too: neither the
    // link nor its target changes.
    let target = d.join("target.f32");
    std::fs::write(&target, b"keep me").unwrap();
    let link = d.join("link.f32");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let err = fails(&["gather", p(&f), "--rows", "1", "-o", p(&link), "--force"]);
    assert!(err.contains("symbolic link"), "{err}");
    let err = fails(&["synth", "--rows", "1000", "-o", p(&link), "--force"]);
    assert!(err.contains("symbolic link"), "{err}");
    let err = fails(&["residency", p(&f), "--plot", p(&link)]);
    assert!(err.contains("symbolic link"), "{err}");
    assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());

    // A dangling link is not replaced either (nor created through).
    let dangling = d.join("dangling.f32");
    std::os::unix::fs::symlink(d.join("nowhere"), &dangling).unwrap();
    let err = fails(&["gather", p(&f), "--rows", "1", "-o", p(&dangling)]);
    assert!(err.contains("symbolic link"), "{err}");
    assert!(!d.join("nowhere").exists());

    // A directory is named as one.
    let sub = d.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let err = fails(&["gather", p(&f), "--rows", "1", "-o", p(&sub), "--force"]);
    assert!(err.contains("is a directory"), "{err}");
    assert!(temporaries(d).is_empty(), "{:?}", temporaries(d));
}

/// Starts `pleio` with `args` (stdout and stderr captured).
fn spawn(args: &[String]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_pleio"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Runs the writers at once; returns (exit code, stderr) of each.
fn race(writers: Vec<Vec<String>>) -> Vec<(Option<i32>, String)> {
    let children: Vec<Child> = writers.iter().map(|a| spawn(a)).collect();
    children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
        .collect()
}

/// Checks the outcome of a race: the file at the path is exactly one
/// successful writer's complete file (`expected[i]` is writer i's), and
/// every other writer failed saying its output was discarded. Without
/// `--force` exactly one writer can succeed (the path was absent, the
/// rename refuses to replace). With `--force` a writer that starts only
/// after another has landed (a loaded machine runs them one after another)
/// legitimately replaces that file, so more than one may succeed in turn;
/// the last one's file is the one there.
fn one_winner(results: &[(Option<i32>, String)], expected: &[Vec<u8>], landed: &[u8], force: bool) {
    let winners: Vec<usize> = (0..results.len())
        .filter(|&i| results[i].0 == Some(0))
        .collect();
    if force {
        assert!(!winners.is_empty(), "{results:?}");
    } else {
        assert_eq!(winners.len(), 1, "{results:?}");
    }
    assert!(
        winners.iter().any(|&w| landed == expected[w]),
        "no successful writer's file is the one there: {results:?}"
    );
    for (i, (code, err)) in results.iter().enumerate() {
        if !winners.contains(&i) {
            assert_eq!(*code, Some(2), "writer {i}: {err}");
            assert!(err.contains("discarded"), "writer {i}: {err}");
            assert!(
                landed != expected[i],
                "writer {i} failed but its file is there"
            );
        }
    }
}

#[test]
fn concurrent_synths_leave_one_complete_file_and_only_its_writer_succeeds() {
    let dir = disk_dir();
    let d = dir.path();
    let rows = "1500000"; // 129 MiB each: the writers overlap
                          // Each writer's file, written alone.
    let expected: Vec<Vec<u8>> = (1..=4)
        .map(|seed| {
            let f = d.join(format!("seed{seed}.gguf"));
            let s = seed.to_string();
            ok(&["synth", "--rows", rows, "--seed", &s, "-o", p(&f)]);
            let bytes = std::fs::read(&f).unwrap();
            std::fs::remove_file(&f).unwrap();
            bytes
        })
        .collect();
    let out = d.join("out.gguf");
    std::fs::write(&out, b"an older file").unwrap();
    let args = |seed: u32| -> Vec<String> {
        [
            "synth",
            "--rows",
            rows,
            "--seed",
            &seed.to_string(),
            "--force",
            "-o",
            p(&out),
        ]
        .map(String::from)
        .to_vec()
    };
    let results = race((1..=4).map(args).collect());
    one_winner(&results, &expected, &std::fs::read(&out).unwrap(), true);
    assert!(temporaries(d).is_empty(), "{:?}", temporaries(d));
}

#[test]
fn concurrent_gathers_leave_one_complete_file_and_only_its_writer_succeeds() {
    let dir = disk_dir();
    let d = dir.path();
    let f = synth(d, "300000");
    // Four lists of 100k rows (64 MB of floats each), each a rotation.
    let lists: Vec<PathBuf> = (0..4u64)
        .map(|k| {
            let list = d.join(format!("rows{k}.txt"));
            let ids: Vec<String> = (0..100_000u64)
                .map(|i| ((i * 7 + k * 1000) % 300_000).to_string())
                .collect();
            std::fs::write(&list, ids.join("\n")).unwrap();
            list
        })
        .collect();
    let expected: Vec<Vec<u8>> = lists
        .iter()
        .map(|l| {
            let o = d.join("alone.f32");
            ok(&["gather", p(&f), "--rows-file", p(l), "-o", p(&o), "--force"]);
            std::fs::read(&o).unwrap()
        })
        .collect();
    // Absent at the start: no --force needed, RENAME_NOREPLACE decides.
    let out = d.join("out.f32");
    for force in [false, true] {
        let args = |l: &PathBuf| -> Vec<String> {
            let mut a: Vec<String> = ["gather", p(&f), "--rows-file", p(l), "-o", p(&out)]
                .map(String::from)
                .to_vec();
            if force {
                a.push("--force".into());
            }
            a
        };
        let results = race(lists.iter().map(args).collect());
        one_winner(&results, &expected, &std::fs::read(&out).unwrap(), force);
        assert!(temporaries(d).is_empty(), "{:?}", temporaries(d));
    }
}

/// Sends `sig` to a `pleio synth` once its temporary file holds data, and
/// checks it died of it leaving no temporary file and no output.
fn interrupt_synth(sig: &str, signo: i32) {
    let dir = disk_dir();
    let d = dir.path();
    let out = d.join("big.gguf");
    // 40M rows: 3.4 GiB, far more than is written before the signal.
    let args = ["synth", "--rows", "40000000", "--force", "-o", p(&out)].map(String::from);
    let mut child = spawn(&args);
    let t0 = Instant::now();
    loop {
        let started = std::fs::read_dir(d).unwrap().any(|e| {
            let e = e.unwrap();
            e.file_name().to_string_lossy().ends_with(".pleio-tmp")
                && e.metadata().is_ok_and(|m| m.size() > 8 << 20)
        });
        if started {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "synth ended before it was signalled"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "synth never started writing"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let st = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(signo), "{status:?}");
    assert!(temporaries(d).is_empty(), "{:?}", temporaries(d));
    assert!(!out.exists());
}

#[test]
fn sigterm_during_synth_leaves_no_temporary_file() {
    interrupt_synth("-TERM", 15);
}

#[test]
fn sigint_during_synth_leaves_no_temporary_file() {
    interrupt_synth("-INT", 2);
}
