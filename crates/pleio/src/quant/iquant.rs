//! The ggml i-quants with lattice grids: IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS,
//! IQ2_S, IQ3_XXS and IQ3_S.
//!
//! Each is a super-block of 256 elements: eight sub-blocks of 32, each four
//! groups of 8 that index a fixed grid ([`grids`]). These are scalar ports of
//! ggml's `dequantize_row_iq*` (ggml-quants.c): every output is computed with
//! the same `f32` operations in the same order (Rust never fuses them into
//! FMAs), so results match ggml bit for bit.

pub(super) mod grids;

use super::float::f16_to_f32;
use grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KMASK_IQ2XS,
    KSIGNS_IQ2XS,
};

/// Elements per super-block (ggml `QK_K`).
const QK_K: usize = 256;

/// ggml `IQ1S_DELTA` (IQ1_M's `IQ1M_DELTA` is the same value).
const IQ1S_DELTA: f32 = 0.125;

/// Block sizes in bytes (ggml `sizeof(block_iq*)`).
const IQ2_XXS_BYTES: usize = 2 + QK_K / 4;
const IQ2_XS_BYTES: usize = 2 + QK_K / 4 + QK_K / 32;
const IQ2_S_BYTES: usize = 2 + QK_K / 4 + QK_K / 16;
const IQ3_XXS_BYTES: usize = 2 + 3 * QK_K / 8;
const IQ3_S_BYTES: usize = 2 + QK_K / 4 + QK_K / 32 + QK_K / 8 + QK_K / 64;
const IQ1_S_BYTES: usize = 2 + QK_K / 8 + QK_K / 16;
const IQ1_M_BYTES: usize = QK_K / 8 + QK_K / 16 + QK_K / 32;

/// Pairs each whole `B`-byte block of `src` with its 256 outputs in `dst`.
/// The caller guarantees whole blocks and a matching `dst`; any excess on
/// either side is left untouched rather than panicking.
fn blocks<'a, const B: usize>(
    src: &'a [u8],
    dst: &'a mut [f32],
) -> impl Iterator<Item = (&'a [u8], &'a mut [f32])> {
    src.chunks_exact(B).zip(dst.chunks_exact_mut(QK_K))
}

/// The eight sub-blocks of a super-block's outputs, numbered, each split
/// into its four groups of 8.
fn sub_blocks(y: &mut [f32]) -> impl Iterator<Item = (usize, std::slice::ChunksExactMut<'_, f32>)> {
    y.chunks_exact_mut(32)
        .map(|s| s.chunks_exact_mut(8))
        .enumerate()
}

#[inline(always)]
fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

#[inline(always)]
fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// The IQ2/IQ3_XXS sub-block scale `d * (0.5f + s) * k`, in ggml's order.
#[inline(always)]
fn half_step_scale(d: f32, s: u32, k: f32) -> f32 {
    d * (0.5 + s as f32) * k
}

/// The IQ1/IQ3_S sub-block scale `d * (2*s + 1)` (the odd factor is an exact
/// integer, converted once as in C).
#[inline(always)]
fn odd_scale(d: f32, s: u16) -> f32 {
    d * f32::from(2 * s + 1)
}

/// Two 4-element IQ3 grid rows as one group of 8.
#[inline(always)]
fn join(lo: u32, hi: u32) -> [u8; 8] {
    (u64::from(hi) << 32 | u64::from(lo)).to_le_bytes()
}

/// ggml's IQ2/IQ3 inner loop:
/// `y[j] = db * grid[j] * (signs & kmask_iq2xs[j] ? -1.f : 1.f)`.
#[inline(always)]
fn signed_group(y: &mut [f32], db: f32, grid: [u8; 8], signs: u8) {
    for ((y, g), m) in y.iter_mut().zip(grid).zip(KMASK_IQ2XS) {
        let s = if signs & m != 0 { -1.0 } else { 1.0 };
        *y = db * f32::from(g) * s;
    }
}

/// The IQ1 group shift: `-IQ1S_DELTA` when its bit is set.
#[inline(always)]
fn iq1_delta(negative: bool) -> f32 {
    if negative {
        -IQ1S_DELTA
    } else {
        IQ1S_DELTA
    }
}

/// ggml's IQ1 inner loop: `y[j] = dl * (grid[j] + delta)`, grid bytes `i8`.
#[inline(always)]
fn iq1_group(y: &mut [f32], dl: f32, row: u64, delta: f32) {
    for (y, g) in y.iter_mut().zip(row.to_le_bytes()) {
        *y = dl * (f32::from(g as i8) + delta);
    }
}

/// IQ2_XXS: `d: f16`, then per sub-block two `u32`s: four grid indices and
/// (7-bit sign index ×4, 4-bit scale).
pub(super) fn decode_iq2_xxs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<IQ2_XXS_BYTES>(src, dst) {
        let d = f16_to_f32(u16_at(b, 0));
        for (ib, groups) in sub_blocks(y) {
            let q = 2 + 8 * ib;
            let aux = u32_at(b, q + 4);
            let db = half_step_scale(d, aux >> 28, 0.25);
            for (l, y) in groups.enumerate() {
                let grid = IQ2XXS_GRID[usize::from(b[q + l])].to_le_bytes();
                let signs = KSIGNS_IQ2XS[(aux >> (7 * l)) as usize & 127];
                signed_group(y, db, grid, signs);
            }
        }
    }
}

/// IQ2_XS: `d: f16`, 32 `u16`s (9-bit grid index, 7-bit sign index), then
/// one byte of two 4-bit scales per sub-block.
pub(super) fn decode_iq2_xs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<IQ2_XS_BYTES>(src, dst) {
        let d = f16_to_f32(u16_at(b, 0));
        for (ib, groups) in sub_blocks(y) {
            let sc = b[2 + QK_K / 4 + ib];
            let db = [
                half_step_scale(d, u32::from(sc & 0xf), 0.25),
                half_step_scale(d, u32::from(sc >> 4), 0.25),
            ];
            for (l, y) in groups.enumerate() {
                let q = u16_at(b, 2 + 2 * (4 * ib + l));
                let grid = IQ2XS_GRID[usize::from(q & 511)].to_le_bytes();
                let signs = KSIGNS_IQ2XS[usize::from(q >> 9)];
                signed_group(y, db[l / 2], grid, signs);
            }
        }
    }
}

/// IQ2_S: `d: f16`, 32 low grid-index bytes, 32 sign bytes, 8 bytes of the
/// index high bits (2 per group), 8 bytes of two 4-bit scales.
pub(super) fn decode_iq2_s(src: &[u8], dst: &mut [f32]) {
    const SIGNS: usize = 2 + QK_K / 8;
    const QH: usize = 2 + QK_K / 4;
    const SCALES: usize = QH + QK_K / 32;
    for (b, y) in blocks::<IQ2_S_BYTES>(src, dst) {
        let d = f16_to_f32(u16_at(b, 0));
        for (ib, groups) in sub_blocks(y) {
            let sc = b[SCALES + ib];
            let db = [
                half_step_scale(d, u32::from(sc & 0xf), 0.25),
                half_step_scale(d, u32::from(sc >> 4), 0.25),
            ];
            let qh = usize::from(b[QH + ib]);
            for (l, y) in groups.enumerate() {
                let idx = usize::from(b[2 + 4 * ib + l]) | (qh << (8 - 2 * l) & 0x300);
                let grid = IQ2S_GRID[idx].to_le_bytes();
                signed_group(y, db[l / 2], grid, b[SIGNS + 4 * ib + l]);
            }
        }
    }
}

/// IQ3_XXS: `d: f16`, 64 grid-index bytes (4-element rows, two per group),
/// then per sub-block a `u32` of (7-bit sign index ×4, 4-bit scale).
pub(super) fn decode_iq3_xxs(src: &[u8], dst: &mut [f32]) {
    const AUX: usize = 2 + QK_K / 4;
    for (b, y) in blocks::<IQ3_XXS_BYTES>(src, dst) {
        let d = f16_to_f32(u16_at(b, 0));
        for (ib, groups) in sub_blocks(y) {
            let aux = u32_at(b, AUX + 4 * ib);
            let db = half_step_scale(d, aux >> 28, 0.5);
            for (l, y) in groups.enumerate() {
                let q = 2 + 8 * ib + 2 * l;
                let grid = join(
                    IQ3XXS_GRID[usize::from(b[q])],
                    IQ3XXS_GRID[usize::from(b[q + 1])],
                );
                let signs = KSIGNS_IQ2XS[(aux >> (7 * l)) as usize & 127];
                signed_group(y, db, grid, signs);
            }
        }
    }
}

/// IQ3_S: `d: f16`, 64 low grid-index bytes, 8 bytes of index high bits (one
/// per index), 32 sign bytes, 4 bytes of two 4-bit scales.
pub(super) fn decode_iq3_s(src: &[u8], dst: &mut [f32]) {
    const QH: usize = 2 + QK_K / 4;
    const SIGNS: usize = QH + QK_K / 32;
    const SCALES: usize = SIGNS + QK_K / 8;
    for (b, y) in blocks::<IQ3_S_BYTES>(src, dst) {
        let d = f16_to_f32(u16_at(b, 0));
        for (ib, groups) in sub_blocks(y) {
            let sc = (b[SCALES + ib / 2] >> (4 * (ib % 2))) & 0xf;
            let db = odd_scale(d, u16::from(sc));
            let qh = usize::from(b[QH + ib]);
            for (l, y) in groups.enumerate() {
                let q = 2 + 8 * ib + 2 * l;
                let grid = join(
                    IQ3S_GRID[usize::from(b[q]) | (qh << (8 - 2 * l) & 256)],
                    IQ3S_GRID[usize::from(b[q + 1]) | (qh << (7 - 2 * l) & 256)],
                );
                signed_group(y, db, grid, b[SIGNS + 4 * ib + l]);
            }
        }
    }
}

/// IQ1_S: `d: f16`, 32 low grid-index bytes, then per sub-block a `u16` of
/// (3 high index bits ×4, 3-bit scale, delta sign).
pub(super) fn decode_iq1_s(src: &[u8], dst: &mut [f32]) {
    const QH: usize = 2 + QK_K / 8;
    for (b, y) in blocks::<IQ1_S_BYTES>(src, dst) {
        let d = f16_to_f32(u16_at(b, 0));
        for (ib, groups) in sub_blocks(y) {
            let qh = u16_at(b, QH + 2 * ib);
            let dl = odd_scale(d, (qh >> 12) & 7);
            let delta = iq1_delta(qh & 0x8000 != 0);
            for (l, y) in groups.enumerate() {
                let idx = usize::from(b[2 + 4 * ib + l]) | usize::from((qh >> (3 * l)) & 7) << 8;
                iq1_group(y, dl, IQ1S_GRID[idx], delta);
            }
        }
    }
}

/// IQ1_M: 32 low grid-index bytes, 16 bytes of (3 high index bits, delta
/// sign) nibbles, then four `u16`s of 3-bit scales whose top nibbles
/// together hold the f16 super-block scale.
pub(super) fn decode_iq1_m(src: &[u8], dst: &mut [f32]) {
    const QH: usize = QK_K / 8;
    const SCALES: usize = QH + QK_K / 16;
    for (b, y) in blocks::<IQ1_M_BYTES>(src, dst) {
        let sc: [u16; 4] = std::array::from_fn(|k| u16_at(b, SCALES + 2 * k));
        let d = f16_to_f32(
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000),
        );
        for (ib, groups) in sub_blocks(y) {
            let s = sc[ib / 2] >> (6 * (ib % 2));
            let dl = [odd_scale(d, s & 7), odd_scale(d, (s >> 3) & 7)];
            for (l, y) in groups.enumerate() {
                let h = b[QH + 2 * ib + l / 2] >> (4 * (l % 2));
                let idx = usize::from(b[4 * ib + l]) | usize::from(h & 7) << 8;
                iq1_group(y, dl[l / 2], IQ1S_GRID[idx], iq1_delta(h & 8 != 0));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: [u8; 2] = 0x3c00u16.to_le_bytes(); // f16 1.0
    const TWO: [u8; 2] = 0x4000u16.to_le_bytes(); // f16 2.0

    type Decoder = fn(&[u8], &mut [f32]);

    const DECODERS: [(Decoder, usize); 7] = [
        (decode_iq2_xxs, IQ2_XXS_BYTES),
        (decode_iq2_xs, IQ2_XS_BYTES),
        (decode_iq2_s, IQ2_S_BYTES),
        (decode_iq3_xxs, IQ3_XXS_BYTES),
        (decode_iq3_s, IQ3_S_BYTES),
        (decode_iq1_s, IQ1_S_BYTES),
        (decode_iq1_m, IQ1_M_BYTES),
    ];

    fn decode(f: Decoder, blocks: &[u8]) -> Vec<f32> {
        let (_, n) = DECODERS
            .into_iter()
            .find(|&(g, _)| std::ptr::fn_addr_eq(g, f))
            .expect("known decoder");
        assert_eq!(blocks.len() % n, 0);
        let mut out = vec![f32::NAN; blocks.len() / n * QK_K];
        f(blocks, &mut out);
        out
    }

    /// A block of `len` zero bytes with `d` at the front.
    fn block(len: usize, d: [u8; 2]) -> Vec<u8> {
        let mut b = vec![0u8; len];
        b[..2].copy_from_slice(&d);
        b
    }

    fn grid_bytes(row: u64) -> [f32; 8] {
        row.to_le_bytes().map(f32::from)
    }

    #[test]
    fn block_sizes_match_ggml_type_table() {
        use super::super::GgmlType as T;
        for (ty, n) in [
            (T::IQ2_XXS, IQ2_XXS_BYTES),
            (T::IQ2_XS, IQ2_XS_BYTES),
            (T::IQ2_S, IQ2_S_BYTES),
            (T::IQ3_XXS, IQ3_XXS_BYTES),
            (T::IQ3_S, IQ3_S_BYTES),
            (T::IQ1_S, IQ1_S_BYTES),
            (T::IQ1_M, IQ1_M_BYTES),
        ] {
            assert_eq!(ty.block_bytes(), n, "{ty}");
            assert_eq!(ty.block_elems(), QK_K, "{ty}");
        }
    }

    #[test]
    fn grid_entries_match_ggml_common_h() {
        // Spot values read from ggml/src/ggml-common.h.
        assert_eq!(IQ2XXS_GRID[0], 0x0808080808080808);
        assert_eq!(IQ2XXS_GRID[13], 0x0808080819190808);
        assert_eq!(IQ2XXS_GRID[255], 0x2b2b2b1908081908);
        assert_eq!(IQ2XS_GRID[505], 0x2b2b2b1908081908);
        assert_eq!(IQ2XS_GRID[510], 0x2b2b2b2b2b190819);
        assert_eq!(IQ2S_GRID[33], 0x080808082b2b2b2b);
        assert_eq!(IQ2S_GRID[1016], 0x2b2b2b192b08192b);
        assert_eq!(IQ2S_GRID[1023], 0x2b2b2b2b2b2b2b2b);
        assert_eq!(IQ3XXS_GRID[5], 0x04040c3e);
        assert_eq!(IQ3XXS_GRID[128], 0x141c3e04);
        assert_eq!(IQ3XXS_GRID[255], 0x3e341c04);
        assert_eq!(IQ3S_GRID[15], 0x01010905);
        assert_eq!(IQ3S_GRID[509], 0x0f0d0105);
        assert_eq!(IQ1S_GRID[1], 0xffffffffffffff01);
        assert_eq!(IQ1S_GRID[43], 0xffffff0001ff0000);
        assert_eq!(IQ1S_GRID[2047], 0x0101010101010101);
    }

    #[test]
    fn grid_values_are_the_lattice_points() {
        fn bytes_in(rows: impl IntoIterator<Item = u8>, allowed: &[u8]) -> bool {
            rows.into_iter().all(|v| allowed.contains(&v))
        }
        let iq2 = [0x08, 0x19, 0x2b];
        for grid in [&IQ2XXS_GRID[..], &IQ2XS_GRID, &IQ2S_GRID] {
            assert!(bytes_in(grid.iter().flat_map(|r| r.to_le_bytes()), &iq2));
        }
        let iq3xxs = [4, 12, 20, 28, 36, 44, 52, 62];
        assert!(bytes_in(
            IQ3XXS_GRID.iter().flat_map(|r| r.to_le_bytes()),
            &iq3xxs
        ));
        let iq3s = [1, 3, 5, 7, 9, 11, 13, 15];
        assert!(bytes_in(
            IQ3S_GRID.iter().flat_map(|r| r.to_le_bytes()),
            &iq3s
        ));
        assert!(bytes_in(
            IQ1S_GRID.iter().flat_map(|r| r.to_le_bytes()),
            &[0xff, 0, 1]
        ));
        // The larger IQ2 grids extend the smaller ones' first rows.
        assert_eq!(IQ2XS_GRID[..3], IQ2XXS_GRID[..3]);
        assert_eq!(IQ2S_GRID[..3], IQ2XS_GRID[..3]);
    }

    #[test]
    fn sign_tables() {
        for (i, &s) in KSIGNS_IQ2XS.iter().enumerate() {
            assert_eq!(usize::from(s & 127), i);
            assert_eq!(s.count_ones() % 2, 0, "even parity at {i}");
        }
        assert_eq!(KMASK_IQ2XS, [1, 2, 4, 8, 16, 32, 64, 128]);
    }

    #[test]
    fn iq2_xxs_hand_checked() {
        // All zero: grid row 0 (all 8) times 1.0 * 0.5 * 0.25 = 1.0.
        let mut b = block(IQ2_XXS_BYTES, ONE);
        assert!(decode(decode_iq2_xxs, &b).iter().all(|&v| v == 1.0));
        // Sub-block 1: grid rows 1, 0, 0, 0; sign index 1 (ksigns 0x81:
        // elements 0 and 7 negative) for group 0; scale nibble 3.
        b[2 + 8] = 1;
        b[2 + 8 + 4..2 + 16].copy_from_slice(&(1u32 | 3 << 28).to_le_bytes());
        let y = decode(decode_iq2_xxs, &b);
        let db = 3.5 * 0.25; // d = 1: (0.5 + 3) * 0.25
        assert_eq!(y[32], -43.0 * db);
        assert_eq!(y[33..39], [8.0 * db; 6]);
        assert_eq!(y[39], -8.0 * db);
        assert!(y[40..64].iter().all(|&v| v == 8.0 * db));
        assert!(y[..32].iter().chain(&y[64..]).all(|&v| v == 1.0));
    }

    #[test]
    fn iq2_xs_hand_checked() {
        let mut b = block(IQ2_XS_BYTES, TWO);
        assert!(decode(decode_iq2_xs, &b).iter().all(|&v| v == 2.0));
        // Group 6 (sub-block 1, l = 2): index 511, sign index 2 (ksigns 0x82);
        // sub-block 1 scales: low nibble 1 (groups 4, 5), high 5 (groups 6, 7).
        b[2 + 2 * 6..2 + 2 * 7].copy_from_slice(&(511u16 | 2 << 9).to_le_bytes());
        b[2 + 64 + 1] = 0x51;
        let y = decode(decode_iq2_xs, &b);
        let (lo, hi) = (2.0 * 1.5 * 0.25, 2.0 * 5.5 * 0.25);
        assert!(y[32..48].iter().all(|&v| v == 8.0 * lo));
        let mut want = [43.0 * hi; 8];
        want[1] = -want[1];
        want[7] = -want[7];
        assert_eq!(y[48..56], want);
        assert!(y[56..64].iter().all(|&v| v == 8.0 * hi));
    }

    #[test]
    fn iq2_s_hand_checked() {
        let mut b = block(IQ2_S_BYTES, ONE);
        assert!(decode(decode_iq2_s, &b).iter().all(|&v| v == 1.0));
        // Sub-block 2, group 3: low byte 0xf8, high bits 3 -> index 1016;
        // sign byte 0x01; scale nibble (high) 2.
        b[2 + 4 * 2 + 3] = 0xf8;
        b[2 + 64 + 2] = 0b1100_0000;
        b[2 + 32 + 4 * 2 + 3] = 0x01;
        b[2 + 64 + 8 + 2] = 0x20;
        let y = decode(decode_iq2_s, &b);
        let hi = 2.5 * 0.25;
        let mut want = grid_bytes(IQ2S_GRID[1016]).map(|g| g * hi);
        want[0] = -want[0];
        assert_eq!(y[64 + 24..64 + 32], want);
        assert!(y[64 + 16..64 + 24].iter().all(|&v| v == 8.0 * hi));
        assert!(y[64..64 + 16].iter().all(|&v| v == 1.0));
    }

    #[test]
    fn iq3_xxs_hand_checked() {
        // All zero: grid row 0 (all 4) times 1.0 * 0.5 * 0.5 = 1.0.
        let mut b = block(IQ3_XXS_BYTES, ONE);
        assert!(decode(decode_iq3_xxs, &b).iter().all(|&v| v == 1.0));
        // Sub-block 0, group 1: rows 5 and 255; sign index 3 (ksigns 0x03).
        b[2 + 2] = 5;
        b[2 + 3] = 255;
        b[2 + 64..2 + 68].copy_from_slice(&(3u32 << 7 | 1 << 28).to_le_bytes());
        let y = decode(decode_iq3_xxs, &b);
        let db = 1.5 * 0.5;
        // 0x04040c3e then 0x3e341c04, element 0 in the low byte.
        let want = [-62.0, -12.0, 4.0, 4.0, 4.0, 28.0, 52.0, 62.0].map(|g: f32| g * db);
        assert_eq!(y[8..16], want);
        assert!(y[..8].iter().chain(&y[16..32]).all(|&v| v == 4.0 * db));
        assert!(y[32..].iter().all(|&v| v == 1.0));
    }

    #[test]
    fn iq3_s_hand_checked() {
        // All zero: grid row 0 (all 1) times 2.0 * (2*0 + 1) = 2.0.
        let mut b = block(IQ3_S_BYTES, TWO);
        assert!(decode(decode_iq3_s, &b).iter().all(|&v| v == 2.0));
        // Sub-block 3, group 2: indices 0x1fd (509) and 0x10f (271, from the
        // second high bit); sign byte 0x80; scale (sub-block 3: high nibble
        // of scales[1]) 4 -> d * 9.
        let q = 2 + 8 * 3 + 2 * 2;
        b[q] = 0xfd;
        b[q + 1] = 0x0f;
        b[2 + 64 + 3] = 0b0011_0000;
        b[2 + 64 + 8 + 4 * 3 + 2] = 0x80;
        b[2 + 64 + 8 + 32 + 1] = 0x40;
        let y = decode(decode_iq3_s, &b);
        let db = 2.0 * 9.0;
        let mut want = [0f32; 8];
        for (w, g) in want.iter_mut().zip(join(IQ3S_GRID[509], IQ3S_GRID[271])) {
            *w = f32::from(g) * db;
        }
        want[7] = -want[7];
        assert_eq!(&y[96 + 16..96 + 24], &want);
        assert_eq!(&want[..4], &[5.0 * db, 1.0 * db, 13.0 * db, 15.0 * db]);
        assert!(y[96..96 + 16].iter().all(|&v| v == db));
        assert!(y[64..96].iter().all(|&v| v == 2.0));
    }

    #[test]
    fn iq1_s_hand_checked() {
        // All zero: grid row 0 (all -1), delta +0.125, scale 1: -0.875 * 2.
        let mut b = block(IQ1_S_BYTES, TWO);
        assert!(decode(decode_iq1_s, &b).iter().all(|&v| v == -1.75));
        // Sub-block 7: group 3 index 0x7ff (all +1), scale 5 -> 11, delta -.
        b[2 + 4 * 7 + 3] = 0xff;
        b[2 + 32 + 14..].copy_from_slice(&(7u16 << 9 | 5 << 12 | 0x8000).to_le_bytes());
        let y = decode(decode_iq1_s, &b);
        assert!(y[224..248]
            .iter()
            .all(|&v| v == 2.0 * 11.0 * (-1.0 - 0.125)));
        assert!(y[248..].iter().all(|&v| v == 2.0 * 11.0 * (1.0 - 0.125)));
        assert!(y[..224].iter().all(|&v| v == -1.75));
    }

    #[test]
    fn iq1_m_hand_checked() {
        // The f16 scale 1.0 = 0x3c00 is spread over the scales' top nibbles:
        // nibble k of d is the top nibble of scales u16 k.
        let mut b = vec![0u8; IQ1_M_BYTES];
        let d = 0x3c00u16;
        for k in 0..4 {
            let top = (d >> (4 * k)) & 0xf;
            b[48 + 2 * k..50 + 2 * k].copy_from_slice(&(top << 12).to_le_bytes());
        }
        assert!(decode(decode_iq1_m, &b).iter().all(|&v| v == -0.875));
        // Sub-block 1 (scales u16 0 bits 6..12): dl1 = 2*3+1, dl2 = 2*6+1.
        // Group 5 (l = 1): high bits 7 (row 0x700) and negative delta;
        // group 6 (l = 2): row 2047, positive delta.
        let sc0 = u16_at(&b, 48) | 3 << 6 | 6 << 9;
        b[48..50].copy_from_slice(&sc0.to_le_bytes());
        b[32 + 2] = 0xf0;
        b[4 + 2] = 0xff;
        b[32 + 3] = 0x07;
        let y = decode(decode_iq1_m, &b);
        let g700 = IQ1S_GRID[0x700].to_le_bytes().map(|g| f32::from(g as i8));
        let want5 = g700.map(|g| 7.0 * (g - 0.125));
        assert_eq!(y[40..48], want5);
        assert!(y[32..40].iter().all(|&v| v == 7.0 * (-1.0 + 0.125)));
        assert!(y[48..56].iter().all(|&v| v == 13.0 * (1.0 + 0.125)));
        assert!(y[56..64].iter().all(|&v| v == 13.0 * (-1.0 + 0.125)));
        assert!(y[..32].iter().chain(&y[64..]).all(|&v| v == -0.875));
    }

    #[test]
    fn multi_block_rows_decode_block_by_block() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for (f, n) in DECODERS {
            let mut row: Vec<u8> = (0..3 * n)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state >> 24) as u8
                })
                .collect();
            for blk in row.chunks_exact_mut(n) {
                if n == IQ1_M_BYTES {
                    // Top nibble of the scale: sign 0, exponent 0b011xx.
                    blk[n - 1] = (blk[n - 1] & 0x0f) | 0x30;
                } else {
                    blk[..2].copy_from_slice(&ONE);
                }
            }
            let whole = decode(f, &row);
            assert!(whole.iter().all(|v| v.is_finite()));
            for (k, blk) in row.chunks_exact(n).enumerate() {
                assert_eq!(decode(f, blk), whole[k * QK_K..(k + 1) * QK_K]);
            }
        }
    }
}
