//! AVX2 (+F16C) kernels for the checkpoint row encodings of
//! [`super::encoding`], bit-identical to its scalar reference.
//!
//! Each kernel computes the reference's operations on 8 lanes: exact
//! conversions to f32 built from bits, then the same IEEE multiplies and
//! adds in the same order (no fused multiply-add). Where a NaN could come
//! from a non-finite scale, the kernel declines (returns `false`) or writes
//! the canonical NaN itself, so NaN outputs match the reference too.

use super::encoding::{Encoding, Fp8Scale};

/// True if this CPU has a kernel for `enc`.
pub(super) fn available(enc: &Encoding) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let f16c = std::arch::is_x86_feature_detected!("f16c");
        if std::arch::is_x86_feature_detected!("avx2") {
            return match enc {
                Encoding::F16 | Encoding::Fp8(_) => f16c,
                _ => true,
            };
        }
    }
    let _ = enc;
    false
}

/// Decodes elements `start..start + dst.len()` of a checked row if a
/// kernel applies; `false` means the caller runs the scalar reference.
pub(super) fn decode(enc: &Encoding, parts: &[&[u8]], start: usize, dst: &mut [f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if available(enc) {
            return avx2::decode(enc, parts, start, dst);
        }
    }
    let _ = (enc, parts, start, dst);
    false
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::super::encoding::{e4m3_to_f32, CANONICAL_NAN, MLX_GROUP, NVFP4_BLOCK};
    use super::super::float::{bf16_to_f32, f16_to_f32};
    use super::{Encoding, Fp8Scale};

    /// Dispatch; only called after `available(enc)` confirmed the features.
    pub(super) fn decode(enc: &Encoding, parts: &[&[u8]], start: usize, dst: &mut [f32]) -> bool {
        // SAFETY (all calls below): `available` detected AVX2, and F16C for
        // the F16 and FP8 kernels, so every instruction they are compiled
        // with is supported.
        match *enc {
            Encoding::Bf16 => unsafe { bf16(&parts[0][2 * start..], dst) },
            Encoding::F16 => unsafe { f16(&parts[0][2 * start..], dst) },
            Encoding::F32 => {
                for (y, b) in dst.iter_mut().zip(parts[0][4 * start..].chunks_exact(4)) {
                    *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            Encoding::Fp8(scale) => {
                let s = match scale {
                    Fp8Scale::PerTensor(s) => s,
                    Fp8Scale::PerRow(t) => t.read(parts[1]),
                };
                // The kernel scales codes read as halves (value * 2^-8) by
                // s * 2^8: exact when s * 2^8 is finite, else decline.
                let s8 = s * 256.0;
                if !s8.is_finite() {
                    return false;
                }
                unsafe { fp8(&parts[0][start..start + dst.len()], s, s8, dst) }
            }
            Encoding::Nvfp4 { global_scale } => {
                if !global_scale.is_finite() {
                    return false;
                }
                unsafe { nvfp4(parts[0], parts[1], global_scale, start, dst) }
            }
            Encoding::Mlx4 => unsafe { mlx4(parts[0], parts[1], parts[2], start, dst) },
        }
        true
    }

    /// The 16 bytes at `b[at..at + 16]`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn load16(b: &[u8], at: usize) -> __m128i {
        let s = &b[at..at + 16];
        // SAFETY: `s` is exactly 16 readable bytes; the load is unaligned.
        unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
    }

    /// The 8 bytes at `b[at..at + 8]`, in the low half.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn load8(b: &[u8], at: usize) -> __m128i {
        let s = &b[at..at + 8];
        // SAFETY: `s` is exactly 8 readable bytes; the load is unaligned.
        unsafe { _mm_loadl_epi64(s.as_ptr().cast()) }
    }

    /// Stores 8 floats to `y[at..at + 8]`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn store8(y: &mut [f32], at: usize, v: __m256) {
        let s = &mut y[at..at + 8];
        // SAFETY: `s` is exactly 8 writable floats; the store is unaligned.
        unsafe { _mm256_storeu_ps(s.as_mut_ptr(), v) }
    }

    /// bfloat16 in the 8 u16 lanes of `v` to f32 (a shift: exact).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn bf16x8(v: __m128i) -> __m256 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(v)))
    }

    #[target_feature(enable = "avx2")]
    fn bf16(src: &[u8], dst: &mut [f32]) {
        let n8 = dst.len() / 8 * 8;
        for i in (0..n8).step_by(8) {
            store8(dst, i, bf16x8(load16(src, 2 * i)));
        }
        for i in n8..dst.len() {
            dst[i] = bf16_to_f32(u16::from_le_bytes([src[2 * i], src[2 * i + 1]]));
        }
    }

    #[target_feature(enable = "avx2,f16c")]
    fn f16(src: &[u8], dst: &mut [f32]) {
        let n8 = dst.len() / 8 * 8;
        for i in (0..n8).step_by(8) {
            store8(dst, i, _mm256_cvtph_ps(load16(src, 2 * i)));
        }
        for i in n8..dst.len() {
            dst[i] = f16_to_f32(u16::from_le_bytes([src[2 * i], src[2 * i + 1]]));
        }
    }

    /// FP8: the E4M3 byte `b` read as the half `((b & 0x7F) << 7) | ((b &
    /// 0x80) << 8)` is exactly `e4m3(b) * 2^-8` (normals and subnormals
    /// alike); NaN codes become the half qNaN 0x7E00, i.e. f32 0x7FC00000.
    /// Times `s8 = s * 2^8` (exact) this is the same real product as
    /// `e4m3(b) * s`, so it rounds to the same f32; a NaN times a finite
    /// `s8` stays the canonical NaN.
    #[target_feature(enable = "avx2,f16c")]
    fn fp8(q: &[u8], s: f32, s8: f32, dst: &mut [f32]) {
        let (mag, sgn, nan7f) = (
            _mm256_set1_epi16(0x3F80),
            _mm256_set1_epi16(-0x8000),
            _mm256_set1_epi16(0x7F),
        );
        let qnan = _mm256_set1_epi16(0x7E00);
        let sv = _mm256_set1_ps(s8);
        let n16 = dst.len() / 16 * 16;
        for i in (0..n16).step_by(16) {
            let x = _mm256_cvtepu8_epi16(load16(q, i));
            let h = _mm256_or_si256(
                _mm256_and_si256(_mm256_slli_epi16::<7>(x), mag),
                _mm256_and_si256(_mm256_slli_epi16::<8>(x), sgn),
            );
            let is_nan = _mm256_cmpeq_epi16(_mm256_and_si256(x, nan7f), nan7f);
            let h = _mm256_blendv_epi8(h, qnan, is_nan);
            let lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
            let hi = _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h));
            store8(dst, i, _mm256_mul_ps(lo, sv));
            store8(dst, i + 8, _mm256_mul_ps(hi, sv));
        }
        for i in n16..dst.len() {
            let v = e4m3_to_f32(q[i]) * s;
            dst[i] = if v.is_nan() {
                f32::from_bits(CANONICAL_NAN)
            } else {
                v
            };
        }
    }

    /// The 16 nibble codes of the 8 bytes at `b[at..]`, in element order
    /// (low nibble of each byte first).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn codes16(b: &[u8], at: usize) -> __m128i {
        let v = load8(b, at);
        let m4 = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(v, m4);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), m4);
        _mm_unpacklo_epi8(lo, hi)
    }

    /// NVFP4: per block of 16, the signed E2M1 values are bfloat16 numbers,
    /// looked up as their two bytes (`pshufb`) and widened exactly; then
    /// `(v * e4m3(scale)) * global` as in the reference. A NaN block scale
    /// gives a block of canonical NaNs (the reference's result); the global
    /// scale is finite (checked by the caller), so no other NaN arises.
    #[target_feature(enable = "avx2")]
    fn nvfp4(q: &[u8], scales: &[u8], g: f32, start: usize, dst: &mut [f32]) {
        // bf16 bits of 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
        const HI: [u8; 16] = [
            0x00, 0x3F, 0x3F, 0x3F, 0x40, 0x40, 0x40, 0x40, 0x80, 0xBF, 0xBF, 0xBF, 0xC0, 0xC0,
            0xC0, 0xC0,
        ];
        const LO: [u8; 16] = [
            0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0, 0x00, 0x00, 0x80, 0xC0, 0x00, 0x40,
            0x80, 0xC0,
        ];
        let (thi, tlo) = (load16(&HI, 0), load16(&LO, 0));
        let gv = _mm256_set1_ps(g);
        for (k, y) in dst.chunks_exact_mut(NVFP4_BLOCK).enumerate() {
            let j0 = start + k * NVFP4_BLOCK;
            let e = e4m3_to_f32(scales[j0 / NVFP4_BLOCK]);
            if e.is_nan() {
                y.fill(f32::from_bits(CANONICAL_NAN));
                continue;
            }
            let ev = _mm256_set1_ps(e);
            let c = codes16(q, j0 / 2);
            let (h, l) = (_mm_shuffle_epi8(thi, c), _mm_shuffle_epi8(tlo, c));
            let v0 = bf16x8(_mm_unpacklo_epi8(l, h));
            let v1 = bf16x8(_mm_unpackhi_epi8(l, h));
            store8(y, 0, _mm256_mul_ps(_mm256_mul_ps(v0, ev), gv));
            store8(y, 8, _mm256_mul_ps(_mm256_mul_ps(v1, ev), gv));
        }
    }

    /// MLX affine 4-bit: per group of 32, codes widened exactly to f32,
    /// then `(s * q) + b`. Groups whose scale or bias is not finite take
    /// the scalar path (which canonicalizes NaN); with both finite, `s * q`
    /// may overflow to an infinity but no NaN arises.
    #[target_feature(enable = "avx2")]
    fn mlx4(words: &[u8], scales: &[u8], biases: &[u8], start: usize, dst: &mut [f32]) {
        let bf = |b: &[u8], i: usize| bf16_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]));
        let m4 = _mm_set1_epi8(0x0F);
        for (k, y) in dst.chunks_exact_mut(MLX_GROUP).enumerate() {
            let j0 = start + k * MLX_GROUP;
            let (s, b) = (bf(scales, j0 / MLX_GROUP), bf(biases, j0 / MLX_GROUP));
            if !s.is_finite() || !b.is_finite() {
                for (i, y) in y.iter_mut().enumerate() {
                    let j = j0 + i;
                    let q = f32::from((words[j / 2] >> (4 * (j % 2))) & 0xF);
                    let v = s * q + b;
                    *y = if v.is_nan() {
                        f32::from_bits(CANONICAL_NAN)
                    } else {
                        v
                    };
                }
                continue;
            }
            let (sv, bv) = (_mm256_set1_ps(s), _mm256_set1_ps(b));
            // Word w's byte k holds elements 8w + 2k (low) and 8w + 2k + 1.
            let v = load16(words, j0 / 2);
            let lo = _mm_and_si128(v, m4);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), m4);
            let c = [_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)];
            for (h, c) in c.into_iter().enumerate() {
                for (p, part) in [c, _mm_srli_si128::<8>(c)].into_iter().enumerate() {
                    let q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part));
                    let r = _mm256_add_ps(_mm256_mul_ps(sv, q), bv);
                    store8(y, 16 * h + 8 * p, r);
                }
            }
        }
    }
}
