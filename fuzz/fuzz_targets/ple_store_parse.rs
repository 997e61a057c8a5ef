//! mlx-vlm's `ple-store.json` on arbitrary bytes, opened from a directory
//! holding one data file: a manifest opens to an error or to a table whose
//! every shard part lies inside a regular file under the manifest's
//! directory; never a panic, a hang or an unbounded allocation.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use pleio::checkpoint::CheckpointTable;

/// The data file the seeds name.
const DATA: &str = "model.safetensors";
const DATA_LEN: usize = 64 << 10;

/// A private directory with the data file, made once per process.
fn dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("pleio-fuzz-ple-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).expect("a scratch directory");
        std::fs::write(d.join(DATA), vec![0x3fu8; DATA_LEN]).expect("the data file");
        d
    })
}

fuzz_target!(|data: &[u8]| {
    let d = dir();
    let manifest = d.join("ple-store.json");
    std::fs::write(&manifest, data).expect("writing the manifest");
    let Ok(t) = CheckpointTable::open(&manifest) else {
        return;
    };
    assert!(t.rows > 0 && !t.shards.is_empty());
    for s in &t.shards {
        for p in &s.parts {
            let f = &t.files[p.file];
            assert!(f.starts_with(d), "{} outside {}", f.display(), d.display());
            let len = std::fs::metadata(f).expect("a file").len();
            let end = s
                .rows
                .checked_mul(p.row_bytes)
                .and_then(|b| b.checked_add(p.offset))
                .expect("checked at open");
            assert!(end <= len, "{}: ..{end} past {len}", p.tensor);
            assert!(p.row_bytes > 0);
        }
    }
});
