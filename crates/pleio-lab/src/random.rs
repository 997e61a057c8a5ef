//! Seeded random *valid* blocks of every decodable type, for tests,
//! benchmarks and `synth`.
//!
//! A block is random bytes with every scale field mapped to a finite value of
//! sensible magnitude, so that decoding gives finite floats. The byte stream
//! is fully specified, so `scripts/golden.py` reproduces it bit for bit:
//!
//! 1. `out` is filled with consecutive [`Rng`] (SplitMix64) outputs,
//!    each written little-endian; a tail shorter than 8 bytes takes the low
//!    bytes of one more output. Exactly `out.len().div_ceil(8)` outputs are
//!    drawn.
//! 2. Each block's scale fields are rewritten in place from their own random
//!    bits (no further draws), by the rules below. Offsets are those of the
//!    block structs in ggml's `ggml-common.h`.
//!
//! | field | rule |
//! | --- | --- |
//! | f16 scale (`d`, `dmin`, `m`) | sign and 10 mantissa bits kept; the 5-bit exponent `e` becomes `5 + (e * 12 >> 5)`, so \|x\| is in [2^-10, 2^2) |
//! | E8M0 byte (MXFP4 `e`) | `b` becomes `100 + (b * 41 >> 8)`, in 100..=140 |
//! | UE4M3 byte (NVFP4 `d[4]`) | `b` becomes `b * 127 >> 8`, in 0..=126 (never the 0x7F NaN code nor bit 7) |
//! | IQ1_M f16 scale (top nibbles of the four `scales` words) | gathered, mapped as an f16 scale, scattered back |
//! | F32 / F16 / BF16 element | an all-ones exponent loses its lowest bit (finite; subnormals kept) |
//!
//! Integer sub-scales, quants, sign bits and grid indices are left random:
//! every value of them is valid.

use pleio::quant::{can_decode, DecodeError, GgmlType};

/// SplitMix64: the one seeded generator of the lab and the tests (random
/// blocks, row lists, decode draws); tiny, fast, not cryptographic.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator whose stream is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (0 for `n == 0`). The modulo bias is below
    /// `n / 2^64`, negligible for row and token counts.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Fills `out` with random bytes: consecutive outputs, little-endian,
    /// the tail from the low bytes of one more output.
    pub fn fill_bytes(&mut self, out: &mut [u8]) {
        let mut chunks = out.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let tail = chunks.into_remainder();
        if !tail.is_empty() {
            let v = self.next_u64().to_le_bytes();
            tail.copy_from_slice(&v[..tail.len()]);
        }
    }
}

/// One field to rewrite in each block.
#[derive(Clone, Copy)]
enum Field {
    /// A little-endian f16 scale at this byte offset.
    F16(usize),
    /// An E8M0 exponent byte at this offset.
    E8m0(usize),
    /// Four UE4M3 scale bytes starting at this offset.
    Ue4m3x4(usize),
    /// IQ1_M's f16 scale, one nibble in the top of each of the four
    /// little-endian `u16` words starting at this offset.
    SpreadF16(usize),
}

/// How the blocks of a decodable type are made valid.
enum Rule {
    /// Plain floats: exponent-field width and position, element width.
    Float {
        bytes: usize,
        exp_shift: u32,
        exp_mask: u32,
    },
    /// Quantized blocks: the fields to rewrite in each block.
    Fields(&'static [Field]),
}

/// The validity rule for `ty` (offsets from ggml-common.h's block structs).
fn rule(ty: GgmlType) -> Option<Rule> {
    use Field::*;
    use GgmlType as T;
    Some(match ty {
        T::F32 => Rule::Float {
            bytes: 4,
            exp_shift: 23,
            exp_mask: 0xff,
        },
        T::F16 => Rule::Float {
            bytes: 2,
            exp_shift: 10,
            exp_mask: 0x1f,
        },
        T::BF16 => Rule::Float {
            bytes: 2,
            exp_shift: 7,
            exp_mask: 0xff,
        },
        // { d, qs } and other blocks whose only float is a leading `d`.
        T::Q4_0
        | T::Q5_0
        | T::Q8_0
        | T::IQ4_NL
        | T::IQ4_XS
        | T::IQ2_XXS
        | T::IQ2_XS
        | T::IQ2_S
        | T::IQ3_XXS
        | T::IQ3_S
        | T::IQ1_S => Rule::Fields(&[F16(0)]),
        // { d, m, ... } and { d, dmin, ... }.
        T::Q4_1 | T::Q5_1 | T::Q4_K | T::Q5_K => Rule::Fields(&[F16(0), F16(2)]),
        // { scales[16], qs[64], d, dmin }
        T::Q2_K => Rule::Fields(&[F16(80), F16(82)]),
        // { hmask[32], qs[64], scales[12], d }
        T::Q3_K => Rule::Fields(&[F16(108)]),
        // { ql[128], qh[64], scales[16], d }
        T::Q6_K => Rule::Fields(&[F16(208)]),
        // { qs[48], qh[4], d }
        T::TQ1_0 => Rule::Fields(&[F16(52)]),
        // { qs[64], d }
        T::TQ2_0 => Rule::Fields(&[F16(64)]),
        // { qs[32], qh[16], scales[8] }: the f16 is in the scales' top nibbles.
        T::IQ1_M => Rule::Fields(&[SpreadF16(48)]),
        // { e, qs[16] }
        T::MXFP4 => Rule::Fields(&[E8m0(0)]),
        // { d[4], qs[32] }
        T::NVFP4 => Rule::Fields(&[Ue4m3x4(0)]),
        _ => return None,
    })
}

/// Maps random f16 bits to a finite f16 with |x| in [2^-10, 2^2).
#[inline]
fn sane_f16(bits: u16) -> u16 {
    let e = (bits >> 10) & 0x1f;
    (bits & 0x83ff) | ((5 + ((e * 12) >> 5)) << 10)
}

#[inline]
fn patch_f16(b: &mut [u8], at: usize) {
    let h = sane_f16(u16::from_le_bytes([b[at], b[at + 1]]));
    b[at..at + 2].copy_from_slice(&h.to_le_bytes());
}

#[inline]
fn patch_field(block: &mut [u8], f: Field) {
    match f {
        Field::F16(at) => patch_f16(block, at),
        Field::E8m0(at) => block[at] = (100 + ((u32::from(block[at]) * 41) >> 8)) as u8,
        Field::Ue4m3x4(at) => {
            for b in &mut block[at..at + 4] {
                *b = ((u32::from(*b) * 127) >> 8) as u8;
            }
        }
        Field::SpreadF16(at) => {
            // Word k's top nibble holds bits 4k..4k+3 of the f16; its high
            // byte is block[at + 2k + 1].
            let mut h = 0u16;
            for k in 0..4 {
                h |= u16::from(block[at + 2 * k + 1] >> 4) << (4 * k);
            }
            let h = sane_f16(h);
            for k in 0..4 {
                let hi = &mut block[at + 2 * k + 1];
                *hi = (*hi & 0x0f) | ((((h >> (4 * k)) & 0xf) as u8) << 4);
            }
        }
    }
}

/// Clears the lowest exponent bit of every element whose exponent field is
/// all ones (`exp_mask` at `exp_shift`), so that every element is finite.
///
/// Works on 8 bytes at a time: each element is a lane of `bytes * 8` bits.
/// A lane whose exponent is all ones has `t = (x & ones) ^ ones == 0`;
/// adding `top - 1` to each lane sets its top bit exactly when `t != 0`
/// (`t < top`, so no carry crosses lanes).
fn patch_floats(out: &mut [u8], bytes: usize, exp_shift: u32, exp_mask: u32) {
    let width = 8 * bytes as u32;
    let lanes = |v: u64| (0..64 / width).fold(0u64, |a, i| a | (v << (i * width)));
    let ones = lanes(u64::from(exp_mask) << exp_shift);
    let top = lanes(1 << (width - 1));
    let below_top = lanes((1 << (width - 1)) - 1);
    let fix = |x: u64| {
        let t = (x & ones) ^ ones;
        let all_ones = !(t + below_top) & top;
        x ^ (all_ones >> (width - 1 - exp_shift))
    };
    let mut chunks = out.chunks_exact_mut(8);
    for c in &mut chunks {
        let x = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        c.copy_from_slice(&fix(x).to_le_bytes());
    }
    // Whole elements are left over; pad them into one word.
    let tail = chunks.into_remainder();
    let mut w = [0u8; 8];
    w[..tail.len()].copy_from_slice(tail);
    let fixed = fix(u64::from_le_bytes(w)).to_le_bytes();
    tail.copy_from_slice(&fixed[..tail.len()]);
}

/// Fills `out` (a whole number of `ty` blocks) with random valid blocks.
///
/// The content is a pure function of the generator state (see the module
/// docs); exactly `out.len().div_ceil(8)` outputs of `rng` are consumed.
/// Errors: [`DecodeError::Unsupported`] if pleio cannot decode `ty`, and
/// [`DecodeError::LengthMismatch`] (with `dst_elems` the elements of the
/// whole blocks that do fit) if `out` is not a whole number of blocks.
pub fn fill_random_blocks(ty: GgmlType, rng: &mut Rng, out: &mut [u8]) -> Result<(), DecodeError> {
    let rule = match rule(ty) {
        Some(r) if can_decode(ty) => r,
        _ => return Err(DecodeError::Unsupported(ty)),
    };
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    if !out.len().is_multiple_of(bb) {
        return Err(DecodeError::LengthMismatch {
            ty,
            src_bytes: out.len(),
            dst_elems: out.len() / bb * be,
            block_elems: be,
            block_bytes: bb,
        });
    }
    rng.fill_bytes(out);
    match rule {
        Rule::Float {
            bytes,
            exp_shift,
            exp_mask,
        } => patch_floats(out, bytes, exp_shift, exp_mask),
        Rule::Fields(fields) => {
            for block in out.chunks_exact_mut(bb) {
                for &f in fields {
                    patch_field(block, f);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pleio::quant::RowDecoder;

    fn decodable() -> impl Iterator<Item = GgmlType> {
        GgmlType::ALL.iter().copied().filter(|&t| can_decode(t))
    }

    #[test]
    fn splitmix64_reference_values() {
        // First outputs of SplitMix64 seeded with 1234567 (the published
        // reference sequence of Vigna's splitmix64.c).
        let mut r = Rng::new(1234567);
        let want = [
            6457827717110365317u64,
            3203168211198807973,
            9817491932198370423,
            4593380528125082431,
            16408922859458223821,
        ];
        for w in want {
            assert_eq!(r.next_u64(), w);
        }
    }

    #[test]
    fn fill_bytes_is_little_endian_with_partial_tail() {
        let mut a = Rng::new(7);
        let mut buf = [0u8; 11];
        a.fill_bytes(&mut buf);
        let mut b = Rng::new(7);
        let (x, y) = (b.next_u64().to_le_bytes(), b.next_u64().to_le_bytes());
        assert_eq!(buf[..8], x);
        assert_eq!(buf[8..], y[..3]);
        assert_eq!(a.next_u64(), b.next_u64(), "exactly ceil(11/8) draws");
    }

    #[test]
    fn covers_exactly_the_decodable_types() {
        assert_eq!(decodable().count(), 26);
        for &t in GgmlType::ALL {
            let mut buf = vec![0u8; t.block_bytes()];
            let got = fill_random_blocks(t, &mut Rng::new(1), &mut buf);
            if can_decode(t) {
                assert_eq!(got, Ok(()), "{t}");
            } else {
                assert_eq!(got, Err(DecodeError::Unsupported(t)), "{t}");
            }
        }
    }

    #[test]
    fn rejects_partial_blocks() {
        let mut buf = vec![0u8; 18 + 5];
        let err = fill_random_blocks(GgmlType::Q4_0, &mut Rng::new(1), &mut buf);
        assert!(matches!(
            err,
            Err(DecodeError::LengthMismatch {
                src_bytes: 23,
                dst_elems: 32,
                ..
            })
        ));
        // Empty output is zero whole blocks.
        assert_eq!(
            fill_random_blocks(GgmlType::Q4_0, &mut Rng::new(1), &mut []),
            Ok(())
        );
    }

    #[test]
    fn deterministic_per_seed_and_seed_sensitive() {
        for t in decodable() {
            let n = 3 * t.block_bytes();
            let gen = |seed| {
                let mut v = vec![0u8; n];
                fill_random_blocks(t, &mut Rng::new(seed), &mut v).unwrap();
                v
            };
            assert_eq!(gen(42), gen(42), "{t}");
            assert_ne!(gen(42), gen(43), "{t}");
        }
    }

    #[test]
    fn scale_fields_obey_their_rules() {
        let mut rng = Rng::new(99);
        let f16_ok = |h: u16| (5..=16).contains(&((h >> 10) & 0x1f));
        for t in decodable() {
            let mut buf = vec![0u8; 500 * t.block_bytes()];
            fill_random_blocks(t, &mut rng, &mut buf).unwrap();
            for b in buf.chunks_exact(t.block_bytes()) {
                let word = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
                match rule(t).unwrap() {
                    Rule::Float { .. } => {}
                    Rule::Fields(fields) => {
                        for &f in fields {
                            match f {
                                Field::F16(at) => assert!(f16_ok(word(at)), "{t}"),
                                Field::E8m0(at) => assert!((100..=140).contains(&b[at]), "{t}"),
                                Field::Ue4m3x4(at) => {
                                    assert!(b[at..at + 4].iter().all(|&x| x < 0x7f), "{t}")
                                }
                                Field::SpreadF16(at) => {
                                    let h = (0..4).fold(0u16, |h, k| {
                                        h | ((word(at + 2 * k) >> 12) << (4 * k))
                                    });
                                    assert!(f16_ok(h), "{t}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn exponent_mapping_is_onto_its_range() {
        let exps: std::collections::BTreeSet<u16> = (0..32u16)
            .map(|e| (sane_f16(e << 10) >> 10) & 0x1f)
            .collect();
        assert_eq!(
            exps.into_iter().collect::<Vec<_>>(),
            (5..=16).collect::<Vec<_>>()
        );
        assert_eq!(sane_f16(0xffff) & 0x83ff, 0x83ff, "sign and mantissa kept");
    }

    /// Per element: an all-ones exponent loses its lowest bit.
    fn fixed_element(x: u32, exp_shift: u32, exp_mask: u32) -> u32 {
        let ones = exp_mask << exp_shift;
        if x & ones == ones {
            x ^ (1 << exp_shift)
        } else {
            x
        }
    }

    #[test]
    fn float_patch_matches_per_element_rule() {
        // (bytes, shift, mask) of F32, F16, BF16; every exponent pattern in
        // every lane position, plus random words, and a tail shorter than 8.
        for (bytes, shift, mask) in [(4usize, 23u32, 0xffu32), (2, 10, 0x1f), (2, 7, 0xff)] {
            let mut rng = Rng::new(u64::from(shift));
            let mut elems: Vec<u32> = (0..=mask).map(|e| (e << shift) ^ 0x8000_1234).collect();
            elems.extend((0..999).map(|_| rng.next_u64() as u32));
            let lane = if bytes == 4 { u32::MAX } else { 0xffff };
            let mut buf: Vec<u8> = Vec::new();
            for &e in &elems {
                buf.extend_from_slice(&(e & lane).to_le_bytes()[..bytes]);
            }
            patch_floats(&mut buf, bytes, shift, mask);
            for (i, (&e, c)) in elems.iter().zip(buf.chunks_exact(bytes)).enumerate() {
                let mut w = [0u8; 4];
                w[..bytes].copy_from_slice(c);
                let want = fixed_element(e & lane, shift, mask);
                assert_eq!(
                    u32::from_le_bytes(w),
                    want,
                    "bytes {bytes} shift {shift} elem {i}"
                );
            }
        }
    }

    #[test]
    fn float_elements_are_finite() {
        let mut rng = Rng::new(5);
        for (t, bytes) in [(GgmlType::F32, 4), (GgmlType::F16, 2), (GgmlType::BF16, 2)] {
            let mut buf = vec![0u8; 4099 * bytes];
            fill_random_blocks(t, &mut rng, &mut buf).unwrap();
            let mut out = vec![0f32; 4099];
            RowDecoder::scalar(t)
                .unwrap()
                .decode(&buf, &mut out)
                .unwrap();
            assert!(out.iter().all(|x| x.is_finite()), "{t}");
        }
    }

    /// Decoding random blocks gives finite floats, with the SIMD path and
    /// the scalar reference alike.
    #[test]
    fn random_blocks_decode_to_finite_floats() {
        let mut rng = Rng::new(2024);
        let mut bad = Vec::new();
        for t in decodable() {
            let mut buf = vec![0u8; 64 * t.block_bytes()];
            fill_random_blocks(t, &mut rng, &mut buf).unwrap();
            let mut out = vec![0f32; 64 * t.block_elems()];
            for (name, dec) in [
                ("new", RowDecoder::new(t)),
                ("scalar", RowDecoder::scalar(t)),
            ] {
                out.fill(0.0);
                dec.unwrap().decode(&buf, &mut out).unwrap();
                if let Some(i) = out.iter().position(|x| !x.is_finite()) {
                    bad.push(format!("{t} ({name}): element {i} = {}", out[i]));
                }
            }
        }
        assert!(bad.is_empty(), "non-finite output:\n{}", bad.join("\n"));
    }
}
