//! AVX2 + F16C kernels for the checkpoint row encodings of
//! [`super::encoding`], bit-identical to its scalar reference.
//!
//! Each kernel computes the reference's operations on 8 lanes: exact
//! conversions to f32 built from bits, then the same IEEE multiplies and
//! adds in the same order (no fused multiply-add). Where a NaN could come
//! from a non-finite scale, the kernel declines (returns `false`: the
//! caller runs the scalar reference) or writes the canonical NaN itself, so
//! NaN outputs match the reference too. The f32 lanes go to an output
//! ([`Out`]) that stores them as f32, or converts them to bfloat16 or half
//! exactly as [`super::convert`] does, so 16-bit outputs need no f32 pass.

use super::encoding::Encoding;

/// Proof that this CPU has AVX2 and F16C: only [`Simd::detect`] makes one.
#[derive(Debug, Clone, Copy)]
pub(super) struct Simd {
    _private: (),
}

impl Simd {
    /// The kernels, if the CPU has AVX2 and F16C.
    pub(super) fn detect() -> Option<Simd> {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                return Some(Simd { _private: () });
            }
        }
        None
    }

    /// Decodes elements `start..start + dst.len()` of a checked row to f32
    /// if a kernel applies; `false` means: run the scalar reference.
    pub(super) fn decode_f32(
        self,
        enc: &Encoding,
        parts: &[&[u8]],
        start: usize,
        dst: &mut [f32],
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            avx2::decode(enc, parts, start, &mut avx2::F32Out(dst))
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (enc, parts, start, dst);
            false
        }
    }

    /// As [`decode_f32`](Self::decode_f32), writing bfloat16 bits
    /// (`convert::f32_to_bf16` of each f32).
    pub(super) fn decode_bf16(
        self,
        enc: &Encoding,
        parts: &[&[u8]],
        start: usize,
        dst: &mut [u16],
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            avx2::decode(enc, parts, start, &mut avx2::Bf16Out(dst))
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (enc, parts, start, dst);
            false
        }
    }

    /// As [`decode_f32`](Self::decode_f32), writing IEEE half bits
    /// (`convert::f32_to_f16` of each f32).
    pub(super) fn decode_f16(
        self,
        enc: &Encoding,
        parts: &[&[u8]],
        start: usize,
        dst: &mut [u16],
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            avx2::decode(enc, parts, start, &mut avx2::F16Out(dst))
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (enc, parts, start, dst);
            false
        }
    }
}

/// Proof that this CPU has AVX-512 F, BW and VBMI: only
/// [`Vbmi::detect`] makes one.
#[derive(Debug, Clone, Copy)]
pub(super) struct Vbmi {
    _private: (),
}

impl Vbmi {
    /// The byte-table kernels, if the CPU has AVX-512 F, BW and VBMI.
    pub(super) fn detect() -> Option<Vbmi> {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vbmi")
            {
                return Some(Vbmi { _private: () });
            }
        }
        None
    }

    /// `dst[i] = table[q[i]]` for 16-bit table entries given as their low
    /// bytes `lo` and high bytes `hi` (`dst.len() == q.len()`): a 256-entry
    /// lookup, 64 codes per step (`vpermi2b` on two 128-byte halves,
    /// chosen by the code's top bit).
    pub(super) fn lookup16(self, lo: &[u8; 256], hi: &[u8; 256], q: &[u8], dst: &mut [u16]) {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: a `Vbmi` token exists only after AVX-512 F, BW and
            // VBMI were detected.
            unsafe { avx512::lookup16(lo, hi, q, dst) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (lo, hi, q, dst);
            unreachable!("no Vbmi token off x86_64")
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// The 64 bytes of `t[at..at + 64]`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn load64(t: &[u8; 256], at: usize) -> __m512i {
        let s = &t[at..at + 64];
        // SAFETY: `s` is exactly 64 readable bytes; the load is unaligned.
        unsafe { _mm512_loadu_si512(s.as_ptr().cast()) }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    pub(super) fn lookup16(lo: &[u8; 256], hi: &[u8; 256], q: &[u8], dst: &mut [u16]) {
        let n = q.len().min(dst.len());
        let (l0, l1, l2, l3) = (
            load64(lo, 0),
            load64(lo, 64),
            load64(lo, 128),
            load64(lo, 192),
        );
        let (h0, h1, h2, h3) = (
            load64(hi, 0),
            load64(hi, 64),
            load64(hi, 128),
            load64(hi, 192),
        );
        // 64-bit lane orders that put the unpacked pairs back in sequence.
        let first = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
        let second = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
        let mut i = 0;
        while i < n {
            let k = (n - i).min(64);
            let mask = if k == 64 { u64::MAX } else { (1u64 << k) - 1 };
            let src = &q[i..i + k];
            // SAFETY: the masked load reads only the first `k` bytes,
            // which `src` holds (masked-off bytes are not accessed).
            let x = unsafe { _mm512_maskz_loadu_epi8(mask, src.as_ptr().cast()) };
            let top = _mm512_movepi8_mask(x);
            let lo8 = _mm512_mask_blend_epi8(
                top,
                _mm512_permutex2var_epi8(l0, x, l1),
                _mm512_permutex2var_epi8(l2, x, l3),
            );
            let hi8 = _mm512_mask_blend_epi8(
                top,
                _mm512_permutex2var_epi8(h0, x, h1),
                _mm512_permutex2var_epi8(h2, x, h3),
            );
            // Per 128-bit lane j: unpacklo holds elements 16j..16j+8,
            // unpackhi 16j+8..16j+16.
            let (ul, uh) = (
                _mm512_unpacklo_epi8(lo8, hi8),
                _mm512_unpackhi_epi8(lo8, hi8),
            );
            let a = _mm512_permutex2var_epi64(ul, first, uh);
            let b = _mm512_permutex2var_epi64(ul, second, uh);
            let out = &mut dst[i..i + k];
            let (ka, kb) = (k.min(32), k.saturating_sub(32));
            let ma = if ka == 32 { u32::MAX } else { (1u32 << ka) - 1 };
            let mb = if kb == 32 { u32::MAX } else { (1u32 << kb) - 1 };
            // SAFETY: the masked stores write only the first `k` u16 of
            // `out` (32 from `a`, then `kb` from `b` after them), all of
            // which `out` holds.
            unsafe {
                _mm512_mask_storeu_epi16(out.as_mut_ptr().cast(), ma, a);
                if kb > 0 {
                    _mm512_mask_storeu_epi16(out.as_mut_ptr().add(32).cast(), mb, b);
                }
            }
            i += k;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::super::convert::{f32_to_bf16, f32_to_f16};
    use super::super::encoding::{e4m3_to_f32, Fp8Scale, CANONICAL_NAN, MLX_GROUP, NVFP4_BLOCK};
    use super::super::float::{bf16_to_f32, f16_to_f32};
    use super::Encoding;

    /// What an output stores.
    #[derive(PartialEq, Eq)]
    pub(super) enum Kind {
        F32,
        Bf16,
        F16,
    }

    /// Where a kernel's f32 lanes go: an f32 slice, or a u16 slice taking
    /// bfloat16 or half bits.
    pub(super) trait Out {
        /// What it stores (a constant: the match in [`store8`] folds).
        const KIND: Kind;
        /// Elements of room.
        fn len(&self) -> usize;
        /// The f32 slice (empty for 16-bit outputs).
        fn f32s(&mut self) -> &mut [f32];
        /// The u16 slice (empty for f32 outputs).
        fn u16s(&mut self) -> &mut [u16];
        /// Stores one element.
        fn store1(&mut self, at: usize, v: f32);
    }

    /// f32 output.
    pub(super) struct F32Out<'a>(pub(super) &'a mut [f32]);
    /// bfloat16 output.
    pub(super) struct Bf16Out<'a>(pub(super) &'a mut [u16]);
    /// IEEE half output.
    pub(super) struct F16Out<'a>(pub(super) &'a mut [u16]);

    impl Out for F32Out<'_> {
        const KIND: Kind = Kind::F32;
        fn len(&self) -> usize {
            self.0.len()
        }
        fn f32s(&mut self) -> &mut [f32] {
            self.0
        }
        fn u16s(&mut self) -> &mut [u16] {
            &mut []
        }
        #[inline(always)]
        fn store1(&mut self, at: usize, v: f32) {
            self.0[at] = v;
        }
    }

    impl Out for Bf16Out<'_> {
        const KIND: Kind = Kind::Bf16;
        fn len(&self) -> usize {
            self.0.len()
        }
        fn f32s(&mut self) -> &mut [f32] {
            &mut []
        }
        fn u16s(&mut self) -> &mut [u16] {
            self.0
        }
        #[inline(always)]
        fn store1(&mut self, at: usize, v: f32) {
            self.0[at] = f32_to_bf16(v);
        }
    }

    impl Out for F16Out<'_> {
        const KIND: Kind = Kind::F16;
        fn len(&self) -> usize {
            self.0.len()
        }
        fn f32s(&mut self) -> &mut [f32] {
            &mut []
        }
        fn u16s(&mut self) -> &mut [u16] {
            self.0
        }
        #[inline(always)]
        fn store1(&mut self, at: usize, v: f32) {
            self.0[at] = f32_to_f16(v);
        }
    }

    /// The bfloat16 bits of 8 lanes (`convert::f32_to_bf16`), in the low
    /// 16 bits of each u32 lane; `CANON` as in the shared kernel.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn bf16_bits<const CANON: bool>(v: __m256) -> __m256i {
        super::super::convert_simd::avx2::bf16x8::<CANON>(_mm256_castps_si256(v))
    }

    /// Stores 16 lanes (`a` then `b`) at `at..at + 16` of `out`: as f32; as
    /// bfloat16 ([`bf16_bits`], `CANON` as there); or as half by
    /// `vcvtps2ph` (round to nearest even, NaNs quieted keeping sign and
    /// top payload bits, as `f32_to_f16`).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn store16<O: Out, const CANON: bool>(out: &mut O, at: usize, a: __m256, b: __m256) {
        match O::KIND {
            Kind::F32 => {
                let s = &mut out.f32s()[at..at + 16];
                // SAFETY: `s` is exactly 16 writable floats; unaligned
                // stores of 8 each.
                unsafe {
                    _mm256_storeu_ps(s.as_mut_ptr(), a);
                    _mm256_storeu_ps(s.as_mut_ptr().add(8), b);
                }
            }
            Kind::Bf16 => {
                // packus works per 128-bit lane (values <= 0xFFFF: no
                // saturation): a0-3 b0-3 a4-7 b4-7; the permute restores
                // element order.
                let p = _mm256_packus_epi32(bf16_bits::<CANON>(a), bf16_bits::<CANON>(b));
                let p = _mm256_permute4x64_epi64::<0b11_01_10_00>(p);
                let s = &mut out.u16s()[at..at + 16];
                // SAFETY: `s` is exactly 16 writable u16; unaligned store.
                unsafe { _mm256_storeu_si256(s.as_mut_ptr().cast(), p) }
            }
            Kind::F16 => {
                let ha = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(a);
                let hb = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(b);
                let s = &mut out.u16s()[at..at + 16];
                // SAFETY: `s` is exactly 16 writable u16; unaligned stores
                // of 8 each.
                unsafe {
                    _mm_storeu_si128(s.as_mut_ptr().cast(), ha);
                    _mm_storeu_si128(s.as_mut_ptr().add(8).cast(), hb);
                }
            }
        }
    }

    /// Dispatch; only reached through a [`super::Simd`] token.
    pub(super) fn decode<O: Out>(
        enc: &Encoding,
        parts: &[&[u8]],
        start: usize,
        out: &mut O,
    ) -> bool {
        // SAFETY (every call below): a `Simd` token exists only after
        // AVX2 and F16C were detected, so every instruction the kernels
        // are compiled with is supported.
        match *enc {
            Encoding::Bf16 => unsafe { bf16(&parts[0][2 * start..], out) },
            Encoding::F16 => unsafe { f16(&parts[0][2 * start..], out) },
            Encoding::F32 => {
                for (i, b) in parts[0][4 * start..]
                    .chunks_exact(4)
                    .take(out.len())
                    .enumerate()
                {
                    out.store1(i, f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
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
                unsafe { fp8(&parts[0][start..start + out.len()], s, s8, out) }
            }
            Encoding::Nvfp4 { global_scale } => {
                if !global_scale.is_finite() {
                    return false;
                }
                unsafe { nvfp4(parts[0], parts[1], global_scale, start, out) }
            }
            Encoding::Mlx4 => unsafe { mlx4(parts[0], parts[1], parts[2], start, out) },
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

    /// bfloat16 in the 8 u16 lanes of `v` to f32 (a shift: exact).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn bf16x8(v: __m128i) -> __m256 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(v)))
    }

    /// Writes `v` when it is not NaN, else the canonical NaN (the scalar
    /// reference's rule for quantized results), one element.
    #[inline(always)]
    fn store_canon<O: Out>(out: &mut O, at: usize, v: f32) {
        out.store1(
            at,
            if v.is_nan() {
                f32::from_bits(CANONICAL_NAN)
            } else {
                v
            },
        );
    }

    #[target_feature(enable = "avx2,f16c")]
    fn bf16<O: Out>(src: &[u8], out: &mut O) {
        let n = out.len();
        let n16 = n / 16 * 16;
        for i in (0..n16).step_by(16) {
            let (a, b) = (load16(src, 2 * i), load16(src, 2 * i + 16));
            store16::<O, false>(out, i, bf16x8(a), bf16x8(b));
        }
        for i in n16..n {
            out.store1(
                i,
                bf16_to_f32(u16::from_le_bytes([src[2 * i], src[2 * i + 1]])),
            );
        }
    }

    #[target_feature(enable = "avx2,f16c")]
    fn f16<O: Out>(src: &[u8], out: &mut O) {
        let n = out.len();
        let n16 = n / 16 * 16;
        for i in (0..n16).step_by(16) {
            let (a, b) = (load16(src, 2 * i), load16(src, 2 * i + 16));
            store16::<O, false>(out, i, _mm256_cvtph_ps(a), _mm256_cvtph_ps(b));
        }
        for i in n16..n {
            out.store1(
                i,
                f16_to_f32(u16::from_le_bytes([src[2 * i], src[2 * i + 1]])),
            );
        }
    }

    /// FP8: the E4M3 byte `b` read as the half `((b & 0x7F) << 7) | ((b &
    /// 0x80) << 8)` is exactly `e4m3(b) * 2^-8` (normals and subnormals
    /// alike); NaN codes become the half qNaN 0x7E00, i.e. f32 0x7FC00000.
    /// Times `s8 = s * 2^8` (exact) this is the same real product as
    /// `e4m3(b) * s`, so it rounds to the same f32; a NaN times a finite
    /// `s8` stays the canonical NaN.
    #[target_feature(enable = "avx2,f16c")]
    fn fp8<O: Out>(q: &[u8], s: f32, s8: f32, out: &mut O) {
        let (mag, sgn, nan7f) = (
            _mm256_set1_epi16(0x3F80),
            _mm256_set1_epi16(-0x8000),
            _mm256_set1_epi16(0x7F),
        );
        let qnan = _mm256_set1_epi16(0x7E00);
        let sv = _mm256_set1_ps(s8);
        let n = out.len();
        let n16 = n / 16 * 16;
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
            // NaN lanes are the canonical NaN times a finite scale: the
            // canonical NaN.
            store16::<O, true>(out, i, _mm256_mul_ps(lo, sv), _mm256_mul_ps(hi, sv));
        }
        for (i, &c) in q.iter().enumerate().take(n).skip(n16) {
            store_canon(out, i, e4m3_to_f32(c) * s);
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
    #[target_feature(enable = "avx2,f16c")]
    fn nvfp4<O: Out>(q: &[u8], scales: &[u8], g: f32, start: usize, out: &mut O) {
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
        for k in 0..out.len() / NVFP4_BLOCK {
            let (at, j0) = (k * NVFP4_BLOCK, start + k * NVFP4_BLOCK);
            let e = e4m3_to_f32(scales[j0 / NVFP4_BLOCK]);
            if e.is_nan() {
                for i in at..at + NVFP4_BLOCK {
                    out.store1(i, f32::from_bits(CANONICAL_NAN));
                }
                continue;
            }
            let ev = _mm256_set1_ps(e);
            let c = codes16(q, j0 / 2);
            let (h, l) = (_mm_shuffle_epi8(thi, c), _mm_shuffle_epi8(tlo, c));
            let v0 = bf16x8(_mm_unpacklo_epi8(l, h));
            let v1 = bf16x8(_mm_unpackhi_epi8(l, h));
            let (y0, y1) = (
                _mm256_mul_ps(_mm256_mul_ps(v0, ev), gv),
                _mm256_mul_ps(_mm256_mul_ps(v1, ev), gv),
            );
            // Finite scales: no NaN lanes at all.
            store16::<O, true>(out, at, y0, y1);
        }
    }

    /// MLX affine 4-bit: per group of 32, codes widened exactly to f32,
    /// then `(s * q) + b`. Groups whose scale or bias is not finite take
    /// the reference formula one element at a time (canonical NaN); with
    /// both finite, `s * q` may overflow to an infinity but no NaN arises.
    #[target_feature(enable = "avx2,f16c")]
    fn mlx4<O: Out>(words: &[u8], scales: &[u8], biases: &[u8], start: usize, out: &mut O) {
        let bf = |b: &[u8], i: usize| bf16_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]));
        let m4 = _mm_set1_epi8(0x0F);
        for k in 0..out.len() / MLX_GROUP {
            let (at, j0) = (k * MLX_GROUP, start + k * MLX_GROUP);
            let (s, b) = (bf(scales, j0 / MLX_GROUP), bf(biases, j0 / MLX_GROUP));
            if !s.is_finite() || !b.is_finite() {
                for i in 0..MLX_GROUP {
                    let j = j0 + i;
                    let q = f32::from((words[j / 2] >> (4 * (j % 2))) & 0xF);
                    store_canon(out, at + i, s * q + b);
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
                let w = |part| {
                    let q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part));
                    _mm256_add_ps(_mm256_mul_ps(sv, q), bv)
                };
                // Finite scale and bias: no NaN lanes at all.
                store16::<O, true>(out, at + 16 * h, w(c), w(_mm_srli_si128::<8>(c)));
            }
        }
    }
}
