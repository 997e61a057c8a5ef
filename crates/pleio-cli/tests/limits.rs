//! Numbers and inputs past what pleio can hold: each is a clear error (exit
//! status 2 and a message) before anything that size is allocated, never a
//! panic, an abort or a machine out of memory; and each error names its
//! cause once.

mod common;

use common::{ok, p, pleio};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use pleio::gguf::GgufWriter;
use pleio::layout::PLE_TENSOR;
use pleio::quant::GgmlType;

/// Runs pleio, requires exit status 2, returns stderr.
fn fails(args: &[&str]) -> String {
    let out = pleio(args);
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "pleio {args:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

fn synth(dir: &Path, rows: &str) -> PathBuf {
    let f = dir.join(format!("q{rows}.gguf"));
    ok(&["synth", "--rows", rows, "--seed", "3", "-o", p(&f)]);
    f
}

/// The `ubatches` line of a text replay report.
fn stream_line(out: &str) -> &str {
    out.lines().find(|l| l.starts_with("stream ")).unwrap()
}

fn checksum(out: &str) -> &str {
    out.lines()
        .find_map(|l| l.split("checksum ").nth(1))
        .unwrap()
}

#[test]
fn replay_sizes_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let f = synth(dir.path(), "20000");
    let f = p(&f);
    let base = [f, "--corpus", "--prefill", "3000", "--decode", "4"];
    let run = |extra: &[&str]| ok(&[&["replay"], &base[..], extra].concat());

    // A ubatch larger than the prefill is the whole prefill, whatever the
    // number (these panicked or aborted allocating 100 GB).
    let whole = run(&["--ubatch", "3000"]);
    assert!(
        stream_line(&whole).contains("in 1 ubatches of 3000"),
        "{whole}"
    );
    for big in ["10000000", "36028797018963968", "18446744073709551615"] {
        let out = run(&["--ubatch", big]);
        assert_eq!(stream_line(&out), stream_line(&whole), "--ubatch {big}");
        assert_eq!(checksum(&out), checksum(&whole), "--ubatch {big}");
    }

    // Decode steps past the documented limit (these aborted allocating
    // 128 GB, or panicked with a capacity overflow).
    for big in ["1000000000", "18446744073709551615"] {
        let err = fails(&["replay", f, "--corpus", "--decode", big]);
        assert!(err.contains("more than 4194304 tokens"), "{err}");
    }
    let err = fails(&["replay", f, "--corpus", "--compute-ms", "1e300"]);
    assert!(err.contains("--compute-ms"), "{err}");
}

#[test]
fn a_ubatch_that_cannot_fit_in_memory_is_refused_before_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // gemma4 rows of 256000 floats (1 MB each); 4194304 one-token prefill:
    // a single ubatch would need 4 TB.
    let g = d.join("wide.gguf");
    ok(&[
        "synth",
        "--arch",
        "gemma4",
        "--layers",
        "1000",
        "--rows",
        "1000",
        "--sparse",
        "-o",
        p(&g),
    ]);
    let tokens = d.join("tokens.txt");
    std::fs::write(&tokens, "1\n".repeat(1 << 22)).unwrap();
    let err = fails(&[
        "replay",
        p(&g),
        "--tokens",
        p(&tokens),
        "--decode",
        "0",
        "--ubatch",
        "18446744073709551615",
    ]);
    assert!(err.contains("a ubatch of 4194304 tokens needs"), "{err}");
    assert!(err.contains("of memory"), "{err}");
    // One token more than the limit is refused when the stream is read.
    std::fs::write(&tokens, "1\n".repeat((1 << 22) + 1)).unwrap();
    let err = fails(&["replay", p(&g), "--tokens", p(&tokens)]);
    assert!(err.contains("more than 4194304"), "{err}");
}

#[test]
fn bench_and_synth_sizes_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let f = synth(dir.path(), "20000");
    // Aborted allocating 8 TB of row lists.
    let err = fails(&["bench", p(&f), "--rows", "1000000000000", "--cold", "none"]);
    assert!(
        err.contains("--rows 1000000000000") && err.contains("memory"),
        "{err}"
    );
    let err = fails(&[
        "bench",
        p(&f),
        "--rows",
        "16",
        "--batches",
        "18446744073709551615",
        "--cold",
        "none",
    ]);
    assert!(err.contains("memory"), "{err}");
    // 256 * layers wrapped silently.
    let g = dir.path().join("g.gguf");
    for layers in ["18446744073709551615", "4294967296", "0"] {
        let err = fails(&[
            "synth",
            "--arch",
            "gemma4",
            "--layers",
            layers,
            "--sparse",
            "-o",
            p(&g),
        ]);
        assert!(err.contains("gemma4 needs 1 to 4294967295 layers"), "{err}");
    }
    assert!(!g.exists());
}

/// A GGUF with only a PLE tensor of `ty` and `dims`, its data a sparse hole.
fn crafted(path: &Path, ty: GgmlType, dims: &[u64]) {
    let mut w = GgufWriter::create(path).unwrap();
    w.add_tensor(PLE_TENSOR, ty, dims).unwrap();
    w.begin_data().unwrap();
    let n = w.tensors()[0].n_bytes;
    w.skip_tensor_data(n).unwrap();
    w.finish().unwrap();
}

#[test]
fn gather_checks_ids_and_row_width_before_sizing_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = d.join("o.f32");
    // A header whose table has rows of 2^50 * 160 elements and no rows: the
    // output was sized (576 PB) before the id was checked.
    let f = d.join("wide-empty.gguf");
    crafted(&f, GgmlType::IQ4_NL, &[160 << 50, 0]);
    let err = fails(&["gather", p(&f), "--rows", "0", "-o", p(&out)]);
    assert!(err.contains("row 0 is out of range"), "{err}");
    // A valid table whose one row decodes to more than 1 GiB.
    let f = d.join("wide-row.gguf");
    crafted(&f, GgmlType::IQ1_S, &[(1 << 28) + 256, 1]);
    let err = fails(&["gather", p(&f), "--rows", "0", "-o", p(&out)]);
    assert!(err.contains("decodes to more than 1 GiB"), "{err}");
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(d).unwrap().count(), 2, "only the inputs");
}

#[test]
fn row_and_token_inputs_stop_at_their_limits() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let f = synth(d, "20000");
    let out = d.join("o.f32");
    // An endless item stops at once.
    let err = fails(&["gather", p(&f), "--rows-file", "/dev/zero", "-o", p(&out)]);
    assert!(
        err.contains("/dev/zero: item 1") && err.contains("is not a row id"),
        "{err}"
    );
    // An endless list of valid ids stops at 2^26 ids, within 2 GiB of
    // address space (it grew until the machine ran out).
    let mut child = Command::new("sh")
        .args([
            "-c",
            "ulimit -v 2097152 && exec \"$0\" gather \"$1\" --rows-file - -o \"$2\"",
            env!("CARGO_BIN_EXE_pleio"),
            p(&f),
            p(&out),
        ])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || {
        let chunk = "1\n".repeat(1 << 15);
        while stdin.write_all(chunk.as_bytes()).is_ok() {}
    });
    let res = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    let err = String::from_utf8_lossy(&res.stderr);
    assert_eq!(res.status.code(), Some(2), "{err}");
    assert!(err.contains("more than 67108864 ids"), "{err}");
    assert!(!out.exists());
    // Token and text inputs stop at 64 MiB.
    for opt in ["--tokens", "--text"] {
        let err = fails(&["rows", p(&f), opt, "/dev/zero"]);
        assert!(err.contains("longer than 64 MiB"), "{err}");
    }
}

#[test]
fn an_empty_row_list_is_an_error_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let f = synth(d, "2000");
    let out = d.join("o.f32");
    for text in ["", " \n", "[]"] {
        let list = d.join("empty.txt");
        std::fs::write(&list, text).unwrap();
        let err = fails(&["gather", p(&f), "--rows-file", p(&list), "-o", p(&out)]);
        assert!(err.contains("the row list is empty"), "{err}");
        assert!(!out.exists());
    }
}

#[test]
fn each_cause_is_printed_once_with_the_real_figures() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let f = synth(d, "20000");
    // The table runs past the end of a truncated file.
    let t = d.join("short.gguf");
    std::fs::copy(&f, &t).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&t)
        .unwrap()
        .set_len(100_000)
        .unwrap();
    let err = fails(&["gather", p(&t), "--rows", "1", "-o", p(&d.join("o.f32"))]);
    assert_eq!(err.matches("past the end of the file").count(), 1, "{err}");
    assert!(err.contains("(100000 bytes)"), "{err}");
    // A directory as the table is named as one, once.
    let sub = d.join("table.gguf");
    std::fs::create_dir(&sub).unwrap();
    for args in [
        vec!["gather", p(&sub), "--rows", "1", "-o", "/dev/null"],
        vec!["inspect", p(&sub)],
        vec!["residency", p(&sub)],
    ] {
        let err = fails(&args);
        assert_eq!(err.matches("is a directory").count(), 1, "{args:?}: {err}");
        assert!(!err.contains("No such device"), "{err}");
    }
    // A row list that is a directory.
    let err = fails(&["gather", p(&f), "--rows-file", p(&sub), "-o", "/dev/null"]);
    assert_eq!(err.matches("Is a directory").count(), 1, "{err}");
}
