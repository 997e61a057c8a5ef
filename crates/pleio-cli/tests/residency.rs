//! `pleio residency` end to end: an evicted table shows (almost) nothing
//! resident and scanning keeps it so; a table read in full shows all of it.

mod common;

use common::{disk_dir, ok, p, pleio};
use std::path::{Path, PathBuf};

use serde_json::Value;

fn scan(f: &Path) -> Value {
    serde_json::from_str(&ok(&["residency", "--json", p(f)])).unwrap()
}

fn fraction(v: &Value) -> f64 {
    v["resident_fraction"].as_f64().unwrap()
}

fn synth(dir: &Path) -> PathBuf {
    let f = dir.join("t.gguf");
    // 3M rows of 90 bytes: 257 MiB, far above the readahead window (8 MiB
    // here) that opening the file reads around its header. Sparse: the
    // table reads as zero blocks, whose pages are cached like any others.
    ok(&["synth", "--rows", "3000000", "--sparse", "-o", p(&f)]);
    f
}

fn evict(f: &Path) {
    let file = std::fs::File::open(f).unwrap();
    file.sync_all().unwrap();
    let len = file.metadata().unwrap().len();
    pleio::sys::evict(&file, 0..len).unwrap();
}

#[test]
fn evicted_then_read_table() {
    if pleio::sys::NOOP {
        pleio_testkit::skip!("no page-cache calls in this build");
    }
    let dir = disk_dir();
    let f = synth(dir.path());

    evict(&f);
    let cold = scan(&f);
    assert_eq!(cold["tensor"], "per_layer_token_embd.weight");
    assert_eq!(cold["bytes"], 3000000 * 90);
    assert_eq!(cold["buckets"].as_array().unwrap().len(), 64);
    // The snapshot is taken before the file is opened: nothing resident.
    assert!(fraction(&cold) < 0.05, "{cold}");
    assert_eq!(cold["resident_pages"], 0, "{cold}");
    // Scanning reads nothing. Opening the model for the table's geometry
    // reads its header, and the kernel reads around that: later scans may
    // see that window (at the table's start), nothing more.
    for _ in 0..2 {
        let again = scan(&f);
        assert!(fraction(&again) < 0.05, "{again}");
        let b = again["buckets"].as_array().unwrap();
        assert!(b[b.len() / 2..].iter().all(|x| x == 0.0), "{again}");
    }

    std::fs::read(&f).unwrap();
    let hot = scan(&f);
    assert!(fraction(&hot) > 0.95, "{hot}");
    assert!(hot["resident_bytes"].as_u64().unwrap() > 3000000 * 90 * 95 / 100);

    let text = ok(&["residency", "--buckets", "16", p(&f)]);
    assert!(text.contains("resident: 100.0%"), "{text}");
    assert!(text.contains(&format!("|{}|", "█".repeat(16))), "{text}");
}

#[test]
fn half_read_table_shows_where() {
    if pleio::sys::NOOP {
        pleio_testkit::skip!("no page-cache calls in this build");
    }
    let dir = disk_dir();
    let f = synth(dir.path());
    let info: Value = serde_json::from_str(&ok(&["inspect", "--json", p(&f)])).unwrap();
    let offset = info["table"]["offset"].as_u64().unwrap();
    let bytes = info["table"]["bytes"].as_u64().unwrap();
    evict(&f);
    // Read the second half of the table.
    {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = std::fs::File::open(&f).unwrap();
        file.seek(SeekFrom::Start(offset + bytes / 2)).unwrap();
        let mut rest = Vec::new();
        file.read_to_end(&mut rest).unwrap();
    }
    let svg = dir.path().join("heat.svg");
    let r: Value = serde_json::from_str(&ok(&[
        "residency",
        "--json",
        "--buckets",
        "10",
        "--plot",
        p(&svg),
        p(&f),
    ]))
    .unwrap();
    let b: Vec<f64> = r["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(b.len(), 10);
    assert!((0.45..0.55).contains(&fraction(&r)), "{r}");
    // Only the header's readahead may show in the first half.
    assert!(b[1..5].iter().all(|&x| x == 0.0), "{b:?}");
    assert!(b[5..].iter().all(|&x| x == 1.0), "{b:?}");
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.starts_with("<svg"), "{chart:.100}");
    assert!(chart.contains("page-cache residency of per_layer_token_embd.weight"));
}

#[test]
fn errors_name_the_problem() {
    let dir = disk_dir();
    let f = synth(dir.path());
    let out = pleio(&["residency", "--tensor", "nope", p(&f)]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no tensor named \"nope\""), "{err}");
    let out = pleio(&["residency", "--buckets", "0", p(&f)]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--buckets"));
}
