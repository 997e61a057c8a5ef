//! The rounding rules through `Table`: checkpoints opened with
//! `OpenOptions::rounding`, every strategy and output type, against the
//! rules' plain scalar definitions on the bytes the writer generated; the
//! rules that do not apply are typed errors.

mod fetch_fixture;

use fetch_fixture::{CkptFixture, Fixture, Rng};
use pleio::quant::convert::{f32_to_bf16, f32_to_f16};
use pleio::quant::encoding::{e4m3_to_f32, Encoding, Fp8Scale, ScaleType, NVFP4_VALUES};
use pleio::{Dtype, ErrorKind, OpenOptions, Rounding, Strategy, Table};
use pleio_lab::synth_ckpt::{CkptEncoding, CkptSpec};

fn bf16_value(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// The f32 value of finite IEEE half bits, from the definition.
fn f16_value(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (i32::from(h >> 10 & 0x1F), f64::from(h & 0x3FF));
    assert!(e != 31, "finite halves only");
    let v = if e == 0 {
        m * 2f64.powi(-24)
    } else {
        (1.0 + m / 1024.0) * 2f64.powi(e - 15)
    };
    (sign * v) as f32
}

/// `x` rounded to the 16-bit type and back.
fn round16(x: f32, bf16: bool) -> f32 {
    if bf16 {
        bf16_value(f32_to_bf16(x))
    } else {
        f16_value(f32_to_f16(x))
    }
}

fn put(out: &mut Vec<u8>, dtype: Dtype, v: f32) {
    match dtype {
        Dtype::F32 => out.extend(v.to_le_bytes()),
        Dtype::Bf16 => out.extend(f32_to_bf16(v).to_le_bytes()),
        Dtype::F16 => out.extend(f32_to_f16(v).to_le_bytes()),
        other => panic!("no values for {other}"),
    }
}

/// The rule's output for one stored row (its parts concatenated), from
/// the formulas of `pleio::Rounding`.
fn by_definition(enc: Encoding, rule: Rounding, dtype: Dtype, raw: &[u8], out: &mut Vec<u8>) {
    let half = dtype != Dtype::F32;
    let bf16 = dtype == Dtype::Bf16;
    match enc {
        Encoding::Fp8(scale) => {
            let s = match scale {
                Fp8Scale::PerTensor(s) => s,
                Fp8Scale::PerRow(ScaleType::Bf16) => {
                    bf16_value(u16::from_le_bytes([raw[160], raw[161]]))
                }
                other => panic!("no fixture writes {other:?}"),
            };
            let s = if rule == Rounding::Vllm && half {
                round16(s, bf16)
            } else {
                s
            };
            for &q in &raw[..160] {
                put(out, dtype, e4m3_to_f32(q) * s);
            }
        }
        Encoding::Mlx4 => {
            let (words, rest) = raw.split_at(80);
            let (scales, biases) = rest.split_at(10);
            for j in 0..160 {
                let w = u32::from_le_bytes(words[4 * (j / 8)..4 * (j / 8) + 4].try_into().unwrap());
                let q = ((w >> (4 * (j % 8))) & 15) as f32;
                let g = j / 32;
                let s = bf16_value(u16::from_le_bytes([scales[2 * g], scales[2 * g + 1]]));
                let b = bf16_value(u16::from_le_bytes([biases[2 * g], biases[2 * g + 1]]));
                let y = if rule == Rounding::Mlx {
                    round16(round16(s * q, true) + b, true)
                } else {
                    s * q + b
                };
                put(out, dtype, y);
            }
        }
        Encoding::Nvfp4 { global_scale: g } => {
            for j in 0..160 {
                let v = NVFP4_VALUES[usize::from((raw[j / 2] >> (4 * (j % 2))) & 15)];
                let e = e4m3_to_f32(raw[80 + j / 16]);
                let y = if rule == Rounding::Vllm {
                    v * (e * g)
                } else {
                    (v * e) * g
                };
                put(out, dtype, y);
            }
        }
        Encoding::Bf16 => {
            for b in raw.chunks_exact(2) {
                put(out, dtype, bf16_value(u16::from_le_bytes([b[0], b[1]])));
            }
        }
        other => panic!("no definition for {other:?}"),
    }
}

fn rows(n: u64) -> Vec<u64> {
    let mut rng = Rng::new(3);
    let mut v: Vec<u64> = (0..300).map(|_| rng.below(n)).collect();
    v.extend([0, n - 1, 5, 5, n - 1, 0]);
    v
}

/// Every strategy and output type of `fx` under `rule` gives the
/// definition's bytes; returns the share of 16-bit elements (bf16, f16)
/// that differ from the exact rule.
fn check(name: &str, fx: &CkptFixture, rule: Rounding) -> [f64; 2] {
    let enc = fx.spec.row_encoding();
    let ids = rows(fx.rows);
    let raw = fx.reference_raw(&ids);
    let rb = raw.len() / ids.len();
    let table = OpenOptions::new().rounding(rule).open(&fx.path).unwrap();
    assert_eq!(table.rounding(), rule);
    let exact = Table::open(&fx.path).unwrap();
    let mut shares = [0.0; 2];
    for &dtype in Dtype::ALL {
        let want = if dtype == Dtype::Raw {
            raw.clone()
        } else {
            let mut w = Vec::new();
            for r in raw.chunks_exact(rb) {
                by_definition(enc, rule, dtype, r, &mut w);
            }
            w
        };
        for &s in Strategy::ALL {
            let mut got = vec![0xA5u8; table.out_bytes(dtype, ids.len()).unwrap()];
            table.gather_as_with(s, dtype, &ids, &mut got).unwrap();
            assert!(
                got == want,
                "{name}: {rule} {dtype} {s} differs from the definition"
            );
        }
        if dtype == Dtype::F32 {
            let mut f = vec![0f32; ids.len() * 160];
            table.gather(&ids, &mut f).unwrap();
            let b: Vec<u8> = f.iter().flat_map(|x| x.to_le_bytes()).collect();
            assert!(b == want, "{name}: {rule} gather (f32 slice) differs");
        }
        let k = match dtype {
            Dtype::Bf16 => 0,
            Dtype::F16 => 1,
            _ => continue,
        };
        let mut e = vec![0u8; want.len()];
        exact.gather_as(dtype, &ids, &mut e).unwrap();
        let differ = e
            .chunks_exact(2)
            .zip(want.chunks_exact(2))
            .filter(|(a, b)| a != b)
            .count();
        shares[k] = differ as f64 / (want.len() / 2) as f64;
    }
    shares
}

#[test]
fn vllm_rule_on_fp8_tables_every_strategy() {
    // Realistic: a scale near 2e-4 that bf16 and f16 cannot hold.
    let f32_scale = CkptFixture::of_spec(CkptSpec {
        shards: 8,
        fp8_scale_f32_bits: Some(0x3951_b717),
        ..CkptSpec::new(CkptEncoding::Fp8, 4000, 3, 31)
    });
    let [bf, f16] = check("fp8, f32 table scale", &f32_scale, Rounding::Vllm);
    assert!(bf > 0.2, "vllm bf16 differs from exact on only {bf}");
    assert!(f16 > 0.01, "vllm f16 differs from exact on only {f16}");
    // BF16 scales are already rounded: vllm's bf16 output is exact's.
    for enc in [CkptEncoding::Fp8, CkptEncoding::Fp8Row] {
        let fx = CkptFixture::new(enc, 3000, 8, 2, 32);
        let [bf, _] = check(enc.name(), &fx, Rounding::Vllm);
        assert_eq!(bf, 0.0, "{}", enc.name());
        check(enc.name(), &fx, Rounding::Exact);
    }
    let bf16 = CkptFixture::new(CkptEncoding::Bf16, 3000, 8, 2, 33);
    assert_eq!(check("bf16 rows", &bf16, Rounding::Vllm), [0.0, 0.0]);
    assert_eq!(check("bf16 rows", &bf16, Rounding::Mlx), [0.0, 0.0]);
}

#[test]
fn vllm_rule_on_nvfp4_tables_every_strategy() {
    // The global scale written (1/2688) is not a power of two, so the two
    // orders of the products differ in f32.
    let fx = CkptFixture::new(CkptEncoding::Nvfp4, 3000, 8, 2, 35);
    check("nvfp4", &fx, Rounding::Vllm);
    check("nvfp4", &fx, Rounding::Exact);
    let ids = rows(fx.rows);
    let gather = |rule| {
        let t = OpenOptions::new().rounding(rule).open(&fx.path).unwrap();
        let mut f = vec![0f32; ids.len() * 160];
        t.gather(&ids, &mut f).unwrap();
        f
    };
    let (v, e) = (gather(Rounding::Vllm), gather(Rounding::Exact));
    let differ = v
        .iter()
        .zip(&e)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert!(
        differ * 100 > v.len(),
        "vllm nvfp4 f32 differs from exact on only {differ} of {}",
        v.len()
    );
}

#[test]
fn an_nvfp4_table_scale_serves_what_per_shard_scales_do() {
    // `pleio synth --nvfp4-scale-2 table`: vLLM 0.33's layout, one
    // table-level global scale; same rows, same values, every rule.
    let fx = |table| {
        CkptFixture::of_spec(CkptSpec {
            shards: 8,
            nvfp4_table_scale: table,
            ..CkptSpec::new(CkptEncoding::Nvfp4, 3000, 2, 36)
        })
    };
    let (shard, table) = (fx(false), fx(true));
    let names = |f: &CkptFixture| -> Vec<String> {
        let mut n = Vec::new();
        for e in std::fs::read_dir(&f.path).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "safetensors") {
                let st = pleio::safetensors::SafetensorsFile::open(&p).unwrap();
                n.extend(
                    st.tensors()
                        .iter()
                        .map(|t| t.name.clone())
                        .filter(|n| n.ends_with("weight_scale_2")),
                );
            }
        }
        n
    };
    let (ns, nt) = (names(&shard), names(&table));
    assert_eq!(ns.len(), 8, "{ns:?}");
    assert!(
        nt.len() == 1 && nt[0].ends_with("ngram_embedding.weight_scale_2"),
        "{nt:?}"
    );
    check("nvfp4, table scale", &table, Rounding::Vllm);
    let ids = rows(shard.rows);
    for rule in [Rounding::Exact, Rounding::Vllm] {
        let gather = |f: &CkptFixture| {
            let t = OpenOptions::new().rounding(rule).open(&f.path).unwrap();
            let mut out = vec![0u8; t.out_bytes(Dtype::F32, ids.len()).unwrap()];
            t.gather_as(Dtype::F32, &ids, &mut out).unwrap();
            out
        };
        assert!(gather(&shard) == gather(&table), "{rule:?}");
    }
}

#[test]
fn mlx_rule_on_mlx4_tables_every_strategy() {
    let fx = CkptFixture::new(CkptEncoding::Mlx4, 3000, 8, 3, 34);
    let [bf, _] = check("mlx4", &fx, Rounding::Mlx);
    assert!(bf > 0.05, "mlx bf16 differs from exact on only {bf}");
    check("mlx4", &fx, Rounding::Exact);
}

#[test]
fn with_rounding_swaps_the_rule_of_one_handle() {
    let fx = CkptFixture::of_spec(CkptSpec {
        shards: 4,
        fp8_scale_f32_bits: Some(2.7e-4f32.to_bits()),
        ..CkptSpec::new(CkptEncoding::Fp8, 2000, 1, 35)
    });
    let ids = rows(fx.rows);
    let gather = |t: &Table| {
        let mut out = vec![0u8; t.out_bytes(Dtype::Bf16, ids.len()).unwrap()];
        t.gather_as(Dtype::Bf16, &ids, &mut out).unwrap();
        out
    };
    let exact = Table::open(&fx.path).unwrap();
    let before = exact.clone();
    let vllm = exact.with_rounding(Rounding::Vllm).unwrap();
    assert_eq!(vllm.rounding(), Rounding::Vllm);
    assert_eq!(before.rounding(), Rounding::Exact);
    let clone = vllm.clone();
    assert_ne!(gather(&vllm), gather(&before));
    assert_eq!(gather(&clone), gather(&vllm));
    // Back to exact: the rules do not stack.
    let back = vllm.with_rounding(Rounding::Exact).unwrap();
    assert_eq!(gather(&back), gather(&before));
    let again = back.with_rounding(Rounding::Vllm).unwrap();
    assert_eq!(gather(&again), gather(&clone));
}

#[test]
fn rules_that_do_not_apply_are_unsupported_errors() {
    let gguf = Fixture::qwen(2000, 36);
    let fp8 = CkptFixture::new(CkptEncoding::Fp8, 2000, 4, 1, 37);
    let nvfp4 = CkptFixture::new(CkptEncoding::Nvfp4, 2000, 4, 1, 38);
    let mlx4 = CkptFixture::new(CkptEncoding::Mlx4, 2000, 4, 1, 39);
    let cases: [(&std::path::Path, Rounding, &[&str]); 5] = [
        (
            gguf.file.path(),
            Rounding::Vllm,
            &["vllm", "GGUF", "IQ4_NL"],
        ),
        (gguf.file.path(), Rounding::Mlx, &["mlx", "GGUF"]),
        (&fp8.path, Rounding::Mlx, &["mlx", "fp8"]),
        (&nvfp4.path, Rounding::Mlx, &["mlx", "nvfp4"]),
        (&mlx4.path, Rounding::Vllm, &["vllm", "mlx4"]),
    ];
    for (path, rule, words) in cases {
        let e = OpenOptions::new().rounding(rule).open(path).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
        let msg = e.to_string();
        for w in words {
            assert!(msg.contains(w), "{msg:?} does not name {w:?}");
        }
        // The same through an open handle, which is consumed, not changed.
        let t = Table::open(path).unwrap();
        let e = t.with_rounding(rule).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    }
    // Exact applies to everything.
    for p in [gguf.file.path(), &fp8.path, &nvfp4.path, &mlx4.path] {
        let t = OpenOptions::new()
            .rounding(Rounding::Exact)
            .open(p)
            .unwrap();
        assert_eq!(t.rounding(), Rounding::Exact);
    }
}
