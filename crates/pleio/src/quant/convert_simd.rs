//! AVX2 / F16C row kernels for [`super::convert`], bit-identical to its
//! scalar functions.

/// [`super::convert::f32_to_bf16`] over a row with AVX2; `false` if the
/// CPU lacks it (the caller runs the scalar loop).
pub(super) fn bf16_row(src: &[f32], dst: &mut [u16]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was just detected.
            unsafe { avx2::bf16_row(src, dst) };
            return true;
        }
    }
    let _ = (src, dst);
    false
}

/// [`super::convert::f32_to_f16`] over a row with F16C; `false` if the
/// CPU lacks it.
pub(super) fn f16_row(src: &[f32], dst: &mut [u16]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            // SAFETY: AVX2 and F16C were just detected.
            unsafe { avx2::f16_row(src, dst) };
            return true;
        }
    }
    let _ = (src, dst);
    false
}

/// [`bf16_row`] writing little-endian bytes (`dst.len() / 2` values).
pub(super) fn bf16_row_le(src: &[f32], dst: &mut [u8]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was just detected.
            unsafe { avx2::bf16_row_le(src, dst) };
            return true;
        }
    }
    let _ = (src, dst);
    false
}

/// [`f16_row`] writing little-endian bytes (`dst.len() / 2` values).
pub(super) fn f16_row_le(src: &[f32], dst: &mut [u8]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            // SAFETY: AVX2 and F16C were just detected.
            unsafe { avx2::f16_row_le(src, dst) };
            return true;
        }
    }
    let _ = (src, dst);
    false
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use std::arch::x86_64::*;

    use super::super::convert::{f32_to_bf16, f32_to_f16};

    /// 8 floats from `x[at..at + 8]`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn load8(x: &[f32], at: usize) -> __m256i {
        let s = &x[at..at + 8];
        // SAFETY: `s` is exactly 8 readable floats; the load is unaligned.
        unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
    }

    /// The bf16 bits of the 8 floats in `b`, in the low 16 bits of each
    /// lane: `f32_to_bf16`'s integer rounding (add 0x7FFF plus the kept
    /// lsb, shift), NaN as the quiet NaN 0x7FC0 with its sign.
    ///
    /// With `CANON` the caller guarantees every NaN lane is the canonical
    /// 0x7FC00000, which the rounding alone already maps to 0x7FC0, so the
    /// NaN blend is skipped.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(in crate::quant) fn bf16x8<const CANON: bool>(b: __m256i) -> __m256i {
        let hi = _mm256_srli_epi32::<16>(b);
        let lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
        let rounded = _mm256_srli_epi32::<16>(_mm256_add_epi32(
            _mm256_add_epi32(b, _mm256_set1_epi32(0x7FFF)),
            lsb,
        ));
        if CANON {
            return rounded;
        }
        // NaN lanes (unordered with themselves): the sign over 0x7FC0.
        let f = _mm256_castsi256_ps(b);
        let is_nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(f, f));
        let quiet = _mm256_or_si256(
            _mm256_and_si256(hi, _mm256_set1_epi32(0x8000)),
            _mm256_set1_epi32(0x7FC0),
        );
        _mm256_blendv_epi8(rounded, quiet, is_nan)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn bf16_row(src: &[f32], dst: &mut [u16]) {
        let n = src.len().min(dst.len());
        let n16 = n / 16 * 16;
        for i in (0..n16).step_by(16) {
            let a = bf16x8::<false>(load8(src, i));
            let b = bf16x8::<false>(load8(src, i + 8));
            // packus interleaves 128-bit halves: a.lo b.lo a.hi b.hi.
            let p = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(a, b));
            let out = &mut dst[i..i + 16];
            // SAFETY: `out` is exactly 16 writable u16; unaligned store.
            unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), p) };
        }
        for i in n16..n {
            dst[i] = f32_to_bf16(src[i]);
        }
    }

    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn f16_row(src: &[f32], dst: &mut [u16]) {
        let n = src.len().min(dst.len());
        let n8 = n / 8 * 8;
        for i in (0..n8).step_by(8) {
            let h =
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_castsi256_ps(load8(src, i)));
            let out = &mut dst[i..i + 8];
            // SAFETY: `out` is exactly 8 writable u16; unaligned store.
            unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), h) };
        }
        for i in n8..n {
            dst[i] = f32_to_f16(src[i]);
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn bf16_row_le(src: &[f32], dst: &mut [u8]) {
        let n = src.len().min(dst.len() / 2);
        let n16 = n / 16 * 16;
        for i in (0..n16).step_by(16) {
            let a = bf16x8::<false>(load8(src, i));
            let b = bf16x8::<false>(load8(src, i + 8));
            let p = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(a, b));
            let out = &mut dst[2 * i..2 * i + 32];
            // SAFETY: `out` is exactly 32 writable bytes; unaligned store.
            unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), p) };
        }
        for i in n16..n {
            dst[2 * i..2 * i + 2].copy_from_slice(&f32_to_bf16(src[i]).to_le_bytes());
        }
    }

    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn f16_row_le(src: &[f32], dst: &mut [u8]) {
        let n = src.len().min(dst.len() / 2);
        let n8 = n / 8 * 8;
        for i in (0..n8).step_by(8) {
            let h =
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_castsi256_ps(load8(src, i)));
            let out = &mut dst[2 * i..2 * i + 16];
            // SAFETY: `out` is exactly 16 writable bytes; unaligned store.
            unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), h) };
        }
        for i in n8..n {
            dst[2 * i..2 * i + 2].copy_from_slice(&f32_to_f16(src[i]).to_le_bytes());
        }
    }
}
