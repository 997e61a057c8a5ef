//! f32 to the 16-bit output types, rounding to nearest, ties to even, from
//! the exact f32 value (what `torch.Tensor.to`, NumPy and `ml_dtypes` do),
//! one value or a row at a time (rows use AVX2/F16C where the CPU has
//! them, bit-identical to the scalar functions).

/// bf16 bits of `x`, rounded to nearest even. NaN becomes the quiet NaN
/// `0x7fc0` with `x`'s sign (as `ml_dtypes` and Eigen do).
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) as u16 & 0x8000) | 0x7fc0;
    }
    let lsb = (b >> 16) & 1;
    // Cannot overflow: the largest finite bits 0x7f7fffff + 0x8000 stays
    // below 0x80000000 (rounds to infinity, 0x7f80, as it should).
    ((b + 0x7fff + lsb) >> 16) as u16
}

/// IEEE binary16 bits of `x`, rounded to nearest even; overflow becomes
/// infinity, values below half the smallest subnormal become zero. NaN
/// stays NaN, made quiet, with the top payload bits kept (as x86 F16C
/// `vcvtps2ph` does).
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return if man == 0 {
            sign | 0x7c00
        } else {
            sign | 0x7e00 | (man >> 13) as u16
        };
    }
    // Exponent rebiased for binary16.
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // Subnormal (or zero) in binary16: value = m * 2^-24 with
        // m = (1.man) >> (14 - e); below 2^-25 everything rounds to zero.
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rem = m & ((1u32 << shift) - 1);
        let mut r = m >> shift;
        if rem > half || (rem == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        // A carry into the exponent is right, up to infinity (0x7c00).
        r += 1;
    }
    sign | r as u16
}

/// Converts a row of f32 to bfloat16 bits ([`f32_to_bf16`] of each; extra
/// elements of the longer slice are left alone).
pub fn f32_to_bf16_row(src: &[f32], dst: &mut [u16]) {
    if !super::convert_simd::bf16_row(src, dst) {
        f32_to_bf16_row_scalar(src, dst);
    }
}

/// Converts a row of f32 to IEEE half bits ([`f32_to_f16`] of each; extra
/// elements of the longer slice are left alone).
pub fn f32_to_f16_row(src: &[f32], dst: &mut [u16]) {
    if !super::convert_simd::f16_row(src, dst) {
        f32_to_f16_row_scalar(src, dst);
    }
}

/// `src` written as little-endian f32 bytes: `dst.len() / 4` values
/// (extra elements of `src` or trailing bytes are left alone).
pub fn f32_row_le(src: &[f32], dst: &mut [u8]) {
    for (y, x) in dst.chunks_exact_mut(4).zip(src) {
        y.copy_from_slice(&x.to_le_bytes());
    }
}

/// [`f32_to_bf16_row`] writing little-endian bytes: `dst.len() / 2`
/// values (extra elements of `src` or a last odd byte are left alone).
pub fn f32_to_bf16_row_le(src: &[f32], dst: &mut [u8]) {
    if !super::convert_simd::bf16_row_le(src, dst) {
        for (y, &x) in dst.chunks_exact_mut(2).zip(src) {
            y.copy_from_slice(&f32_to_bf16(x).to_le_bytes());
        }
    }
}

/// [`f32_to_f16_row`] writing little-endian bytes: `dst.len() / 2`
/// values (extra elements of `src` or a last odd byte are left alone).
pub fn f32_to_f16_row_le(src: &[f32], dst: &mut [u8]) {
    if !super::convert_simd::f16_row_le(src, dst) {
        for (y, &x) in dst.chunks_exact_mut(2).zip(src) {
            y.copy_from_slice(&f32_to_f16(x).to_le_bytes());
        }
    }
}

/// The scalar reference of [`f32_to_bf16_row`].
pub fn f32_to_bf16_row_scalar(src: &[f32], dst: &mut [u16]) {
    for (y, &x) in dst.iter_mut().zip(src) {
        *y = f32_to_bf16(x);
    }
}

/// The scalar reference of [`f32_to_f16_row`].
pub fn f32_to_f16_row_scalar(src: &[f32], dst: &mut [u16]) {
    for (y, &x) in dst.iter_mut().zip(src) {
        *y = f32_to_f16(x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::float::{bf16_to_f32, f16_to_f32};

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // Exactly halfway between 0x3f80 and 0x3f81: to even (0x3f80).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        // Halfway between 0x3f81 and 0x3f82: to even (0x3f82).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80);
        assert_eq!(f32_to_bf16(-0.0), 0x8000);
        assert_eq!(f32_to_bf16(f32::NAN), 0x7fc0);
        assert_eq!(f32_to_bf16(-f32::NAN), 0xffc0);
        assert_eq!(f32_to_bf16(f32::from_bits(1)), 0); // smallest subnormal
    }

    #[test]
    fn f16_round_trips_every_half() {
        for h in 0..=u16::MAX {
            let x = f16_to_f32(h);
            let back = f32_to_f16(x);
            if x.is_nan() {
                assert!(f16_to_f32(back).is_nan(), "{h:#06x}");
                assert_eq!(back & 0x8000, h & 0x8000);
            } else {
                assert_eq!(back, h, "{h:#06x}");
            }
        }
    }

    #[test]
    fn f16_rounds_to_nearest_even() {
        // Midpoints between consecutive halves round to the even one, just
        // above them up, just below down; across normals and subnormals.
        for h in (0u16..0x7bff)
            .step_by(7)
            .chain([0, 1, 2, 0x3ff, 0x400, 0x7bfe])
        {
            let (lo, hi) = (f16_to_f32(h) as f64, f16_to_f32(h + 1) as f64);
            let mid = ((lo + hi) / 2.0) as f32;
            assert_eq!(
                mid as f64,
                (lo + hi) / 2.0,
                "midpoint of {h:#x} exact in f32"
            );
            let even = if h & 1 == 0 { h } else { h + 1 };
            assert_eq!(f32_to_f16(mid), even, "{h:#06x}");
            assert_eq!(f32_to_f16(f32::from_bits(mid.to_bits() + 1)), h + 1);
            assert_eq!(f32_to_f16(f32::from_bits(mid.to_bits() - 1)), h);
        }
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(65519.99), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(1e-8), 0);
        assert_eq!(f32_to_f16(-1e-8), 0x8000);
        assert_eq!(f32_to_f16(f32::INFINITY), 0x7c00);
        assert_eq!(f32_to_f16(f32::NAN) & 0x7e00, 0x7e00);
    }

    #[test]
    fn bf16_matches_widening() {
        for h in (0..=u16::MAX).step_by(3) {
            let x = bf16_to_f32(h);
            if !x.is_nan() {
                assert_eq!(f32_to_bf16(x), h);
            }
        }
    }

    /// bf16 by exact arithmetic: the nearest bf16 to x, ties to even.
    fn bf16_oracle(x: f32) -> u16 {
        let b = x.to_bits();
        let (hi, lo) = (b >> 16, b & 0xFFFF);
        let up = lo > 0x8000 || (lo == 0x8000 && hi & 1 == 1);
        (hi + u32::from(up)) as u16
    }

    /// f16 by f64 arithmetic: the nearest of the neighbouring halves.
    fn f16_oracle(x: f32) -> u16 {
        let sign = if x.is_sign_negative() { 0x8000u16 } else { 0 };
        let a = f64::from(x).abs();
        let val = |h: u16| f64::from(f16_to_f32(h));
        if a >= 65520.0 {
            return sign | 0x7C00;
        }
        // The largest h with val(h) <= a.
        let (mut lo, mut hi) = (0u16, 0x7BFFu16);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if val(mid) <= a {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        if val(lo) == a {
            return sign | lo;
        }
        let (db, da) = (a - val(lo), val(lo + 1) - a);
        let pick = if db < da || (db == da && lo & 1 == 0) {
            lo
        } else {
            lo + 1
        };
        sign | pick
    }

    /// Random bits, boundaries, and a sweep of the half range.
    fn samples() -> Vec<u32> {
        let mut v: Vec<u32> = vec![
            0,
            0x8000_0000,
            1,
            0x0000_8000,
            0x0001_8000,
            0x3F80_8000,
            0x3F81_8000,
            0x7F7F_FFFF,
            0xFF7F_FFFF,
            0x7F80_0000,
            0xFF80_0000,
            0x7FC0_0000,
            0xFFC0_0001,
            0x7F80_0001,
            0x477F_E000,
            0x477F_F000,
            0x477F_EFFF,
            0x3880_0000,
            0x387F_E000,
            0x387F_F000,
            0x3380_0000,
            0x3300_0000,
            0x3300_0001,
            0x33C0_0000,
        ];
        let mut s = 0x1234_5678_9ABC_DEF0u64;
        for _ in 0..200_000 {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            v.push((s >> 32) as u32);
        }
        for b in (0x3300_0000u32..0x4780_0000).step_by(977) {
            v.push(b);
            v.push(b | 0x8000_0000);
        }
        v
    }

    #[test]
    fn bf16_rows_match_an_oracle_fast_and_scalar() {
        let xs: Vec<f32> = samples().into_iter().map(f32::from_bits).collect();
        let (mut fast, mut slow) = (vec![0u16; xs.len()], vec![0u16; xs.len()]);
        f32_to_bf16_row(&xs, &mut fast);
        f32_to_bf16_row_scalar(&xs, &mut slow);
        for ((&x, &f), &s) in xs.iter().zip(&fast).zip(&slow) {
            let want = if x.is_nan() {
                ((x.to_bits() >> 16) as u16 & 0x8000) | 0x7FC0
            } else {
                bf16_oracle(x)
            };
            assert_eq!(s, want, "{:#010x}", x.to_bits());
            assert_eq!(f, want, "simd {:#010x}", x.to_bits());
        }
    }

    #[test]
    fn f16_rows_match_an_oracle_fast_and_scalar() {
        let xs: Vec<f32> = samples().into_iter().map(f32::from_bits).collect();
        let (mut fast, mut slow) = (vec![0u16; xs.len()], vec![0u16; xs.len()]);
        f32_to_f16_row(&xs, &mut fast);
        f32_to_f16_row_scalar(&xs, &mut slow);
        for ((&x, &f), &s) in xs.iter().zip(&fast).zip(&slow) {
            let want = if x.is_nan() {
                let b = x.to_bits();
                (((b >> 16) & 0x8000) | 0x7E00 | ((b >> 13) & 0x3FF)) as u16
            } else {
                f16_oracle(x)
            };
            assert_eq!(s, want, "{:#010x}", x.to_bits());
            assert_eq!(f, want, "simd {:#010x}", x.to_bits());
        }
    }

    #[test]
    fn byte_rows_equal_the_u16_rows() {
        let xs: Vec<f32> = samples().into_iter().map(f32::from_bits).collect();
        // Odd lengths and offsets exercise the tails and unaligned stores.
        for (start, len) in [(0, xs.len()), (1, 17), (3, 100), (5, 7), (0, 0)] {
            let x = &xs[start..start + len];
            let mut h = vec![0u16; len];
            let mut b = vec![0u8; 2 * len + 1];
            f32_to_bf16_row_scalar(x, &mut h);
            f32_to_bf16_row_le(x, &mut b[1..]);
            let got: Vec<u16> = b[1..]
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect();
            assert_eq!(got, h, "bf16 {start} {len}");
            f32_to_f16_row_scalar(x, &mut h);
            f32_to_f16_row_le(x, &mut b[1..]);
            let got: Vec<u16> = b[1..]
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect();
            assert_eq!(got, h, "f16 {start} {len}");
        }
    }
}
