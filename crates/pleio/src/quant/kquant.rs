//! K-quants (Q2_K .. Q6_K): 256-element super-blocks with quantized
//! sub-block scales, after ggml's `dequantize_row_q*_K`.
//!
//! Each follows ggml's operation order: the sub-block scale and min are
//! formed first (`dl = d * sc`, `ml = dmin * m`), then `y = dl * q - ml`
//! with two roundings (never a fused multiply-add).

use super::float::{each_block, read_f16};

/// The eight 6-bit (scale, min) pairs packed in 12 bytes by Q4_K and Q5_K
/// (ggml's `get_scale_min_k4` for `j = 0..8`).
#[inline(always)]
pub(super) fn scale_min_k4(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
    for j in 0..4 {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 6) << 4);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
    (sc, mn)
}

/// Q2_K: `{ scales[16], qs[64], d: f16, dmin: f16 }`. Sub-block `s` of 16
/// has `scales[s]` = scale (low nibble) and min (high nibble); its 2-bit
/// codes are at shift `2 * (s / 2 % 4)` of `qs[32 * (s / 8) + 16 * (s % 2) ..]`.
pub(super) fn decode_q2_k(src: &[u8], dst: &mut [f32]) {
    each_block::<84, 256>(src, dst, |b, y| {
        let (scales, qs) = (&b[..16], &b[16..80]);
        let (d, min) = (read_f16(b, 80), read_f16(b, 82));
        for (s, (&sc, y)) in scales.iter().zip(y.chunks_exact_mut(16)).enumerate() {
            let dl = d * f32::from(sc & 0x0f);
            let ml = min * f32::from(sc >> 4);
            let q = &qs[32 * (s / 8) + 16 * (s % 2)..][..16];
            let shift = 2 * (s / 2 % 4);
            for (y, &q) in y.iter_mut().zip(q) {
                *y = dl * f32::from((q >> shift) & 3) - ml;
            }
        }
    });
}

/// Q3_K: `{ hmask[32], qs[64], scales[12], d: f16 }`. Sixteen 6-bit signed
/// scales (`- 32`); code = 2 low bits from `qs`, minus 4 where the `hmask`
/// bit is clear; `y = (d * scale) * code`.
pub(super) fn decode_q3_k(src: &[u8], dst: &mut [f32]) {
    each_block::<110, 256>(src, dst, |b, y| {
        let (hmask, qs, sc) = (&b[..32], &b[32..96], &b[96..108]);
        let d = read_f16(b, 108);
        for (s, y) in y.chunks_exact_mut(16).enumerate() {
            // Scale s: low nibble from sc[s % 8] (high half for s >= 8),
            // top two bits from sc[8 + s % 4] at shift 2 * (s / 4).
            let lo = (sc[s % 8] >> (4 * (s / 8))) & 0x0f;
            let hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
            let dl = d * f32::from(i16::from(lo | (hi << 4)) - 32);
            let (half, group) = (s / 8, s / 2 % 4);
            let off = 16 * (s % 2);
            let q = &qs[32 * half + off..][..16];
            let h = &hmask[off..][..16];
            let m = 1u8 << (4 * half + group);
            for ((y, &q), &h) in y.iter_mut().zip(q).zip(h) {
                let code = ((q >> (2 * group)) & 3) as i8 - if h & m != 0 { 0 } else { 4 };
                *y = dl * f32::from(code);
            }
        }
    });
}

/// Q4_K: `{ d: f16, dmin: f16, scales[12], qs[128] }`. Eight sub-blocks of
/// 32; pair `p` uses the low then high nibbles of `qs[32 * p..][..32]`.
pub(super) fn decode_q4_k(src: &[u8], dst: &mut [f32]) {
    each_block::<144, 256>(src, dst, |b, y| {
        let (d, min) = (read_f16(b, 0), read_f16(b, 2));
        let (sc, mn) = scale_min_k4(&b[4..16]);
        for (p, (q, y)) in b[16..]
            .chunks_exact(32)
            .zip(y.chunks_exact_mut(64))
            .enumerate()
        {
            let (lo, hi) = y.split_at_mut(32);
            for (k, y) in [(0, lo), (1, hi)] {
                let dl = d * f32::from(sc[2 * p + k]);
                let ml = min * f32::from(mn[2 * p + k]);
                for (y, &q) in y.iter_mut().zip(q) {
                    *y = dl * f32::from((q >> (4 * k)) & 0x0f) - ml;
                }
            }
        }
    });
}

/// Q5_K: `{ d: f16, dmin: f16, scales[12], qh[32], qs[128] }`. As Q4_K with
/// a fifth bit: bit `s` of `qh[l]` for element `l` of sub-block `s`.
pub(super) fn decode_q5_k(src: &[u8], dst: &mut [f32]) {
    each_block::<176, 256>(src, dst, |b, y| {
        let (d, min) = (read_f16(b, 0), read_f16(b, 2));
        let (sc, mn) = scale_min_k4(&b[4..16]);
        let qh = &b[16..48];
        for (p, (q, y)) in b[48..]
            .chunks_exact(32)
            .zip(y.chunks_exact_mut(64))
            .enumerate()
        {
            let (lo, hi) = y.split_at_mut(32);
            for (k, y) in [(0, lo), (1, hi)] {
                let s = 2 * p + k;
                let dl = d * f32::from(sc[s]);
                let ml = min * f32::from(mn[s]);
                for ((y, &q), &h) in y.iter_mut().zip(q).zip(qh) {
                    let code = ((q >> (4 * k)) & 0x0f) + (((h >> s) & 1) << 4);
                    *y = dl * f32::from(code) - ml;
                }
            }
        }
    });
}

/// Q6_K: `{ ql[128], qh[64], scales: [i8; 16], d: f16 }`. Code = 4 low bits
/// from `ql`, 2 high bits from `qh`, minus 32; `y = (d * scale) * code`.
pub(super) fn decode_q6_k(src: &[u8], dst: &mut [f32]) {
    each_block::<210, 256>(src, dst, |b, y| {
        let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
        let d = read_f16(b, 208);
        for (half, y) in y.chunks_exact_mut(128).enumerate() {
            let (ql, qh) = (&ql[64 * half..][..64], &qh[32 * half..][..32]);
            // Quarter k of this half: low nibbles of ql[0..32] (k = 0),
            // of ql[32..64] (k = 1), then their high nibbles (k = 2, 3);
            // high bits at shift 2k of qh.
            for (k, y) in y.chunks_exact_mut(32).enumerate() {
                let low = &ql[32 * (k % 2)..][..32];
                for (l, (y, (&lq, &h))) in y.iter_mut().zip(low.iter().zip(qh)).enumerate() {
                    let sc = scales[8 * half + 2 * k + l / 16] as i8;
                    let code =
                        (((lq >> (4 * (k / 2))) & 0x0f) | (((h >> (2 * k)) & 3) << 4)) as i8 - 32;
                    *y = d * f32::from(sc) * f32::from(code);
                }
            }
        }
    });
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)] // index-based expectations read best
mod tests {
    use super::*;

    const ONE: [u8; 2] = 0x3c00u16.to_le_bytes();
    const HALF: [u8; 2] = 0x3800u16.to_le_bytes();

    #[test]
    fn scale_min_k4_matches_ggml_bit_layout() {
        // j < 4: low 6 bits of s[j] / s[j+4]; j >= 4: nibbles of s[j+4]
        // plus the top two bits of s[j-4] / s[j].
        let s: [u8; 12] = [
            0xc1, 0x42, 0x83, 0x04, 0x45, 0x86, 0xc7, 0x08, 0x9a, 0xbc, 0xde, 0xf0,
        ];
        let (sc, mn) = scale_min_k4(&s);
        assert_eq!(sc, [1, 2, 3, 4, 0x3a, 0x1c, 0x2e, 0x00]);
        assert_eq!(mn, [5, 6, 7, 8, 0x19, 0x2b, 0x3d, 0x0f]);
    }

    #[test]
    fn q2_k_by_hand() {
        // Sub-block s: scale s % 16, min 1; all codes 3 in sub-blocks whose
        // shift picks bits 6..8 (s / 2 % 4 == 3), else 1.
        let scales: Vec<u8> = (0..16u8).map(|s| s | 0x10).collect();
        let qs = [0b1101_0101u8; 64];
        let mut y = [0f32; 256];
        decode_q2_k(&[&scales[..], &qs, &ONE, &HALF].concat(), &mut y);
        for s in 0..16 {
            let code = if s / 2 % 4 == 3 { 3.0 } else { 1.0 };
            let want = s as f32 * code - 0.5;
            assert!(y[16 * s..16 * s + 16].iter().all(|&v| v == want), "{s}");
        }
    }

    #[test]
    fn q3_k_by_hand() {
        // All scales 33 (-> 1): low nibble 1, high bits 2. Codes 2 everywhere;
        // hmask bit set only in byte 0 bit 0 -> element 0 keeps 2, others 2-4.
        let mut sc = [0x11u8; 12];
        sc[8..].fill(0b1010_1010);
        let mut hmask = [0u8; 32];
        hmask[0] = 1;
        let qs = [0xaau8; 64];
        let mut y = [0f32; 256];
        decode_q3_k(&[&hmask[..], &qs, &sc, &HALF].concat(), &mut y);
        assert_eq!(y[0], 1.0);
        assert!(y[1..].iter().all(|&v| v == -1.0));
    }

    #[test]
    fn q4_k_and_q5_k_by_hand() {
        // scales: sc = [1,2,3,4, ...], mins = 0 except j=4..8 from nibbles.
        let mut s = [0u8; 12];
        s[..4].copy_from_slice(&[1, 2, 3, 4]);
        s[8..].copy_from_slice(&[0x15, 0x26, 0x37, 0x48]); // sc 5..8, min 1..4
        let qs = [0x73u8; 128]; // low 3, high 7
        let mut y = [0f32; 256];
        decode_q4_k(&[&ONE[..], &HALF, &s, &qs].concat(), &mut y);
        let mins = [0.0, 0.0, 0.0, 0.0, 0.5, 1.0, 1.5, 2.0];
        for sb in 0..8 {
            let code = if sb % 2 == 0 { 3.0 } else { 7.0 };
            let want = (sb + 1) as f32 * code - mins[sb];
            assert!(y[32 * sb..32 * sb + 32].iter().all(|&v| v == want), "{sb}");
        }
        // Q5_K: qh bit s of byte l set for odd s only.
        let qh = [0xaau8; 32];
        decode_q5_k(&[&ONE[..], &HALF, &s, &qh, &qs].concat(), &mut y);
        for sb in 0..8 {
            let code = if sb % 2 == 0 { 3.0 } else { 23.0 };
            let want = (sb + 1) as f32 * code - mins[sb];
            assert!(y[32 * sb..32 * sb + 32].iter().all(|&v| v == want), "{sb}");
        }
    }

    #[test]
    fn q6_k_by_hand() {
        // ql low nibble 1, high 2; qh all bits 0b01 per pair -> +16;
        // scales[i] = i - 8.
        let ql = [0x21u8; 128];
        let qh = [0x55u8; 64];
        let scales: Vec<u8> = (0..16i8).map(|i| (i - 8) as u8).collect();
        let mut y = [0f32; 256];
        decode_q6_k(&[&ql[..], &qh, &scales, &HALF].concat(), &mut y);
        for (i, &v) in y.iter().enumerate() {
            // Element i = 128*half + 32*k + l uses scale 8*half + 2*k + l/16.
            let (half, k, l) = (i / 128, i % 128 / 32, i % 32);
            let sc = (8 * half + 2 * k + l / 16) as f32 - 8.0;
            let code = if k < 2 { 17.0 - 32.0 } else { 18.0 - 32.0 };
            assert_eq!(v, 0.5 * sc * code, "{i}");
        }
    }
}
