//! PLE layers: a checkpoint with several PLE tables opens each by its
//! decoder layer (rows equal to the bytes written, row ids equal to a
//! straightforward re-derivation of transformers' per-layer hash), `None`
//! opens the lowest and reports them all, a layer without a table is a
//! typed error; vLLM (ceil) and mlx-vlm (divmod) shard shapes; a GGUF
//! file's `qwen4exp.ple.layers`.

use std::fs::File;
use std::io::BufWriter;
use std::os::unix::fs::FileExt;

use pleio::checkpoint::CheckpointTable;
use pleio::ngram::RowMapper;
use pleio::{ErrorKind, OpenOptions};
use pleio_lab::synth::SynthSpec;
use pleio_lab::synth_ckpt::{
    fill_part, layer_seed, part_rng, write_checkpoint, CkptEncoding, CkptSpec, ShardRows,
};

/// The bytes the writer generated for part `part` of shard `shard` of the
/// layer whose rows `seed` seeds.
fn part_bytes(enc: CkptEncoding, seed: u64, shard: usize, part: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_part(enc, part, &mut part_rng(seed, shard, part), &mut v);
    v
}

// ---- an independent derivation of the row ids (transformers 5.19,
// ---- modeling_qwen4_exp.py: _build_layer_multipliers,
// ---- _find_nth_prime_after, Qwen4ExpTextNGramEmbedding)

fn splitmix(v: u64) -> u64 {
    let mut z = v.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn is_prime(n: u64) -> bool {
    n >= 2
        && (2..)
            .take_while(|d| d * d <= n)
            .all(|d| !n.is_multiple_of(d))
}

fn nth_prime_after(start: u64, count: u64) -> u64 {
    let mut p = start;
    for _ in 0..count {
        p += 1;
        while !is_prime(p) {
            p += 1;
        }
    }
    p
}

struct Derived {
    mult: Vec<u64>,
    sizes: Vec<u64>,
    offsets: Vec<u64>,
    rows: u64,
}

fn derive(base: u64, index: u64, vocab: u64, seed: u64) -> Derived {
    let half = ((i64::MAX as u64) / vocab / 2).max(1);
    let base_seed = seed + 10007 * index;
    let mult = (0..3u64)
        .map(|i| {
            2 * (splitmix(base_seed.wrapping_add(0x9E37_79B9_7F4A_7C15u64.wrapping_mul(i + 1)))
                % half)
                + 1
        })
        .collect();
    let sizes: Vec<u64> = (0..16)
        .map(|h| nth_prime_after(base - 1, index * 16 + h + 1))
        .collect();
    let mut offsets = Vec::new();
    let mut total = 0;
    for s in &sizes {
        offsets.push(total);
        total += s;
    }
    Derived {
        mult,
        sizes,
        offsets,
        rows: total.div_ceil(128) * 128,
    }
}

/// Row ids of one fresh sequence, token-major.
fn rows_of(d: &Derived, tokens: &[u64], eos: u64) -> Vec<u64> {
    let mut out = Vec::new();
    for p in 0..tokens.len() {
        let mut ctx = vec![tokens[p]];
        let mut stopped = false;
        for s in 1..3 {
            if !stopped && (p < s || tokens[p - s] == eos) {
                stopped = true;
            }
            ctx.push(if stopped { eos } else { tokens[p - s] });
        }
        for n in 2..=3 {
            let mut mixed = ctx[0].wrapping_mul(d.mult[0]);
            for (c, m) in ctx[1..n].iter().zip(&d.mult[1..n]) {
                mixed ^= c.wrapping_mul(*m);
            }
            for g in 0..8 {
                let h = (n - 2) * 8 + g;
                out.push(mixed % d.sizes[h] + d.offsets[h]);
            }
        }
    }
    out
}

const TOKENS: [u32; 7] = [9707, 11, 1879, 248_044, 100, 200, 300];

/// Opens every layer of the checkpoint `spec` wrote at `dir` and checks
/// rows, bytes and row ids.
fn check_layers(spec: &CkptSpec, dir: &std::path::Path) {
    let layout = spec.layout().unwrap();
    let want_layers: Vec<u64> = layout.layers.iter().map(|l| l.layer).collect();
    for (index, l) in layout.layers.iter().enumerate() {
        let t = OpenOptions::new().layer(l.layer).open(dir).unwrap();
        assert_eq!(t.layer(), Some(l.layer));
        assert_eq!(t.ple_layers(), want_layers);
        let ck = t.checkpoint().unwrap();
        assert_eq!(ck.ple_layer_index().unwrap(), index as u64);
        assert_eq!(ck.prefix, spec.encoding.prefix(l.layer));
        // The geometry transformers derives for this PLE layer index.
        let d = derive(layout.vocab_base, index as u64, 248_320, 1234);
        assert_eq!(t.rows(), d.rows, "layer {}", l.layer);
        assert_eq!(t.rows(), l.rows);
        let shard_rows: Vec<u64> = ck.shards.iter().map(|s| s.rows).collect();
        assert_eq!(shard_rows, l.shard_rows);
        assert_eq!(ck.buffers.layer_multipliers.as_ref(), Some(&d.mult));
        assert_eq!(ck.buffers.head_vocab_sizes.as_ref(), Some(&d.sizes));
        assert_eq!(ck.buffers.head_offsets.as_ref(), Some(&d.offsets));
        // Row ids.
        let mapper = t.row_ids().unwrap();
        let q = mapper.qwen().unwrap();
        assert_eq!(q.multipliers(), d.mult.as_slice());
        let mut got = Vec::new();
        mapper.sequence().map_tokens(&TOKENS, &mut got).unwrap();
        let toks: Vec<u64> = TOKENS.iter().map(|&t| u64::from(t)).collect();
        assert_eq!(got, rows_of(&d, &toks, 248_044), "layer {}", l.layer);
        // Bytes: every sampled row's parts equal the generated tensors,
        // and (BF16) the gathered f32 values are those bytes widened.
        let files: Vec<File> = ck.files.iter().map(|f| File::open(f).unwrap()).collect();
        let part_len = ck.decoder().unwrap().part_bytes().as_slice().to_vec();
        let starts = l.shard_starts();
        let mut rows: Vec<u64> = (0..t.rows()).step_by(331).collect();
        for (i, &s) in starts.iter().enumerate() {
            rows.extend([s, s + l.shard_rows[i] - 1]);
        }
        rows.extend(got.iter().copied());
        for &r in &rows {
            let shard = starts.partition_point(|&s| s <= r) - 1;
            let local = (r - starts[shard]) as usize;
            let ext = ck.row_extents(r).unwrap();
            for (p, e) in ext.as_slice().iter().enumerate() {
                let mut b = vec![0u8; e.len as usize];
                files[e.file].read_exact_at(&mut b, e.offset).unwrap();
                let all = part_bytes(
                    spec.encoding,
                    layer_seed(spec.seed, index as u64),
                    shard,
                    p,
                    l.shard_rows[shard] as usize * part_len[p],
                );
                assert_eq!(
                    b,
                    &all[local * part_len[p]..(local + 1) * part_len[p]],
                    "layer {} row {r} part {p}",
                    l.layer
                );
            }
        }
        if spec.encoding == CkptEncoding::Bf16 {
            let mut out = vec![0f32; rows.len() * 160];
            t.gather(&rows, &mut out).unwrap();
            for (k, &r) in rows.iter().enumerate() {
                let shard = starts.partition_point(|&s| s <= r) - 1;
                let local = (r - starts[shard]) as usize;
                let all = part_bytes(
                    CkptEncoding::Bf16,
                    layer_seed(spec.seed, index as u64),
                    shard,
                    0,
                    l.shard_rows[shard] as usize * 320,
                );
                let want: Vec<f32> = all[local * 320..(local + 1) * 320]
                    .chunks_exact(2)
                    .map(|h| f32::from_bits(u32::from(u16::from_le_bytes([h[0], h[1]])) << 16))
                    .collect();
                let got: Vec<u32> = out[k * 160..(k + 1) * 160]
                    .iter()
                    .map(|v| v.to_bits())
                    .collect();
                let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "layer {} row {r}", l.layer);
            }
        }
    }
}

#[test]
fn two_layer_checkpoint_opens_each_layer() {
    let tmp = tempfile::tempdir().unwrap();
    for enc in [CkptEncoding::Bf16, CkptEncoding::Mlx4, CkptEncoding::Fp8] {
        let spec = CkptSpec {
            shards: 8,
            ple_layers: vec![1, 3],
            ..CkptSpec::new(enc, 6000, 3, 7)
        };
        let dir = tmp.path().join(enc.name());
        write_checkpoint(&spec, &dir, &mut |_| {}).unwrap();
        check_layers(&spec, &dir);
        // The layers' tables differ in size (later primes) and in rows.
        let layout = spec.layout().unwrap();
        assert!(layout.layers[1].rows > layout.layers[0].rows);

        // None: the lowest layer, and the list of all.
        let t = pleio::Table::open(&dir).unwrap();
        assert_eq!(t.layer(), Some(0));
        assert_eq!(t.ple_layers(), vec![0, 2]);
        assert_eq!(t.rows(), layout.layers[0].rows);
        let ck = CheckpointTable::open_layer(&dir, None).unwrap();
        assert_eq!((ck.layer, ck.ple_layers.clone()), (Some(0), vec![0, 2]));

        // A layer without a table: NoTable, naming the layers.
        for bad in [1, 3, 1 << 40] {
            let e = OpenOptions::new().layer(bad).open(&dir).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::NoTable, "{e}");
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("layer {bad}")) && msg.contains("[0, 2]"),
                "{msg}"
            );
            assert!(msg.contains(&dir.display().to_string()), "{msg}");
        }
    }
}

#[test]
fn uneven_shards_ceil_and_divmod() {
    let tmp = tempfile::tempdir().unwrap();
    for (rule, enc) in [
        (ShardRows::Ceil, CkptEncoding::Bf16),
        (ShardRows::Divmod, CkptEncoding::Bf16),
        (ShardRows::Ceil, CkptEncoding::Nvfp4),
        (ShardRows::Divmod, CkptEncoding::Mlx4),
    ] {
        let spec = CkptSpec {
            shards: 5,
            shard_rows: rule,
            ple_layers: vec![2, 4],
            ..CkptSpec::new(enc, 6000, 2, 11)
        };
        let layout = spec.layout().unwrap();
        for l in &layout.layers {
            let (rows, parts) = (l.rows, 5u64);
            assert_ne!(
                rows % parts,
                0,
                "the test needs rows that are not a multiple"
            );
            let big = rows.div_ceil(parts);
            let want: Vec<u64> = match rule {
                ShardRows::Ceil => (0..parts).map(|i| big.min(rows - i * big)).collect(),
                _ => (0..parts)
                    .map(|i| rows / parts + u64::from(i < rows % parts))
                    .collect(),
            };
            assert_eq!(l.shard_rows, want);
            assert_eq!(want.iter().sum::<u64>(), rows);
        }
        let dir = tmp.path().join(format!("{}-{}", rule.name(), enc.name()));
        write_checkpoint(&spec, &dir, &mut |_| {}).unwrap();
        check_layers(&spec, &dir);
    }
}

#[test]
fn gguf_layer_is_its_ple_layers_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("q.gguf");
    let spec = SynthSpec {
        sparse: true,
        ..SynthSpec::qwen(pleio::quant::GgmlType::IQ4_NL, 1 << 16, 3)
    };
    spec.write(BufWriter::new(File::create(&path).unwrap()), &mut |_| {})
        .unwrap();
    // synth writes qwen4exp.ple.layers = [1], as the release.
    let t = pleio::Table::open(&path).unwrap();
    assert_eq!((t.layer(), t.ple_layers()), (Some(1), vec![1]));
    let t = OpenOptions::new().layer(1).open(&path).unwrap();
    assert_eq!(t.layer(), Some(1));
    t.row_ids().unwrap();
    let e = OpenOptions::new().layer(0).open(&path).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoTable, "{e}");
    assert!(
        e.to_string().contains("layer 0") && e.to_string().contains("[1]"),
        "{e}"
    );
    // A layer together with a tensor name is refused.
    let e = OpenOptions::new()
        .layer(1)
        .tensor("per_layer_token_embd.weight")
        .open(&path)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    // gemma4 has one table for every layer: a layer is refused.
    let g = tmp.path().join("g.gguf");
    let spec = SynthSpec {
        sparse: true,
        ..SynthSpec::gemma(pleio::quant::GgmlType::Q8_0, 64, 2, 3)
    };
    spec.write(BufWriter::new(File::create(&g).unwrap()), &mut |_| {})
        .unwrap();
    let t = pleio::Table::open(&g).unwrap();
    assert_eq!((t.layer(), t.ple_layers()), (None, vec![]));
    assert!(OpenOptions::new().layer(0).open(&g).is_err());
}
