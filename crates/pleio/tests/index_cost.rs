//! Opening a checkpoint through its `model.safetensors.index.json` costs a
//! fixed number of allocations per index entry, counted (not timed): one,
//! the tensor name the catalog keeps. Issue 26: a 3M-entry index took 30 s
//! (10 s of CPU) per open: every entry's two strings allocated by the JSON
//! parser, its name cloned into the index's map, then copied again into a
//! second map for the catalog, and its file name checked again each time.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use pleio_lab::synth_ckpt::{write_checkpoint, CkptEncoding, CkptSpec};

/// The system allocator, counting allocations.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator, which
// upholds GlobalAlloc's contract; the counter has no effect on memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's layout, forwarded.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Adds `extra` entries (all in the checkpoint's first file, names the
/// table search ignores) to the checkpoint's index.
fn pad_index(dir: &Path, extra: usize) {
    let p = dir.join("model.safetensors.index.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    let map = v["weight_map"].as_object_mut().unwrap();
    let first = map.values().next().unwrap().clone();
    for i in 0..extra {
        map.insert(
            format!("model.layers.{}.experts.{i}.weight", i % 64),
            first.clone(),
        );
    }
    std::fs::write(&p, v.to_string()).unwrap();
}

/// Allocations of one `Table::open` of `dir`.
fn allocations_of_open(dir: &Path) -> u64 {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let t = pleio::Table::open(dir).unwrap();
    let n = ALLOCATIONS.load(Ordering::Relaxed) - before;
    drop(t);
    n
}

#[test]
fn an_index_costs_one_allocation_per_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let mut counts = Vec::new();
    for (k, extra) in [20_000usize, 60_000].into_iter().enumerate() {
        let dir = tmp.path().join(format!("ck{k}"));
        let spec = CkptSpec {
            shards: 2,
            ..CkptSpec::new(CkptEncoding::Bf16, 2000, 2, 3)
        };
        write_checkpoint(&spec, &dir, &mut |_| {}).unwrap();
        pad_index(&dir, extra);
        allocations_of_open(&dir); // first use of lazily made statics
        counts.push((extra, allocations_of_open(&dir)));
    }
    let ((n0, a0), (n1, a1)) = (counts[0], counts[1]);
    let per_entry = (a1 - a0) as f64 / (n1 - n0) as f64;
    // One allocation per entry (its name), plus the maps' few doublings.
    // Before: 4 per entry.
    assert!(
        per_entry < 1.2,
        "{per_entry:.2} allocations per index entry ({a0} for {n0} extra entries, {a1} for {n1})"
    );
}
