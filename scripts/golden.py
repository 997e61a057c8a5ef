#!/usr/bin/env python3
"""Golden fixtures and the live cross-check data for pleio's row decoders.

Reference: gguf-py (PyPI `gguf==0.19.0`) `gguf.quants.dequantize`, with numpy.

For each of the 26 types gguf-py can dequantize, this makes random VALID
blocks, decodes them with gguf-py and writes, into one directory:

    <TYPE>.blocks   raw blocks, n_random + n_edge of them
    <TYPE>.f32      gguf-py's output, little-endian f32, block after block
    manifest.txt    one line per type: TYPE seed n_random n_edge

The first n_random blocks are exactly what pleio's
`pleio_lab::random::fill_random_blocks(ty, &mut Rng::new(seed), ..)` makes
(the Rust test checks this too); the n_edge blocks after them put special
values (zero, -0, subnormals, largest finite, ...) in the scale fields.

Modes:
    golden.py                         regenerate the committed goldens in
                                      crates/pleio/tests/golden (fixed seeds)
    golden.py --live DIR [--blocks N] [--seed S]
                                      N (default 10000) fresh random blocks
                                      per type, seeded from S (default: from
                                      os.urandom, printed), for the Rust test
                                      `crosscheck_live` (PLEIO_XCHECK_DIR=DIR)

The random block rule (kept identical to crates/pleio-lab/src/random.rs):

1. The bytes are consecutive SplitMix64 outputs, little-endian; a tail shorter
   than 8 bytes takes the low bytes of one more output.
2. Scale fields are rewritten from their own random bits:
   - f16 scale: sign and mantissa kept, exponent e -> 5 + (e * 12 >> 5), so
     |x| is in [2^-10, 2^2);
   - E8M0 byte b -> 100 + (b * 41 >> 8)  (100..=140);
   - UE4M3 byte b -> b * 127 >> 8        (0..=126: never 0x7F, never bit 7);
   - IQ1_M: its f16 scale (top nibble of each of the 4 u16 `scales` words)
     is gathered, mapped as an f16 scale and scattered back;
   - F32/F16/BF16 elements: an all-ones exponent loses its lowest bit.

Patched fields per type (byte offsets in ggml-common.h's block structs):

    Q4_0 {d@0, qs[16]}  Q5_0 {d@0, qh[4], qs[16]}  Q8_0 {d@0, qs[32]}
    IQ4_NL {d@0, qs[16]}  IQ4_XS {d@0, scales_h, scales_l[4], qs[128]}
    IQ2_XXS {d@0, qs u16[32]}  IQ2_XS {d@0, qs u16[32], scales[8]}
    IQ2_S {d@0, qs[64], qh[8], scales[8]}  IQ3_XXS {d@0, qs[96]}
    IQ3_S {d@0, qs[64], qh[8], signs[32], scales[4]}  IQ1_S {d@0, qs[32], qh u16[8]}
    Q4_1 {d@0, m@2, qs[16]}  Q5_1 {d@0, m@2, qh[4], qs[16]}
    Q4_K {d@0, dmin@2, scales[12], qs[128]}  Q5_K {d@0, dmin@2, scales[12], qh[32], qs[128]}
    Q2_K {scales[16], qs[64], d@80, dmin@82}
    Q3_K {hmask[32], qs[64], scales[12], d@108}
    Q6_K {ql[128], qh[64], scales[16], d@208}
    TQ1_0 {qs[48], qh[4], d@52}  TQ2_0 {qs[64], d@64}
    IQ1_M {qs[32], qh[16], scales u16[4]@48: f16 in the top nibbles}
    MXFP4 {e@0 (E8M0), qs[16]}  NVFP4 {d[4]@0 (UE4M3), qs[32]}
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

try:
    import gguf
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize
except ImportError:  # pragma: no cover - a clear message beats a traceback
    sys.exit("golden.py needs gguf==0.19.0 and numpy: pip install gguf==0.19.0 numpy")

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "crates" / "pleio" / "tests" / "golden"

# ("f16", off) | ("e8m0", off) | ("ue4m3x4", off) | ("spread_f16", off)
F16_D = [("f16", 0)]
F16_DM = [("f16", 0), ("f16", 2)]
FIELDS: dict[str, list[tuple[str, int]]] = {
    "Q4_0": F16_D, "Q5_0": F16_D, "Q8_0": F16_D, "IQ4_NL": F16_D, "IQ4_XS": F16_D,
    "IQ2_XXS": F16_D, "IQ2_XS": F16_D, "IQ2_S": F16_D, "IQ3_XXS": F16_D,
    "IQ3_S": F16_D, "IQ1_S": F16_D,
    "Q4_1": F16_DM, "Q5_1": F16_DM, "Q4_K": F16_DM, "Q5_K": F16_DM,
    "Q2_K": [("f16", 80), ("f16", 82)],
    "Q3_K": [("f16", 108)],
    "Q6_K": [("f16", 208)],
    "TQ1_0": [("f16", 52)],
    "TQ2_0": [("f16", 64)],
    "IQ1_M": [("spread_f16", 48)],
    "MXFP4": [("e8m0", 0)],
    "NVFP4": [("ue4m3x4", 0)],
}
# element bytes, exponent shift, exponent mask
FLOATS = {"F32": (4, 23, 0xFF), "F16": (2, 10, 0x1F), "BF16": (2, 7, 0xFF)}
TYPES = ["F32", "F16", "BF16"] + list(FIELDS)
assert len(TYPES) == 26

# Special values put in the scale fields of the edge blocks.
EDGE_F16 = [0x0000, 0x8000, 0x0001, 0x83FF, 0x0400, 0x3C00, 0x7BFF, 0xFBFF]
EDGE_E8M0 = [0, 1, 2, 127, 128, 253, 254, 255]
EDGE_UE4M3 = [0x00, 0x01, 0x07, 0x08, 0x7F, 0x80, 0xFF, 0xFE, 0x78, 0x77, 0x3F, 0x40,
              0x7E, 0x81, 0x87, 0x39]  # four blocks of four sub-block scales
EDGE_FLOAT = {
    "F32": [0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x00800000, 0x3F800000,
            0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000],
    "F16": [0x0000, 0x8000, 0x0001, 0x83FF, 0x0400, 0x3C00, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00],
    "BF16": [0x0000, 0x8000, 0x0001, 0x807F, 0x0080, 0x3F80, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80],
}

GAMMA = np.uint64(0x9E3779B97F4A7C15)
M64 = (1 << 64) - 1


def splitmix64(seed: int, count: int) -> np.ndarray:
    """The first `count` outputs of SplitMix64 seeded with `seed`."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed & M64) + np.arange(1, count + 1, dtype=np.uint64) * GAMMA
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def random_bytes(seed: int, n: int) -> np.ndarray:
    return splitmix64(seed, (n + 7) // 8).astype("<u8").view(np.uint8)[:n].copy()


def sane_f16(h: np.ndarray) -> np.ndarray:
    h = h.astype(np.uint16)
    e = ((h >> 10) & 0x1F).astype(np.uint32)
    return (h & np.uint16(0x83FF)) | ((5 + ((e * 12) >> 5)) << 10).astype(np.uint16)


def get_u16(b: np.ndarray, at: int) -> np.ndarray:
    return b[:, at].astype(np.uint16) | (b[:, at + 1].astype(np.uint16) << 8)


def put_u16(b: np.ndarray, at: int, v: np.ndarray) -> None:
    b[:, at] = (v & 0xFF).astype(np.uint8)
    b[:, at + 1] = (v >> 8).astype(np.uint8)


def get_spread_f16(b: np.ndarray, at: int) -> np.ndarray:
    h = np.zeros(b.shape[0], dtype=np.uint16)
    for k in range(4):
        h |= (b[:, at + 2 * k + 1] >> 4).astype(np.uint16) << (4 * k)
    return h


def put_spread_f16(b: np.ndarray, at: int, h: np.ndarray) -> None:
    for k in range(4):
        nib = ((h >> (4 * k)) & 0xF).astype(np.uint8)
        b[:, at + 2 * k + 1] = (b[:, at + 2 * k + 1] & 0x0F) | (nib << 4)


def random_blocks(name: str, seed: int, n: int) -> np.ndarray:
    """n random valid blocks of `name`, shape (n, block_bytes)."""
    qtype = GGMLQuantizationType[name]
    _, bb = GGML_QUANT_SIZES[qtype]
    b = random_bytes(seed, n * bb).reshape(n, bb)
    if name in FLOATS:
        width, shift, mask = FLOATS[name]
        dt = np.dtype("<u4") if width == 4 else np.dtype("<u2")
        x = b.reshape(-1).view(dt).astype(np.uint32)
        ones, low = np.uint32(mask << shift), np.uint32(1 << shift)
        x = np.where((x & ones) == ones, x ^ low, x)
        return x.astype(dt).view(np.uint8).reshape(n, bb)
    for kind, at in FIELDS[name]:
        if kind == "f16":
            put_u16(b, at, sane_f16(get_u16(b, at)))
        elif kind == "e8m0":
            b[:, at] = (100 + ((b[:, at].astype(np.uint32) * 41) >> 8)).astype(np.uint8)
        elif kind == "ue4m3x4":
            s = b[:, at:at + 4].astype(np.uint32)
            b[:, at:at + 4] = ((s * 127) >> 8).astype(np.uint8)
        elif kind == "spread_f16":
            put_spread_f16(b, at, sane_f16(get_spread_f16(b, at)))
        else:
            raise AssertionError(kind)
    return b


def edge_blocks(name: str, seed: int) -> np.ndarray:
    """Valid random blocks whose scale fields hold special values."""
    if name in FLOATS:
        width = FLOATS[name][0]
        dt = np.dtype("<u4") if width == 4 else np.dtype("<u2")
        return np.array(EDGE_FLOAT[name], dtype=dt).view(np.uint8).reshape(-1, width)
    fields = FIELDS[name]
    kind = fields[0][0]
    if kind == "e8m0":
        values = EDGE_E8M0
    elif kind == "ue4m3x4":
        values = EDGE_UE4M3[::4]  # one block per group of four
    else:
        values = EDGE_F16
    b = random_blocks(name, seed, len(values))
    for i in range(len(values)):
        for j, (kind, at) in enumerate(fields):
            row = b[i:i + 1]
            if kind == "f16":
                # a second field (dmin, m) cycles through the list out of step
                v = EDGE_F16[(i + 3 * j) % len(EDGE_F16)]
                put_u16(row, at, np.array([v], dtype=np.uint16))
            elif kind == "spread_f16":
                put_spread_f16(row, at, np.array([EDGE_F16[i]], dtype=np.uint16))
            elif kind == "e8m0":
                row[0, at] = EDGE_E8M0[i]
            elif kind == "ue4m3x4":
                row[0, at:at + 4] = EDGE_UE4M3[4 * i:4 * i + 4]
    return b


def reference(name: str, blocks: np.ndarray) -> np.ndarray:
    """gguf-py's dequantization of `blocks`, as little-endian f32."""
    qtype = GGMLQuantizationType[name]
    be, bb = GGML_QUANT_SIZES[qtype]
    with np.errstate(over="ignore"):  # huge edge scales overflow to inf, as in C
        out = dequantize(np.ascontiguousarray(blocks).reshape(-1, bb), qtype)
    out = np.asarray(out, dtype=np.float32).reshape(-1)
    assert out.size == blocks.shape[0] * be, (name, out.size)
    return out.astype("<f4")


def write_dir(out: Path, seeds: dict[str, int], n_for) -> None:
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# made by scripts/golden.py with gguf {gguf_version()} and numpy {np.__version__}",
             "# TYPE seed n_random n_edge"]
    for name in TYPES:
        seed = seeds[name]
        n = n_for(name)
        rnd = random_blocks(name, seed, n)
        edge = edge_blocks(name, (seed ^ 0xED6E_ED6E_ED6E_ED6E) & M64)
        blocks = np.concatenate([rnd, edge])
        ref = reference(name, blocks)
        (out / f"{name}.blocks").write_bytes(blocks.tobytes())
        (out / f"{name}.f32").write_bytes(ref.tobytes())
        lines.append(f"{name} {seed} {n} {edge.shape[0]}")
        print(f"{name:8} seed {seed:#018x}: {n} random + {edge.shape[0]} edge blocks")
    (out / "manifest.txt").write_text("\n".join(lines) + "\n")


def gguf_version() -> str:
    try:
        from importlib.metadata import version
        return version("gguf")
    except Exception:  # pragma: no cover
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--live", metavar="DIR", type=Path,
                    help="write fresh cross-check data to DIR instead of the goldens")
    ap.add_argument("--blocks", type=int, default=10000,
                    help="random blocks per type with --live (default 10000)")
    ap.add_argument("--seed", type=lambda s: int(s, 0),
                    help="base seed with --live (default: random)")
    args = ap.parse_args()

    if gguf_version() != "0.19.0":
        print(f"warning: gguf {gguf_version()} installed; the goldens were made with 0.19.0",
              file=sys.stderr)
    if args.live is not None:
        base = args.seed if args.seed is not None else int.from_bytes(os.urandom(8), "little")
        print(f"live cross-check data: base seed {base:#018x}, {args.blocks} blocks per type")
        seeds = {name: (base + GGMLQuantizationType[name].value) & M64 for name in TYPES}
        write_dir(args.live, seeds, lambda name: args.blocks)
    else:
        # Fixed seeds; about 4096 elements per type (16 blocks of 256),
        # 2048 for the plain floats, to keep the directory small.
        seeds = {name: 0x901D_0000 + GGMLQuantizationType[name].value for name in TYPES}

        def n_for(name: str) -> int:
            be = GGML_QUANT_SIZES[GGMLQuantizationType[name]][0]
            return 2048 if be == 1 else max(16, min(64, 4096 // be))
        write_dir(GOLDEN_DIR, seeds, n_for)


if __name__ == "__main__":
    main()
