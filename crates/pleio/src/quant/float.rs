//! Plain float rows (F32, F16, BF16) and the exact half/bf16 conversions
//! every block format builds on.

/// Converts IEEE binary16 bits to `f32` exactly, as ggml's
/// `ggml_compute_fp16_to_fp32` does.
///
/// Every finite half (subnormals included) and both infinities map to the
/// same value. NaNs keep their sign and payload and come out quiet: ggml's
/// conversion (the F16C instruction, or its portable float formula) quiets
/// signalling NaNs, so this does too.
///
/// Branch-free so that loops over it vectorize: ggml's portable formula
/// (exact float scaling by a power of two; the subnormal path adds and
/// removes 0.5), with NaN inputs replaced by integer operations so that the
/// result never depends on how the platform propagates NaN payloads.
#[inline(always)]
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    let w = u32::from(bits) << 16;
    let sign = w & 0x8000_0000;
    let two_w = w.wrapping_add(w);
    // Normal and infinite: rebias the exponent by scaling with 2^-112.
    let normalized = f32::from_bits((two_w >> 4) + (0xe0 << 23)) * f32::from_bits(0x0780_0000);
    // Zero and subnormal: 0.5 + m * 2^-24 built from bits, minus 0.5.
    let denormalized = f32::from_bits((two_w >> 17) | (126 << 23)) - 0.5;
    let magnitude = if two_w < (1 << 27) {
        denormalized.to_bits()
    } else {
        normalized.to_bits()
    };
    let nan = 0x7fc0_0000 | ((w >> 3) & 0x007f_e000);
    let is_nan = (w & 0x7fff_0000) > 0x7c00_0000;
    f32::from_bits(sign | if is_nan { nan } else { magnitude })
}

/// Converts bfloat16 bits to `f32` (exact: the top half of an f32).
#[inline(always)]
pub(crate) fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Reads the little-endian half at `b[i..i + 2]` as `f32`.
#[inline(always)]
pub(crate) fn read_f16(b: &[u8], i: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

/// Runs `f` on each whole `BB`-byte block of `src` and its `BE` outputs.
///
/// The array views let the compiler drop bounds checks inside `f`; the
/// callers' length contract makes every chunk whole.
#[inline(always)]
pub(crate) fn each_block<const BB: usize, const BE: usize>(
    src: &[u8],
    dst: &mut [f32],
    mut f: impl FnMut(&[u8; BB], &mut [f32; BE]),
) {
    for (b, y) in src.chunks_exact(BB).zip(dst.chunks_exact_mut(BE)) {
        if let (Ok(b), Ok(y)) = (b.try_into(), y.try_into()) {
            f(b, y);
        }
    }
}

/// Decodes little-endian 16-bit words of `src` into `dst` with `conv`.
#[inline(always)]
fn decode_u16(src: &[u8], dst: &mut [f32], conv: impl Fn(u16) -> f32) {
    for (y, x) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *y = conv(u16::from_le_bytes([x[0], x[1]]));
    }
}

pub(super) fn decode_f32(src: &[u8], dst: &mut [f32]) {
    for (y, x) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *y = f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
    }
}

pub(super) fn decode_f16(src: &[u8], dst: &mut [f32]) {
    decode_u16(src, dst, f16_to_f32);
}

pub(super) fn decode_bf16(src: &[u8], dst: &mut [f32]) {
    decode_u16(src, dst, bf16_to_f32);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A branchy integer-only conversion: an independent oracle.
    fn by_cases(h: u16) -> u32 {
        let sign = u32::from(h & 0x8000) << 16;
        let exp = u32::from((h >> 10) & 0x1f);
        let man = u32::from(h & 0x03ff);
        sign | match exp {
            0 if man == 0 => 0,
            0 => {
                // m * 2^-24: its top set bit p becomes the implicit one.
                let p = 31 - man.leading_zeros();
                ((p + 103) << 23) | ((man << (23 - p)) & 0x007f_ffff)
            }
            0x1f if man == 0 => 0x7f80_0000,
            0x1f => 0x7fc0_0000 | (man << 13),
            _ => ((exp + 112) << 23) | (man << 13),
        }
    }

    /// Value from the definition: (-1)^s * 2^(e-15) * (1 + m/1024), in f64.
    fn by_definition(h: u16) -> f64 {
        let s = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
        let e = i32::from((h >> 10) & 0x1f);
        let m = f64::from(h & 0x3ff);
        match e {
            0 => s * m * 2f64.powi(-24),
            31 if m == 0.0 => s * f64::INFINITY,
            31 => f64::NAN,
            _ => s * (1.0 + m / 1024.0) * 2f64.powi(e - 15),
        }
    }

    #[test]
    fn f16_all_65536_match_two_oracles() {
        for h in 0..=u16::MAX {
            let got = f16_to_f32(h);
            assert_eq!(got.to_bits(), by_cases(h), "{h:#06x}");
            let def = by_definition(h);
            if def.is_nan() {
                assert!(got.is_nan(), "{h:#06x}");
                // sign and payload kept, quiet bit set
                let want =
                    (u32::from(h & 0x8000) << 16) | 0x7fc0_0000 | (u32::from(h & 0x3ff) << 13);
                assert_eq!(got.to_bits(), want, "{h:#06x}");
            } else {
                assert_eq!(f64::from(got), def, "{h:#06x}");
                assert_eq!(got.to_bits() >> 31, u32::from(h >> 15), "sign of {h:#06x}");
            }
        }
    }

    #[test]
    fn f16_known_values() {
        // Values as numpy's float16 -> float32 gives them.
        let cases: [(u16, u32); 10] = [
            (0x0000, 0x0000_0000),
            (0x8000, 0x8000_0000),
            (0x0001, 0x3380_0000), // smallest subnormal 2^-24
            (0x03ff, 0x387f_c000), // largest subnormal
            (0x0400, 0x3880_0000), // smallest normal 2^-14
            (0x3c00, 0x3f80_0000), // 1.0
            (0xc000, 0xc000_0000), // -2.0
            (0x7bff, 0x477f_e000), // 65504
            (0x7c00, 0x7f80_0000), // inf
            (0x7e00, 0x7fc0_0000), // qNaN
        ];
        for (h, f) in cases {
            assert_eq!(f16_to_f32(h).to_bits(), f, "{h:#06x}");
        }
    }

    #[test]
    fn rows_decode_little_endian() {
        let mut out = [0f32; 3];
        decode_f16(&[0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00], &mut out);
        assert_eq!(out, [1.0, -2.0, 2f32.powi(-24)]);
        decode_bf16(&[0x80, 0x3f, 0x49, 0x40, 0x80, 0xff], &mut out);
        assert_eq!(out[0], 1.0);
        assert_eq!(out[1].to_bits(), 0x4049_0000);
        assert_eq!(out[2], f32::NEG_INFINITY);
        let mut one = [0f32; 2];
        let mut src = 1.5f32.to_le_bytes().to_vec();
        src.extend_from_slice(&(-0.0f32).to_le_bytes());
        decode_f32(&src, &mut one);
        assert_eq!(one[0], 1.5);
        assert_eq!(one[1].to_bits(), 0x8000_0000);
    }
}
