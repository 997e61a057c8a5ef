//! SIMD row decoders, chosen at run time.
//!
//! On x86_64 with AVX2 there are kernels for IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1,
//! Q8_0, MXFP4, BF16, Q4_K and Q5_K, and with F16C too one for F16 (the hardware
//! conversion is exact and quiets NaNs as ggml's does). Each computes exactly what the scalar reference does: the same
//! scale conversion (scalar), integer codes converted to f32 exactly, then
//! separate IEEE multiply and subtract per lane (no fused multiply-add), so
//! the outputs are bit-identical. Elsewhere [`kernel`] returns `None` and
//! the scalar decoders are used.
//!
//! # Safety
//!
//! The intrinsics are `unsafe` because they need CPU features: a kernel is
//! only handed out by [`kernel`] after `is_x86_feature_detected!` confirmed
//! them, and every load and store stays inside the block slices it is given
//! (lengths checked by the caller, whole blocks only).

use super::{BlockFn, GgmlType, HalfFn};

/// The kernel writing `ty`'s rows straight as 16-bit values (little-endian
/// bf16 bits with `bf16`, else f16), bit-identical to the f32 kernel
/// followed by [`super::convert`]'s rounding, if one exists and the CPU
/// supports it: the 4-bit table formats (IQ4_NL, Q4_0, MXFP4), whose block
/// holds only 16 distinct values, rounded once per block and looked up
/// per element.
pub(super) fn half_kernel(ty: GgmlType, bf16: bool) -> Option<HalfFn> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            let vbmi = std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vbmi");
            return avx2::half_kernel(ty, bf16, vbmi);
        }
    }
    let _ = (ty, bf16);
    None
}

/// The SIMD kernel for `ty`, if one exists and the running CPU supports it.
pub(super) fn kernel(ty: GgmlType) -> Option<BlockFn> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            return avx2::kernel(ty);
        }
    }
    let _ = ty;
    None
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::super::convert_simd::avx2::bf16x8;
    use super::super::float::{bf16_to_f32, f16_to_f32, read_f16};
    use super::super::fp4::{e8m0_to_f32_half, KVALUES_MXFP4};
    use super::super::kquant::scale_min_k4;
    use super::super::legacy::{KVALUES_IQ4NL, LEVELS_Q4_0};
    use super::{BlockFn, GgmlType, HalfFn};

    /// The AVX2 + F16C 16-bit kernel for `ty` (with `vbmi`, the one whose
    /// per-element lookup is one AVX-512 VBMI byte permute). Only call
    /// after detecting those features: the returned safe wrappers rely on
    /// them.
    pub(super) fn half_kernel(ty: GgmlType, bf16: bool, vbmi: bool) -> Option<HalfFn> {
        use GgmlType as T;
        Some(match (ty, bf16, vbmi) {
            (T::IQ4_NL, true, false) => iq4_nl_bf16,
            (T::IQ4_NL, false, false) => iq4_nl_f16,
            (T::Q4_0, true, false) => q4_0_bf16,
            (T::Q4_0, false, false) => q4_0_f16,
            (T::MXFP4, true, false) => mxfp4_bf16,
            (T::MXFP4, false, false) => mxfp4_f16,
            (T::IQ4_NL, true, true) => iq4_nl_bf16_vbmi,
            (T::IQ4_NL, false, true) => iq4_nl_f16_vbmi,
            (T::Q4_0, true, true) => q4_0_bf16_vbmi,
            (T::Q4_0, false, true) => q4_0_f16_vbmi,
            (T::MXFP4, true, true) => mxfp4_bf16_vbmi,
            (T::MXFP4, false, true) => mxfp4_f16_vbmi,
            _ => return None,
        })
    }

    /// Defines a safe `HalfFn` wrapper around a 16-bit kernel.
    macro_rules! half_wrapper {
        ($($name:ident: $imp:ident, $bb:literal, $table:expr, $scale:expr, $bf16:literal;)*) => {$(
            fn $name(src: &[u8], dst: &mut [u8]) {
                // SAFETY: `half_kernel` hands out this wrapper only after
                // `is_x86_feature_detected!` confirmed AVX2 and F16C (and
                // AVX-512 F, BW and VBMI for the `_vbmi` kernels), every
                // instruction `$imp` is compiled with.
                unsafe { $imp::<$bb, $bf16>(src, dst, $table, $scale) }
            }
        )*};
    }

    half_wrapper! {
        iq4_nl_bf16: nibble_table_half, 18, &KVALUES_IQ4NL, |b| read_f16(b, 0), true;
        iq4_nl_f16: nibble_table_half, 18, &KVALUES_IQ4NL, |b| read_f16(b, 0), false;
        q4_0_bf16: nibble_table_half, 18, &LEVELS_Q4_0, |b| read_f16(b, 0), true;
        q4_0_f16: nibble_table_half, 18, &LEVELS_Q4_0, |b| read_f16(b, 0), false;
        mxfp4_bf16: nibble_table_half, 17, &KVALUES_MXFP4, |b| e8m0_to_f32_half(b[0]), true;
        mxfp4_f16: nibble_table_half, 17, &KVALUES_MXFP4, |b| e8m0_to_f32_half(b[0]), false;
        iq4_nl_bf16_vbmi: nibble_table_half_vbmi, 18, &KVALUES_IQ4NL, |b| read_f16(b, 0), true;
        iq4_nl_f16_vbmi: nibble_table_half_vbmi, 18, &KVALUES_IQ4NL, |b| read_f16(b, 0), false;
        q4_0_bf16_vbmi: nibble_table_half_vbmi, 18, &LEVELS_Q4_0, |b| read_f16(b, 0), true;
        q4_0_f16_vbmi: nibble_table_half_vbmi, 18, &LEVELS_Q4_0, |b| read_f16(b, 0), false;
        mxfp4_bf16_vbmi: nibble_table_half_vbmi, 17, &KVALUES_MXFP4, |b| e8m0_to_f32_half(b[0]), true;
        mxfp4_f16_vbmi: nibble_table_half_vbmi, 17, &KVALUES_MXFP4, |b| e8m0_to_f32_half(b[0]), false;
    }

    /// The 16 values `table[c] * d` of a block with scale `d` (the f32
    /// kernel's very products, from the table's codes widened as `lo8`,
    /// `hi8`) rounded to bf16 (`BF16`) or f16: values 0-7 and 8-15.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn block_values<const BF16: bool>(lo8: __m256, hi8: __m256, ds: f32) -> (__m128i, __m128i) {
        let d = _mm256_set1_ps(ds);
        let (v0, v1) = (_mm256_mul_ps(lo8, d), _mm256_mul_ps(hi8, d));
        if BF16 {
            // A finite scale times the finite table gives no NaN: the
            // rounding alone is f32_to_bf16 there.
            let (a, c) = if ds.is_finite() {
                (
                    bf16x8::<true>(_mm256_castps_si256(v0)),
                    bf16x8::<true>(_mm256_castps_si256(v1)),
                )
            } else {
                (
                    bf16x8::<false>(_mm256_castps_si256(v0)),
                    bf16x8::<false>(_mm256_castps_si256(v1)),
                )
            };
            // packus interleaves 128-bit halves: a.lo c.lo a.hi c.hi.
            let p = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(a, c));
            (_mm256_castsi256_si128(p), _mm256_extracti128_si256::<1>(p))
        } else {
            (
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v0),
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v1),
            )
        }
    }

    /// The table's 16 codes widened to f32: codes 0-7 and 8-15.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn table_codes(table: &[i8; 16]) -> (__m256, __m256) {
        let mut t = [0u8; 16];
        for (t, &v) in t.iter_mut().zip(table) {
            *t = v as u8;
        }
        let codes = load16(&t, 0);
        (
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(codes))),
        )
    }

    /// [`nibble_table_half`] with one AVX-512 VBMI byte permute per block:
    /// the block's 16 values (32 bytes) are the table, and element `j`
    /// with nibble `n` takes bytes `2n` and `2n + 1`.
    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vbmi")]
    fn nibble_table_half_vbmi<const BB: usize, const BF16: bool>(
        src: &[u8],
        dst: &mut [u8],
        table: &[i8; 16],
        scale: impl Fn(&[u8]) -> f32,
    ) {
        let (lo8, hi8) = table_codes(table);
        let pair = _mm512_set1_epi16(0x0202);
        let odd = _mm512_set1_epi16(0x0100);
        for (b, y) in src.chunks_exact(BB).zip(dst.chunks_exact_mut(64)) {
            let (h0, h1) = block_values::<BF16>(lo8, hi8, scale(b));
            let values = _mm512_castsi256_si512(_mm256_set_m128i(h1, h0));
            let (lo, hi) = nibbles(load16(b, BB - 16));
            // Elements 0-15 are the low nibbles, 16-31 the high ones.
            let n16 = _mm512_cvtepu8_epi16(_mm256_set_m128i(hi, lo));
            let idx = _mm512_add_epi16(_mm512_mullo_epi16(n16, pair), odd);
            let out = _mm512_permutexvar_epi8(idx, values);
            let s = &mut y[..64];
            // SAFETY: `s` is exactly 64 writable bytes; unaligned store.
            unsafe { _mm512_storeu_si512(s.as_mut_ptr().cast(), out) }
        }
    }

    /// Stores 16 bytes to `y[at..at + 16]`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn store16(y: &mut [u8], at: usize, v: __m128i) {
        let s = &mut y[at..at + 16];
        // SAFETY: `s` is exactly 16 writable bytes; the store is unaligned.
        unsafe { _mm_storeu_si128(s.as_mut_ptr().cast(), v) }
    }

    /// [`nibble_table`] straight to 16-bit values: per block, the 16 values
    /// `table[c] * d` (the f32 kernel's very products) are rounded to bf16
    /// (`BF16`) or f16 once, split into a low-byte and a high-byte table,
    /// and each element's two bytes are looked up by its nibble.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn nibble_table_half<const BB: usize, const BF16: bool>(
        src: &[u8],
        dst: &mut [u8],
        table: &[i8; 16],
        scale: impl Fn(&[u8]) -> f32,
    ) {
        let (lo8, hi8) = table_codes(table);
        // Even bytes (low halves) first, then odd bytes (high halves).
        let split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        for (b, y) in src.chunks_exact(BB).zip(dst.chunks_exact_mut(64)) {
            let (h0, h1) = block_values::<BF16>(lo8, hi8, scale(b));
            let (s0, s1) = (_mm_shuffle_epi8(h0, split), _mm_shuffle_epi8(h1, split));
            let (low, high) = (_mm_unpacklo_epi64(s0, s1), _mm_unpackhi_epi64(s0, s1));
            let (lo, hi) = nibbles(load16(b, BB - 16));
            for (k, idx) in [lo, hi].into_iter().enumerate() {
                let (l, h) = (_mm_shuffle_epi8(low, idx), _mm_shuffle_epi8(high, idx));
                store16(y, 32 * k, _mm_unpacklo_epi8(l, h));
                store16(y, 32 * k + 16, _mm_unpackhi_epi8(l, h));
            }
        }
    }

    /// The AVX2 kernel for `ty`. Only call after detecting AVX2: the
    /// returned safe wrappers rely on it.
    pub(super) fn kernel(ty: GgmlType) -> Option<BlockFn> {
        use GgmlType as T;
        Some(match ty {
            T::IQ4_NL => iq4_nl,
            T::Q4_0 => q4_0,
            T::Q4_1 => q4_1,
            T::Q5_0 => q5_0,
            T::Q5_1 => q5_1,
            T::MXFP4 => mxfp4,
            T::Q8_0 => q8_0,
            T::BF16 => bf16,
            T::F16 if std::arch::is_x86_feature_detected!("f16c") => f16,
            T::Q4_K => q4_k,
            T::Q5_K => q5_k,
            _ => return None,
        })
    }

    /// Defines a safe `BlockFn` wrapper around an AVX2 function.
    macro_rules! wrapper {
        ($($name:ident => $imp:ident;)*) => {$(
            fn $name(src: &[u8], dst: &mut [f32]) {
                // SAFETY: `kernel` hands out this wrapper only after
                // `is_x86_feature_detected!` confirmed AVX2 (and F16C for
                // `f16`), so the CPU supports every instruction `$imp` is
                // compiled with.
                unsafe { $imp(src, dst) }
            }
        )*};
    }

    wrapper! {
        iq4_nl => iq4_nl_avx2;
        q4_0 => q4_0_avx2;
        q4_1 => q4_1_avx2;
        q5_0 => q5_0_avx2;
        q5_1 => q5_1_avx2;
        mxfp4 => mxfp4_avx2;
        q8_0 => q8_0_avx2;
        bf16 => bf16_avx2;
        f16 => f16_avx2_f16c;
        q4_k => q4_k_avx2;
        q5_k => q5_k_avx2;
    }

    /// The 16 bytes at `b[at..at + 16]`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn load16(b: &[u8], at: usize) -> __m128i {
        let s = &b[at..at + 16];
        // SAFETY: `s` is exactly 16 readable bytes; the load is unaligned.
        unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
    }

    /// The 32 bytes at `b[at..at + 32]`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn load32(b: &[u8], at: usize) -> __m256i {
        let s = &b[at..at + 32];
        // SAFETY: `s` is exactly 32 readable bytes; the load is unaligned.
        unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
    }

    /// Stores 8 floats to `y[at..at + 8]`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn store8(y: &mut [f32], at: usize, v: __m256) {
        let s = &mut y[at..at + 8];
        // SAFETY: `s` is exactly 8 writable floats; the store is unaligned.
        unsafe { _mm256_storeu_ps(s.as_mut_ptr(), v) }
    }

    /// `y[at..at + 16] = v[i] as f32 * d` for the 16 signed bytes of `v`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn store_i8x16(y: &mut [f32], at: usize, v: __m128i, d: __m256) {
        let a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
        let b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(v)));
        store8(y, at, _mm256_mul_ps(a, d));
        store8(y, at + 8, _mm256_mul_ps(b, d));
    }

    /// `y[at..at + 32] = v[i] as f32 * d - m` (or `+ m` when `ADD`) for the
    /// 32 unsigned bytes of `v`: a rounded product, then a rounded sum.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn store_u8x32<const ADD: bool>(y: &mut [f32], at: usize, v: __m256i, d: __m256, m: __m256) {
        let halves = [_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v)];
        for (h, half) in halves.into_iter().enumerate() {
            for (k, part) in [half, _mm_srli_si128::<8>(half)].into_iter().enumerate() {
                let p = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part)), d);
                let r = if ADD {
                    _mm256_add_ps(p, m)
                } else {
                    _mm256_sub_ps(p, m)
                };
                store8(y, at + 16 * h + 8 * k, r);
            }
        }
    }

    /// Low and high nibbles of the 16 bytes `q`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn nibbles(q: __m128i) -> (__m128i, __m128i) {
        let m4 = _mm_set1_epi8(0x0f);
        (
            _mm_and_si128(q, m4),
            _mm_and_si128(_mm_srli_epi16::<4>(q), m4),
        )
    }

    /// Shared body of the `{ scale, qs[16] }` nibble-table formats: blocks
    /// of `BB` bytes whose last 16 are the nibbles, scale read by `scale`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn nibble_table<const BB: usize>(
        src: &[u8],
        dst: &mut [f32],
        table: &[i8; 16],
        scale: impl Fn(&[u8]) -> f32,
    ) {
        let mut t = [0u8; 16];
        for (t, &v) in t.iter_mut().zip(table) {
            *t = v as u8;
        }
        let table = load16(&t, 0);
        for (b, y) in src.chunks_exact(BB).zip(dst.chunks_exact_mut(32)) {
            let d = _mm256_set1_ps(scale(b));
            let (lo, hi) = nibbles(load16(b, BB - 16));
            store_i8x16(y, 0, _mm_shuffle_epi8(table, lo), d);
            store_i8x16(y, 16, _mm_shuffle_epi8(table, hi), d);
        }
    }

    #[target_feature(enable = "avx2")]
    fn iq4_nl_avx2(src: &[u8], dst: &mut [f32]) {
        nibble_table::<18>(src, dst, &KVALUES_IQ4NL, |b| read_f16(b, 0));
    }

    #[target_feature(enable = "avx2")]
    fn q4_0_avx2(src: &[u8], dst: &mut [f32]) {
        nibble_table::<18>(src, dst, &LEVELS_Q4_0, |b| read_f16(b, 0));
    }

    #[target_feature(enable = "avx2")]
    fn mxfp4_avx2(src: &[u8], dst: &mut [f32]) {
        nibble_table::<17>(src, dst, &KVALUES_MXFP4, |b| e8m0_to_f32_half(b[0]));
    }

    /// Q4_1 / Q5_1 body: `{ d, m, [qh[4]], qs[16] }` blocks of `BB` bytes,
    /// `y = code * d + m`; Q5_1 (`BB` = 24) adds the fifth bits.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn scale_min_32<const BB: usize>(src: &[u8], dst: &mut [f32]) {
        for (b, y) in src.chunks_exact(BB).zip(dst.chunks_exact_mut(32)) {
            let (d, m) = (
                _mm256_set1_ps(read_f16(b, 0)),
                _mm256_set1_ps(read_f16(b, 2)),
            );
            let (mut lo, mut hi) = nibbles(load16(b, BB - 16));
            if BB == 24 {
                let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                lo = _mm_or_si128(lo, bits_to_0x10(qh as u16));
                hi = _mm_or_si128(hi, bits_to_0x10((qh >> 16) as u16));
            }
            store_u8x32::<true>(y, 0, _mm256_set_m128i(hi, lo), d, m);
        }
    }

    #[target_feature(enable = "avx2")]
    fn q4_1_avx2(src: &[u8], dst: &mut [f32]) {
        scale_min_32::<20>(src, dst);
    }

    #[target_feature(enable = "avx2")]
    fn q5_1_avx2(src: &[u8], dst: &mut [f32]) {
        scale_min_32::<24>(src, dst);
    }

    /// 16 bytes, byte `j` = 0x10 if bit `j` of `bits` is set, else 0.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn bits_to_0x10(bits: u16) -> __m128i {
        let v = _mm_set1_epi16(bits as i16);
        let spread = _mm_shuffle_epi8(v, _mm_set_epi64x(0x0101_0101_0101_0101, 0));
        let sel = _mm_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm_cmpeq_epi8(_mm_and_si128(spread, sel), sel);
        _mm_and_si128(set, _mm_set1_epi8(0x10))
    }

    #[target_feature(enable = "avx2")]
    fn q5_0_avx2(src: &[u8], dst: &mut [f32]) {
        let sixteen = _mm_set1_epi8(16);
        for (b, y) in src.chunks_exact(22).zip(dst.chunks_exact_mut(32)) {
            let d = _mm256_set1_ps(read_f16(b, 0));
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            let (lo, hi) = nibbles(load16(b, 6));
            let lo = _mm_or_si128(lo, bits_to_0x10(qh as u16));
            let hi = _mm_or_si128(hi, bits_to_0x10((qh >> 16) as u16));
            store_i8x16(y, 0, _mm_sub_epi8(lo, sixteen), d);
            store_i8x16(y, 16, _mm_sub_epi8(hi, sixteen), d);
        }
    }

    #[target_feature(enable = "avx2")]
    fn q8_0_avx2(src: &[u8], dst: &mut [f32]) {
        for (b, y) in src.chunks_exact(34).zip(dst.chunks_exact_mut(32)) {
            let d = _mm256_set1_ps(read_f16(b, 0));
            store_i8x16(y, 0, load16(b, 2), d);
            store_i8x16(y, 16, load16(b, 18), d);
        }
    }

    /// Shared body of the 16-bit float rows: 8 elements per `wide` call,
    /// the tail through `one`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn rows16(
        src: &[u8],
        dst: &mut [f32],
        wide: impl Fn(__m128i) -> __m256,
        one: impl Fn(u16) -> f32,
    ) {
        // 32 elements an iteration: one bounds check for four stores
        let mut s4 = src.chunks_exact(64);
        let mut y4 = dst.chunks_exact_mut(32);
        for (b, y) in (&mut s4).zip(&mut y4) {
            store8(y, 0, wide(load16(b, 0)));
            store8(y, 8, wide(load16(b, 16)));
            store8(y, 16, wide(load16(b, 32)));
            store8(y, 24, wide(load16(b, 48)));
        }
        let mut s = s4.remainder().chunks_exact(16);
        let mut y = y4.into_remainder().chunks_exact_mut(8);
        for (b, y) in (&mut s).zip(&mut y) {
            store8(y, 0, wide(load16(b, 0)));
        }
        let tail = s.remainder().chunks_exact(2);
        for (y, b) in y.into_remainder().iter_mut().zip(tail) {
            *y = one(u16::from_le_bytes([b[0], b[1]]));
        }
    }

    #[target_feature(enable = "avx2")]
    fn bf16_avx2(src: &[u8], dst: &mut [f32]) {
        let wide = |v| _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(v)));
        rows16(src, dst, wide, bf16_to_f32);
    }

    #[target_feature(enable = "avx2,f16c")]
    fn f16_avx2_f16c(src: &[u8], dst: &mut [f32]) {
        rows16(src, dst, |v| _mm256_cvtph_ps(v), f16_to_f32);
    }

    #[target_feature(enable = "avx2")]
    fn q4_k_avx2(src: &[u8], dst: &mut [f32]) {
        k_4bit::<144, false>(src, dst);
    }

    #[target_feature(enable = "avx2")]
    fn q5_k_avx2(src: &[u8], dst: &mut [f32]) {
        k_4bit::<176, true>(src, dst);
    }

    /// Shared body of Q4_K (`{ d, dmin, scales[12], qs[128] }`) and, with
    /// `QH`, Q5_K (`qh[32]` before `qs`: bit `s` of `qh[l]` is the fifth bit
    /// of element `l` of sub-block `s`), blocks of `BB` bytes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn k_4bit<const BB: usize, const QH: bool>(src: &[u8], dst: &mut [f32]) {
        let (m4, one) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(1));
        let qs = if QH { 48 } else { 16 };
        for (b, y) in src.chunks_exact(BB).zip(dst.chunks_exact_mut(256)) {
            let (d, min) = (read_f16(b, 0), read_f16(b, 2));
            let (sc, mn) = scale_min_k4(&b[4..16]);
            let qh = if QH {
                load32(b, 16)
            } else {
                _mm256_setzero_si256()
            };
            for p in 0..4 {
                let ql = load32(b, qs + 32 * p);
                let codes = [
                    _mm256_and_si256(ql, m4),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql), m4),
                ];
                for (k, mut code) in codes.into_iter().enumerate() {
                    let s = 2 * p + k;
                    if QH {
                        // Bit s of each qh byte, moved to bit 4. The 16-bit
                        // shift brings in neighbour bits above bit 0 only.
                        let h = _mm256_and_si256(
                            _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s as i32)),
                            one,
                        );
                        code = _mm256_or_si256(code, _mm256_slli_epi16::<4>(h));
                    }
                    let dl = _mm256_set1_ps(d * f32::from(sc[s]));
                    let ml = _mm256_set1_ps(min * f32::from(mn[s]));
                    store_u8x32::<false>(y, 32 * s, code, dl, ml);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::scalar_kernel;
    use super::*;

    /// xorshift64*: test data only.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| (self.next() >> 56) as u8).collect()
        }
    }

    /// Random blocks of `ty` where block `i` has every f16 scale field at
    /// `f16_at` set to `i` (so 65536 blocks cover every scale bit pattern,
    /// subnormals, infinities and NaNs included), decoded both ways.
    fn check(ty: GgmlType, f16_at: &[usize], blocks: usize) {
        let Some(simd) = kernel(ty) else {
            pleio_testkit::skip!("no SIMD kernel for {ty} on this CPU; nothing to compare");
        };
        let scalar = scalar_kernel(ty).expect("decodable");
        let (bb, be) = (ty.block_bytes(), ty.block_elems());
        let mut src = Rng(0x9e37_79b9_7f4a_7c15 ^ u64::from(ty.id())).bytes(blocks * bb);
        for (i, b) in src.chunks_exact_mut(bb).enumerate() {
            if ty == GgmlType::MXFP4 {
                b[0] = i as u8;
            }
            for (k, &at) in f16_at.iter().enumerate() {
                // A second scale walks the patterns in another order.
                let h = (i as u16).rotate_left(5 * k as u32);
                b[at..at + 2].copy_from_slice(&h.to_le_bytes());
            }
        }
        // Also odd lengths and offsets: every prefix count of blocks up to 3.
        let n = blocks * be;
        let (mut a, mut b) = (vec![0f32; n], vec![1f32; n]);
        scalar(&src, &mut a);
        simd(&src, &mut b);
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            // Which NaN payload survives `NaN op NaN` depends on operand
            // order, which the compiler may swap for commutative operations
            // (Rust and C both leave it unspecified); only NaN-ness is exact.
            if x.is_nan() && y.is_nan() {
                continue;
            }
            assert_eq!(
                x.to_bits(),
                y.to_bits(),
                "{ty}: element {i} scalar {x} simd {y}"
            );
        }
        for k in 0..=3.min(blocks) {
            let (mut a, mut b) = (vec![0f32; k * be], vec![1f32; k * be]);
            scalar(&src[bb..bb + k * bb], &mut a);
            simd(&src[bb..bb + k * bb], &mut b);
            let canon = |v: &[f32]| -> Vec<u32> {
                v.iter()
                    .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
                    .collect()
            };
            assert_eq!(canon(&a), canon(&b));
        }
    }

    /// The 16-bit kernels against the scalar decode then the scalar
    /// rounding, on blocks covering every scale pattern.
    fn check_half(ty: GgmlType, f16_at: &[usize], blocks: usize) {
        use super::super::convert::{f32_to_bf16, f32_to_f16};
        let scalar = scalar_kernel(ty).expect("decodable");
        let (bb, be) = (ty.block_bytes(), ty.block_elems());
        let mut src = Rng(0x51ed_270b_5b8f_3a11 ^ u64::from(ty.id())).bytes(blocks * bb);
        for (i, b) in src.chunks_exact_mut(bb).enumerate() {
            if ty == GgmlType::MXFP4 {
                b[0] = i as u8;
            }
            for &at in f16_at {
                b[at..at + 2].copy_from_slice(&(i as u16).to_le_bytes());
            }
        }
        let mut f = vec![0f32; blocks * be];
        scalar(&src, &mut f);
        #[cfg(target_arch = "x86_64")]
        let kernels: Vec<(bool, HalfFn)> = {
            let avx2 = std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("f16c");
            let vbmi = std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vbmi");
            let mut k = Vec::new();
            for bf16 in [true, false] {
                for v in [false, true] {
                    if avx2 && (vbmi || !v) {
                        k.extend(avx2::half_kernel(ty, bf16, v).map(|f| (bf16, f)));
                    }
                }
            }
            k
        };
        #[cfg(not(target_arch = "x86_64"))]
        let kernels: Vec<(bool, HalfFn)> = Vec::new();
        if kernels.is_empty() {
            pleio_testkit::skip_case!("no 16-bit kernel for {ty} on this CPU; nothing to compare");
        }
        for (bf16, half) in kernels {
            let mut got = vec![0x5Au8; 2 * f.len()];
            half(&src, &mut got);
            for (i, (x, g)) in f.iter().zip(got.chunks_exact(2)).enumerate() {
                let g = u16::from_le_bytes([g[0], g[1]]);
                let want = if bf16 {
                    f32_to_bf16(*x)
                } else {
                    f32_to_f16(*x)
                };
                // A NaN's payload after arithmetic is unspecified (see check).
                let nan = |h: u16| {
                    if bf16 {
                        h & 0x7f80 == 0x7f80 && h & 0x7f != 0
                    } else {
                        h & 0x7c00 == 0x7c00 && h & 0x3ff != 0
                    }
                };
                if nan(want) && nan(g) {
                    continue;
                }
                assert_eq!(g, want, "{ty} bf16={bf16}: element {i} ({x})");
            }
        }
    }

    #[test]
    fn half_kernels_match_decode_then_round() {
        check_half(GgmlType::IQ4_NL, &[0], 65536);
        check_half(GgmlType::Q4_0, &[0], 65536);
        check_half(GgmlType::MXFP4, &[], 4096);
    }

    #[test]
    fn iq4_nl_matches_scalar() {
        check(GgmlType::IQ4_NL, &[0], 65536);
    }

    #[test]
    fn q4_0_matches_scalar() {
        check(GgmlType::Q4_0, &[0], 65536);
    }

    #[test]
    fn q4_1_matches_scalar() {
        check(GgmlType::Q4_1, &[0, 2], 65536);
    }

    #[test]
    fn q5_1_matches_scalar() {
        check(GgmlType::Q5_1, &[0, 2], 65536);
    }

    #[test]
    fn mxfp4_matches_scalar() {
        // Block i has scale byte i % 256: every E8M0 value, subnormal
        // results (e < 2) and 2^127 (e = 255) included.
        check(GgmlType::MXFP4, &[], 4096);
    }

    #[test]
    fn q5_0_matches_scalar() {
        check(GgmlType::Q5_0, &[0], 65536);
    }

    #[test]
    fn q8_0_matches_scalar() {
        check(GgmlType::Q8_0, &[0], 65536);
    }

    #[test]
    fn q4_k_matches_scalar() {
        check(GgmlType::Q4_K, &[0, 2], 65536);
    }

    #[test]
    fn q5_k_matches_scalar() {
        check(GgmlType::Q5_K, &[0, 2], 65536);
    }

    #[test]
    fn bf16_matches_scalar() {
        // Every bf16 bit pattern, then lengths that end in each loop: 32, 8
        // and 1 elements a step.
        let all: Vec<u8> = (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect();
        for len in [65536, 65535, 40, 23, 7, 1, 0] {
            check_words(GgmlType::BF16, &all[..2 * len]);
        }
    }

    #[test]
    fn f16_matches_scalar() {
        // Every half bit pattern (NaN payloads included), then tails (as
        // for bf16).
        let all: Vec<u8> = (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect();
        for len in [65536, 65535, 40, 23, 7, 1, 0] {
            check_words(GgmlType::F16, &all[..2 * len]);
        }
    }

    fn check_words(ty: GgmlType, src: &[u8]) {
        let Some(simd) = kernel(ty) else {
            return;
        };
        let scalar = scalar_kernel(ty).expect("decodable");
        let n = src.len() / 2;
        let (mut a, mut b) = (vec![0f32; n], vec![1f32; n]);
        scalar(src, &mut a);
        simd(src, &mut b);
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(x.to_bits(), y.to_bits(), "{ty} element {i}");
        }
    }

    #[test]
    fn kernels_exist_where_avx2_does() {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            use GgmlType as T;
            for t in [
                T::IQ4_NL,
                T::Q4_0,
                T::Q4_1,
                T::Q5_0,
                T::Q5_1,
                T::Q8_0,
                T::MXFP4,
                T::BF16,
                T::Q4_K,
                T::Q5_K,
            ] {
                assert!(kernel(t).is_some(), "{t}");
            }
            if std::arch::is_x86_feature_detected!("f16c") {
                assert!(kernel(T::F16).is_some());
            }
        }
        assert!(kernel(GgmlType::Q6_K).is_none());
        assert!(kernel(GgmlType::F32).is_none());
    }
}
