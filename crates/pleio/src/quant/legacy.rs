//! The original ggml block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and the
//! non-linear 4-bit IQ4_NL / IQ4_XS, after ggml's `dequantize_row_*`.

use super::float::{each_block, read_f16};

/// `kvalues_iq4nl` from ggml-common.h: the IQ4 non-linear levels.
pub(super) const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Q4_0's levels as a table: nibble `q` means `q - 8`.
pub(super) const LEVELS_Q4_0: [i8; 16] = [-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7];

/// Decodes `qs.len()` bytes of nibble pairs into `2 * qs.len()` floats:
/// the low nibble of `qs[j]` gives `out[j]`, the high one `out[j + n]`, each
/// `table[nibble] * d` (one rounding, as ggml's `x*d` / `d*kvalues[x]`).
#[inline(always)]
pub(super) fn decode_nibbles(qs: &[u8], table: &[i8; 16], d: f32, out: &mut [f32]) {
    let (lo, hi) = out.split_at_mut(qs.len());
    for ((&q, l), h) in qs.iter().zip(lo).zip(hi) {
        *l = f32::from(table[usize::from(q & 0x0f)]) * d;
        *h = f32::from(table[usize::from(q >> 4)]) * d;
    }
}

/// The 32 4-bit codes of a Q4_1 block in output order.
#[inline(always)]
fn unpack_q4(qs: &[u8]) -> [u8; 32] {
    let mut q = [0u8; 32];
    for (j, &b) in qs.iter().take(16).enumerate() {
        q[j] = b & 0x0f;
        q[j + 16] = b >> 4;
    }
    q
}

/// The 32 5-bit codes of a Q5 block in output order: nibbles of `qs`, fifth
/// bit `j` of the little-endian `qh` word for element `j`.
#[inline(always)]
fn unpack_q5(qh: &[u8], qs: &[u8]) -> [u8; 32] {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = unpack_q4(qs);
    for (j, v) in q.iter_mut().enumerate() {
        *v |= (((qh >> j) & 1) << 4) as u8;
    }
    q
}

/// `y = (q - offset) * d`, ggml's `x0*d` with the integer converted first.
#[inline(always)]
fn scale_signed(q: &[u8; 32], offset: i16, d: f32, y: &mut [f32; 32]) {
    for (y, &q) in y.iter_mut().zip(q) {
        *y = f32::from(i16::from(q) - offset) * d;
    }
}

/// `y = q * d + m`: ggml's `x0*d + m` (two roundings, no fused multiply-add).
#[inline(always)]
fn scale_min(q: &[u8; 32], d: f32, m: f32, y: &mut [f32; 32]) {
    for (y, &q) in y.iter_mut().zip(q) {
        *y = f32::from(q) * d + m;
    }
}

/// Q4_0: `{ d: f16, qs[16] }`, `y = (q - 8) * d`.
pub(super) fn decode_q4_0(src: &[u8], dst: &mut [f32]) {
    each_block::<18, 32>(src, dst, |b, y| {
        decode_nibbles(&b[2..], &LEVELS_Q4_0, read_f16(b, 0), y)
    });
}

/// Q4_1: `{ d: f16, m: f16, qs[16] }`, `y = q * d + m`.
pub(super) fn decode_q4_1(src: &[u8], dst: &mut [f32]) {
    each_block::<20, 32>(src, dst, |b, y| {
        scale_min(&unpack_q4(&b[4..]), read_f16(b, 0), read_f16(b, 2), y)
    });
}

/// Q5_0: `{ d: f16, qh[4], qs[16] }`, `y = (q - 16) * d`.
pub(super) fn decode_q5_0(src: &[u8], dst: &mut [f32]) {
    each_block::<22, 32>(src, dst, |b, y| {
        scale_signed(&unpack_q5(&b[2..6], &b[6..]), 16, read_f16(b, 0), y)
    });
}

/// Q5_1: `{ d: f16, m: f16, qh[4], qs[16] }`, `y = q * d + m`.
pub(super) fn decode_q5_1(src: &[u8], dst: &mut [f32]) {
    each_block::<24, 32>(src, dst, |b, y| {
        scale_min(
            &unpack_q5(&b[4..8], &b[8..]),
            read_f16(b, 0),
            read_f16(b, 2),
            y,
        )
    });
}

/// Q8_0: `{ d: f16, qs: [i8; 32] }`, `y = q * d`.
pub(super) fn decode_q8_0(src: &[u8], dst: &mut [f32]) {
    each_block::<34, 32>(src, dst, |b, y| {
        let d = read_f16(b, 0);
        for (y, &q) in y.iter_mut().zip(&b[2..]) {
            *y = f32::from(q as i8) * d;
        }
    });
}

/// IQ4_NL: `{ d: f16, qs[16] }`, `y = d * kvalues_iq4nl[q]`.
pub(super) fn decode_iq4_nl(src: &[u8], dst: &mut [f32]) {
    each_block::<18, 32>(src, dst, |b, y| {
        decode_nibbles(&b[2..], &KVALUES_IQ4NL, read_f16(b, 0), y)
    });
}

/// IQ4_XS: `{ d: f16, scales_h: u16, scales_l[4], qs[128] }`; sub-block `ib`
/// of 32 has the 6-bit scale `ls` and `y = (d * (ls - 32)) * kvalues_iq4nl[q]`.
pub(super) fn decode_iq4_xs(src: &[u8], dst: &mut [f32]) {
    each_block::<136, 256>(src, dst, |b, y| {
        let d = read_f16(b, 0);
        let scales_h = u16::from_le_bytes([b[2], b[3]]);
        let (scales_l, qs) = (&b[4..8], &b[8..]);
        for (ib, (q, y)) in qs.chunks_exact(16).zip(y.chunks_exact_mut(32)).enumerate() {
            let lo = (scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f;
            let hi = ((scales_h >> (2 * ib)) & 3) as u8;
            let ls = i16::from(lo | (hi << 4));
            decode_nibbles(q, &KVALUES_IQ4NL, d * f32::from(ls - 32), y);
        }
    });
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)] // index-based expectations read best
mod tests {
    use super::*;

    fn f16(x: f32) -> [u8; 2] {
        // Only exactly representable test values are used.
        let h = match x {
            1.0 => 0x3c00u16,
            0.5 => 0x3800,
            2.0 => 0x4000,
            -1.0 => 0xbc00,
            0.25 => 0x3400,
            _ => panic!("no half for {x}"),
        };
        h.to_le_bytes()
    }

    fn block(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    #[test]
    fn q4_0_by_hand() {
        // qs[j] = low j, high 15 - j.
        let qs: Vec<u8> = (0..16u8).map(|j| j | ((15 - j) << 4)).collect();
        let mut y = [0f32; 32];
        decode_q4_0(&block(&[&f16(0.5), &qs]), &mut y);
        for j in 0..16 {
            assert_eq!(y[j], (j as f32 - 8.0) * 0.5);
            assert_eq!(y[j + 16], (7.0 - j as f32) * 0.5);
        }
    }

    #[test]
    fn q4_1_by_hand() {
        let qs = [0x2fu8; 16]; // low 15, high 2
        let mut y = [0f32; 32];
        decode_q4_1(&block(&[&f16(0.5), &f16(-1.0), &qs]), &mut y);
        assert!(y[..16].iter().all(|&v| v == 6.5));
        assert!(y[16..].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn q5_0_and_q5_1_high_bits() {
        // Element j's fifth bit is bit j of qh: set bits 0 and 17 only.
        let qh = (1u32 | (1 << 17)).to_le_bytes();
        let qs = [0x00u8; 16];
        let mut y = [0f32; 32];
        decode_q5_0(&block(&[&f16(1.0), &qh, &qs]), &mut y);
        for (i, &v) in y.iter().enumerate() {
            let want = if i == 0 || i == 17 { 0.0 } else { -16.0 };
            assert_eq!(v, want, "element {i}");
        }
        decode_q5_1(&block(&[&f16(2.0), &f16(0.25), &qh, &[0x31u8; 16]]), &mut y);
        assert_eq!(y[0], 17.0 * 2.0 + 0.25);
        assert_eq!(y[1], 2.25);
        assert_eq!(y[16], 6.25);
        assert_eq!(y[17], 19.0 * 2.0 + 0.25);
    }

    #[test]
    fn q8_0_signed() {
        let qs: Vec<u8> = (0..32).map(|i: i32| ((i - 16) * 8) as i8 as u8).collect();
        let mut y = [0f32; 32];
        decode_q8_0(&block(&[&f16(0.25), &qs]), &mut y);
        for (i, &v) in y.iter().enumerate() {
            assert_eq!(v, ((i as i32 - 16) * 8) as f32 * 0.25);
        }
    }

    #[test]
    fn iq4_nl_uses_kvalues() {
        let qs: Vec<u8> = (0..16u8).map(|j| j | (j << 4)).collect();
        let mut y = [0f32; 32];
        decode_iq4_nl(&block(&[&f16(-1.0), &qs]), &mut y);
        for j in 0..16 {
            assert_eq!(y[j], -f32::from(KVALUES_IQ4NL[j]));
            assert_eq!(y[j + 16], y[j]);
        }
    }

    #[test]
    fn iq4_xs_sub_scales() {
        // Sub-block ib gets ls = ib + 30 via scales_l (low 4 bits) and scales_h.
        let ls: Vec<u8> = (0..8u8).map(|ib| ib + 30).collect();
        let mut scales_l = [0u8; 4];
        let mut scales_h = 0u16;
        for (ib, &l) in ls.iter().enumerate() {
            scales_l[ib / 2] |= (l & 0xf) << (4 * (ib % 2));
            scales_h |= u16::from(l >> 4) << (2 * ib);
        }
        let qs = [0x98u8; 128]; // low 8 -> 1, high 9 -> 13
        let mut y = [0f32; 256];
        decode_iq4_xs(
            &block(&[&f16(0.5), &scales_h.to_le_bytes(), &scales_l, &qs]),
            &mut y,
        );
        for ib in 0..8 {
            let dl = 0.5 * (f32::from(ls[ib]) - 32.0);
            assert!(y[32 * ib..32 * ib + 16].iter().all(|&v| v == dl), "{ib}");
            assert!(
                y[32 * ib + 16..32 * ib + 32]
                    .iter()
                    .all(|&v| v == dl * 13.0),
                "{ib}"
            );
        }
    }
}
