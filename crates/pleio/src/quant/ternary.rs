//! Ternary formats TQ1_0 and TQ2_0 (values -1, 0, 1 times a scale), after
//! ggml's `dequantize_row_tq1_0/tq2_0`.

use super::float::{each_block, read_f16};

/// `y = (code - 1) * d`, as ggml's `(float)(xi - 1) * d` (so a zero keeps
/// the sign of `d`).
#[inline(always)]
fn ternary(code: u8, d: f32) -> f32 {
    f32::from(i16::from(code) - 1) * d
}

/// The base-3 digit `n` (most significant first) of a TQ1_0 byte, which
/// stores five trits as a fixed-point fraction: ggml multiplies by 3^n
/// (wrapping in a byte) and takes the top of `q * 3`.
#[inline(always)]
fn trit(byte: u8, pow3: u8) -> u8 {
    let q = byte.wrapping_mul(pow3);
    ((u16::from(q) * 3) >> 8) as u8
}

const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// TQ1_0: `{ qs[48], qh[4], d: f16 }`. `qs[0..32]` hold trits 0..160 (digit
/// `n` of byte `m` is element `32n + m`), `qs[32..48]` trits 160..240 (in
/// runs of 16), and `qh` the last 16 (digit `n` of byte `j` is `240 + 4n + j`).
pub(super) fn decode_tq1_0(src: &[u8], dst: &mut [f32]) {
    each_block::<54, 256>(src, dst, |b, y| {
        let d = read_f16(b, 52);
        let (y0, rest) = y.split_at_mut(160);
        let (y1, y2) = rest.split_at_mut(80);
        let groups: [(&[u8], &mut [f32], usize); 3] =
            [(&b[..32], y0, 5), (&b[32..48], y1, 5), (&b[48..52], y2, 4)];
        for (bytes, out, digits) in groups {
            for (&p, out) in POW3[..digits].iter().zip(out.chunks_exact_mut(bytes.len())) {
                for (y, &q) in out.iter_mut().zip(bytes) {
                    *y = ternary(trit(q, p), d);
                }
            }
        }
    });
}

/// TQ2_0: `{ qs[64], d: f16 }`; 2-bit codes, element `128h + 32l + m` at
/// shift `2l` of `qs[32h + m]`, `y = (code - 1) * d`.
pub(super) fn decode_tq2_0(src: &[u8], dst: &mut [f32]) {
    each_block::<66, 256>(src, dst, |b, y| {
        let d = read_f16(b, 64);
        for (q, y) in b[..64].chunks_exact(32).zip(y.chunks_exact_mut(128)) {
            for (l, y) in y.chunks_exact_mut(32).enumerate() {
                for (y, &q) in y.iter_mut().zip(q) {
                    *y = ternary((q >> (2 * l)) & 3, d);
                }
            }
        }
    });
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)] // index-based expectations read best
mod tests {
    use super::*;

    const TWO: [u8; 2] = 0x4000u16.to_le_bytes();

    /// Packs five trits (0..=2, most significant first) as ggml's quantizer
    /// does: the base-3 number as a fraction of 243, rounded up to a byte.
    fn pack(trits: &[u8]) -> u8 {
        let mut v = 0u16;
        for &t in trits {
            v = v * 3 + u16::from(t);
        }
        for _ in trits.len()..5 {
            v *= 3;
        }
        (v * 256).div_ceil(243) as u8
    }

    #[test]
    fn trit_extraction_round_trips_every_byte_code() {
        for v in 0..243u16 {
            let trits: Vec<u8> = (0..5)
                .rev()
                .map(|k| ((v / 3u16.pow(k)) % 3) as u8)
                .collect();
            let byte = pack(&trits);
            let got: Vec<u8> = POW3.iter().map(|&p| trit(byte, p)).collect();
            assert_eq!(got, trits, "{v}");
        }
    }

    #[test]
    fn tq1_0_layout() {
        // Element e gets trit (e % 3); build the bytes for that pattern.
        let want = |e: usize| (e % 3) as u8;
        let mut b = vec![0u8; 54];
        for m in 0..32 {
            b[m] = pack(&(0..5).map(|n| want(32 * n + m)).collect::<Vec<_>>());
        }
        for m in 0..16 {
            b[32 + m] = pack(&(0..5).map(|n| want(160 + 16 * n + m)).collect::<Vec<_>>());
        }
        for j in 0..4 {
            b[48 + j] = pack(&(0..4).map(|n| want(240 + 4 * n + j)).collect::<Vec<_>>());
        }
        b[52..].copy_from_slice(&TWO);
        let mut y = [0f32; 256];
        decode_tq1_0(&b, &mut y);
        for (e, &v) in y.iter().enumerate() {
            assert_eq!(v, (f32::from(want(e)) - 1.0) * 2.0, "{e}");
        }
    }

    #[test]
    fn tq2_0_layout() {
        // qs[i] = 0b11_10_01_00: shift 2l gives code l.
        let mut b = vec![0b1110_0100u8; 64];
        b.extend_from_slice(&(0xc000u16).to_le_bytes()); // d = -2
        let mut y = [0f32; 256];
        decode_tq2_0(&b, &mut y);
        for (e, &v) in y.iter().enumerate() {
            let code = (e % 128 / 32) as f32;
            assert_eq!(v.to_bits(), ((code - 1.0) * -2.0).to_bits(), "{e}");
        }
        assert_eq!(
            y[32].to_bits(),
            (-0.0f32).to_bits(),
            "0 * -2 is -0.0 as in ggml"
        );
    }
}
