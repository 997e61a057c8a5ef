//! FP4 (e2m1) block formats: MXFP4 (an E8M0 scale per 32) and NVFP4 (a UE4M3
//! scale per 16, blocks of 64), after ggml's `dequantize_row_mxfp4/nvfp4`.
//!
//! Both use ggml's `kvalues_mxfp4`, the e2m1 values doubled, so each scale
//! conversion returns half the scale (`ggml_e8m0_to_fp32_half`,
//! `ggml_ue4m3_to_fp32`).

use super::float::each_block;
use super::legacy::decode_nibbles;

/// `kvalues_mxfp4` from ggml-common.h: e2m1 values times two.
pub(super) const KVALUES_MXFP4: [i8; 16] =
    [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// ggml's `ggml_e8m0_to_fp32_half`: `2^(x - 128)`, built from bits. For
/// `x < 2` it is an f32 subnormal; `x = 255` gives 2^127 (ggml does not
/// treat the E8M0 NaN code specially).
#[inline(always)]
pub(super) fn e8m0_to_f32_half(x: u8) -> f32 {
    let bits = if x < 2 {
        0x0020_0000u32 << x
    } else {
        u32::from(x - 1) << 23
    };
    f32::from_bits(bits)
}

/// ggml's `ggml_ue4m3_to_fp32`: unsigned E4M3 (bias 7) times 0.5. Bit 7 is
/// ignored except that 0x7F (the NaN code) and 0x00 both give 0.0, so 0xFF
/// decodes as 0x7F would if it were finite (240). Every result is exact.
#[inline(always)]
pub(super) fn ue4m3_to_f32(x: u8) -> f32 {
    if x == 0 || x == 0x7f {
        return 0.0;
    }
    let exp = i32::from((x >> 3) & 0x0f);
    let man = f32::from(x & 0x07);
    let raw = if exp == 0 {
        man * pow2(-9)
    } else {
        (1.0 + man / 8.0) * pow2(exp - 7)
    };
    raw * 0.5
}

/// 2^e for -126 <= e <= 127 (`ldexpf(1, e)`), exact.
#[inline(always)]
fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// MXFP4: `{ e: u8, qs[16] }`, `y = kvalues_mxfp4[q] * 2^(e - 128)`.
pub(super) fn decode_mxfp4(src: &[u8], dst: &mut [f32]) {
    each_block::<17, 32>(src, dst, |b, y| {
        decode_nibbles(&b[1..], &KVALUES_MXFP4, e8m0_to_f32_half(b[0]), y)
    });
}

/// NVFP4: `{ d: [u8; 4], qs[32] }`; sub-block `s` of 16 decodes `qs[8s..8s+8]`
/// (low nibbles first) with scale `ue4m3(d[s])`.
pub(super) fn decode_nvfp4(src: &[u8], dst: &mut [f32]) {
    each_block::<36, 64>(src, dst, |b, y| {
        for ((&d, q), y) in b[..4]
            .iter()
            .zip(b[4..].chunks_exact(8))
            .zip(y.chunks_exact_mut(16))
        {
            decode_nibbles(q, &KVALUES_MXFP4, ue4m3_to_f32(d), y);
        }
    });
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)] // index-based expectations read best
mod tests {
    use super::*;

    #[test]
    fn e8m0_half_is_two_to_the_x_minus_128() {
        for x in 0..=255u8 {
            assert_eq!(
                f64::from(e8m0_to_f32_half(x)),
                2f64.powi(i32::from(x) - 128),
                "{x}"
            );
        }
    }

    #[test]
    fn ue4m3_matches_definition() {
        for x in 0..=255u8 {
            let (e, m) = (i32::from((x >> 3) & 15), f64::from(x & 7));
            let want = if x == 0 || x == 0x7f {
                0.0
            } else if e == 0 {
                m * 2f64.powi(-9) * 0.5
            } else {
                (1.0 + m / 8.0) * 2f64.powi(e - 7) * 0.5
            };
            assert_eq!(f64::from(ue4m3_to_f32(x)), want, "{x:#04x}");
        }
        assert_eq!(ue4m3_to_f32(0x7e), 224.0); // (1 + 6/8) * 2^8 / 2
        assert_eq!(ue4m3_to_f32(0x38), 0.5); // 1.0 / 2
        assert_eq!(ue4m3_to_f32(0x01), 2f32.powi(-10));
        assert_eq!(ue4m3_to_f32(0xff), 240.0);
        assert_eq!(ue4m3_to_f32(0x80), 0.0);
    }

    #[test]
    fn mxfp4_by_hand() {
        // e = 128 -> d = 1.0; low nibble j, high nibble 15 - j.
        let mut b = vec![128u8];
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut y = [0f32; 32];
        decode_mxfp4(&b, &mut y);
        for j in 0..16 {
            assert_eq!(y[j], f32::from(KVALUES_MXFP4[j]));
            assert_eq!(y[j + 16], f32::from(KVALUES_MXFP4[15 - j]));
        }
        b[0] = 126; // d = 0.25: 12 -> 3 (e2m1 max 6 times 2^-1)
        decode_mxfp4(&b, &mut y);
        assert_eq!(y[7], 3.0);
    }

    #[test]
    fn nvfp4_sub_blocks() {
        // Scales 0x38 (0.5), 0x40 (1.0), 0x00 (0), 0x7f (0); all nibbles 7 / 0xf.
        let mut b = vec![0x38, 0x40, 0x00, 0x7f];
        b.extend([0xf7u8; 32]);
        let mut y = [0f32; 64];
        decode_nvfp4(&b, &mut y);
        let want = |s: usize, hi: bool| {
            let d = [0.5, 1.0, 0.0, 0.0][s];
            d * if hi { -12.0 } else { 12.0 }
        };
        for (i, &v) in y.iter().enumerate() {
            let (s, j) = (i / 16, i % 16);
            assert_eq!(v, want(s, j >= 8), "{i}");
        }
        // 0 * -12 keeps its sign, as ggml's product does.
        assert_eq!(y[40].to_bits(), (-0.0f32).to_bits());
    }
}
