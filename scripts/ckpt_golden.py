#!/usr/bin/env python3
"""Golden checkpoints for pleio's safetensors row encodings.

Reference: NumPy + ml_dtypes (PyPI `numpy`, `ml_dtypes`), files written by
Hugging Face's `safetensors` (PyPI, `serialize_file`): nothing here shares
code with pleio.

For each case this writes a small checkpoint directory holding a PLE table
with the real tensor names (two row shards of unequal length in two files,
each beside an unrelated tensor, `model.safetensors.index.json`, scale
tensors), and the expected outputs of every row, in global row order:

    <case>/model-0000{1,2}-of-00002.safetensors, model.safetensors.index.json
    <case>/expected.f32   little-endian f32, rows x row_elems
    <case>/expected.bf16  little-endian u16 (bfloat16 bits)
    <case>/expected.f16   little-endian u16 (IEEE half bits)
    manifest.json         [{"case", "encoding", "rows", "row_elems"}]

Formulas (the ones pleio documents in crates/pleio/src/quant/encoding.rs),
all in float32 with one IEEE operation at a time:

    bf16/f16 rows   the exact float32 value
    fp8             f32(e4m3(q)) * f32(scale)
    nvfp4           (LUT[c & 7] * (c & 8 ? -1 : 1) * f32(e4m3(scale[j/16]))) * global
    mlx4            f32(bf16 scale[j/32]) * q + f32(bf16 bias[j/32])

NaN results of fp8/nvfp4/mlx4 are the canonical 0x7FC00000. The bf16 and
f16 outputs are ml_dtypes' and NumPy's round-to-nearest-even conversions of
the f32 output. bf16 NaN is 0x7FC0 with the sign (ml_dtypes' rule, checked);
for f16 NaN, where NumPy keeps a signalling NaN signalling, pleio's rule
applies: keep sign and top payload bits, set the quiet bit (as F16C does;
this script checks NumPy agrees the result is NaN).

Modes:
    ckpt_golden.py                    regenerate the committed goldens in
                                      crates/pleio/tests/golden/ckpt
    ckpt_golden.py --live DIR [--rows N] [--seed S]
                                      fresh random cases of N rows each into
                                      DIR (for scripts/ckpt_crosscheck.sh)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

try:
    import ml_dtypes
    import numpy as np
    from safetensors import TensorSpec, serialize_file
except ImportError:  # pragma: no cover
    sys.exit("ckpt_golden.py needs numpy, ml_dtypes and safetensors: pip install numpy ml_dtypes safetensors")

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "crates" / "pleio" / "tests" / "golden" / "ckpt"
HF = "model.language_model.layers.1.ple.ple_embedding."
MLX = "language_model.model.layers.1.ple.ple_embedding."
GEMMA = "model.language_model.embed_tokens_per_layer.weight"
CANON = np.uint32(0x7FC00000)
F32 = np.float32
E4M3 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16
NVFP4_LUT = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6], dtype=F32)


def canon(y: np.ndarray) -> np.ndarray:
    bits = y.view(np.uint32).copy()
    bits[np.isnan(y)] = CANON
    return bits.view(F32)


def bf16_f32(u16: np.ndarray) -> np.ndarray:
    return u16.view(BF16).astype(F32)


def e4m3_f32(u8: np.ndarray) -> np.ndarray:
    return u8.view(E4M3).astype(F32)


def to_bf16(y: np.ndarray) -> np.ndarray:
    """ml_dtypes' conversion; NaN becomes 0x7FC0 with its sign (checked)."""
    with np.errstate(invalid="ignore"):
        out = y.astype(BF16).view(np.uint16).copy()
    nan = np.isnan(y)
    want = ((y[nan].view(np.uint32) >> 16) & 0x8000 | 0x7FC0).astype(np.uint16)
    assert (out[nan] == want).all()
    return out


def to_f16(y: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        out = y.astype(np.float16).view(np.uint16).copy()
    nan = np.isnan(y)
    assert np.isnan(out[nan].view(np.float16)).all()
    b = y[nan].view(np.uint32)
    out[nan] = (((b >> 16) & 0x8000) | 0x7E00 | ((b >> 13) & 0x3FF)).astype(np.uint16)
    return out


def bf16_finite(rng, shape, lo=-12, hi=4, signed=True):
    """Random finite bf16 bits with exponent in [2^lo, 2^hi)."""
    e = rng.integers(127 + lo, 127 + hi, size=shape, dtype=np.uint16)
    m = rng.integers(0, 128, size=shape, dtype=np.uint16)
    s = rng.integers(0, 2, size=shape, dtype=np.uint16) if signed else 0
    return (s << 15 | e << 7 | m).astype(np.uint16)


# Each case builder: (rng, shard_rows) -> (encoding, row_elems, shard tensors,
# extra tensors, expected f32 [rows, row_elems]). Shard tensors: per shard a
# list of (field, dtype, array); names are made by the writer.

def case_bf16(rng, rows_per, width=160, edge=True):
    n = sum(rows_per)
    u = rng.integers(0, 1 << 16, size=(n, width), dtype=np.uint16)
    if edge:
        u[0, :8] = [0x0000, 0x8000, 0x0001, 0x807F, 0x7F7F, 0xFF80, 0x7FC0, 0xFFC0]
        u[1, :2] = [0x7F81, 0xFFA5]  # signalling NaNs keep their bits in f32
    return "bf16", width, split(rows_per, [("weight", "bfloat16", u)]), [], bf16_f32(u)


def case_f16(rng, rows_per):
    n = sum(rows_per)
    u = rng.integers(0, 1 << 16, size=(n, 160), dtype=np.uint16)
    # Quiet NaNs only: NumPy keeps a signalling half NaN signalling in
    # float32, ggml's (and pleio's) F16 decoder quiets it.
    nan = (u & 0x7C00) == 0x7C00
    u[nan & ((u & 0x3FF) != 0)] |= 0x200
    u[0, :8] = [0x0000, 0x8000, 0x0001, 0x83FF, 0x7BFF, 0xFC00, 0x7E00, 0xFE01]
    return "f16", 160, split(rows_per, [("weight", "float16", u)]), [], u.view(np.float16).astype(F32)


def fp8_codes(rng, n):
    q = rng.integers(0, 256, size=(n, 160), dtype=np.uint8)
    q[0] = np.arange(160, dtype=np.uint8)
    q[1, :96] = np.arange(160, 256, dtype=np.uint8)
    return q


def case_fp8(rng, rows_per, scale_dtype="bfloat16"):
    n = sum(rows_per)
    q = fp8_codes(rng, n)
    if scale_dtype == "bfloat16":
        s_bits = np.array([0x3952], dtype=np.uint16)  # ~2e-4, as released
        s = bf16_f32(s_bits)[0]
        extra = [(HF + "ngram_embedding.weight_scale", "bfloat16", [], s_bits)]
    else:
        s = F32(rng.uniform(1e-4, 3e-4))  # not bf16-exact: the product rounds
        extra = [(HF + "ngram_embedding.weight_scale", "float32", [1], np.array([s], dtype=F32))]
    with np.errstate(invalid="ignore", over="ignore"):
        y = canon(e4m3_f32(q) * F32(s))
    if scale_dtype == "bfloat16":
        # The engines' bf16(f32(e4m3) * f32(scale)) rounds once: the f32
        # product is exact (checked in float64).
        exact = e4m3_f32(q).astype(np.float64) * np.float64(s)
        fin = np.isfinite(exact)
        assert (y[fin].astype(np.float64) == exact[fin]).all()
    name = "fp8" if scale_dtype == "bfloat16" else "fp8"
    return name, 160, split(rows_per, [("weight", "float8_e4m3fn", q)]), extra, y


def case_fp8_row(rng, rows_per, scale_dtype="bfloat16"):
    n = sum(rows_per)
    q = fp8_codes(rng, n)
    if scale_dtype == "bfloat16":
        sb = bf16_finite(rng, (n, 1), -14, -10, signed=False)
        edges = [0x0000, 0x8000, 0x0001, 0x7F7F, 0x7F80, 0x7FC0, 0xBF80]
        sb[2:2 + len(edges), 0] = edges
        s = bf16_f32(sb)
        arr = sb
    else:
        s = rng.uniform(1e-5, 1e-3, size=(n, 1)).astype(F32)
        edges = np.array([0x00000001, 0x7F7FFFFF, 0x7E800001, 0x80000000], dtype=np.uint32)
        s[2:2 + len(edges), 0] = edges.view(F32)
        arr = s
    with np.errstate(invalid="ignore", over="ignore"):
        y = canon(e4m3_f32(q) * s)
    return "fp8-row", 160, split(rows_per, [("weight", "float8_e4m3fn", q), ("weight_scale", scale_dtype, arr)]), [], y


def case_nvfp4(rng, rows_per):
    n = sum(rows_per)
    qb = rng.integers(0, 256, size=(n, 80), dtype=np.uint8)
    qb[0] = (np.arange(80) * 3 % 256).astype(np.uint8)
    sc = ((rng.integers(3, 7, size=(n, 10)) << 3) | rng.integers(0, 8, size=(n, 10))).astype(np.uint8)
    sc[1] = [0x00, 0x01, 0x7E, 0x7F, 0x80, 0xFF, 0xFE, 0x08, 0x38, 0x77]
    g = F32(1.0 / 2688.0)
    c = np.empty((n, 160), dtype=np.uint8)
    c[:, 0::2] = qb & 0xF
    c[:, 1::2] = qb >> 4
    v = NVFP4_LUT[c]
    e = np.repeat(e4m3_f32(sc), 16, axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        y = canon((v * e) * g)
    shards = split(rows_per, [("weight", "uint8", qb), ("weight_scale", "float8_e4m3fn", sc)])
    for i, s in enumerate(shards):
        s.append(("weight_scale_2", "float32", np.array(g, dtype=F32).reshape(())))
    return "nvfp4", 160, shards, [], y


def case_mlx4(rng, rows_per):
    n = sum(rows_per)
    w = rng.integers(0, 1 << 32, size=(n, 20), dtype=np.uint64).astype(np.uint32)
    sb = bf16_finite(rng, (n, 5), -8, -2, signed=False)
    bb = bf16_finite(rng, (n, 5), -6, 0, signed=True)
    sb[0] = [0x0000, 0x8000, 0x0001, 0x7F7F, 0x7F80]
    bb[0] = [0x3F80, 0x8000, 0x0001, 0xBF80, 0xFF80]
    sb[1] = [0x7FC0, 0x3F80, 0x7F80, 0xFFC0, 0x3F00]
    bb[1] = [0x3F80, 0x7FC0, 0xFF80, 0xFFC0, 0x7F7F]
    shifts = (np.arange(160) % 8 * 4).astype(np.uint32)
    q = ((w[:, np.arange(160) // 8] >> shifts) & 0xF).astype(F32)
    s = np.repeat(bf16_f32(sb), 32, axis=1)
    b = np.repeat(bf16_f32(bb), 32, axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        y = canon(s * q + b)
    shards = split(rows_per, [("weight", "uint32", w), ("scales", "bfloat16", sb), ("biases", "bfloat16", bb)])
    return "mlx4", 160, shards, [], y


def split(rows_per, fields):
    """Per shard: the fields' row slices."""
    out, start = [], 0
    for r in rows_per:
        out.append([(f, dt, a[start:start + r]) for f, dt, a in fields])
        start += r
    return out


def write_case(d: Path, builder, rng, rows_per, prefix=HF, mlx=False, gemma=False):
    enc, width, shards, extra, y = builder(rng, rows_per)
    d.mkdir(parents=True)
    files = [[], []]
    for i, fields in enumerate(shards):
        for f, dt, a in fields:
            if gemma:
                name = GEMMA
            elif mlx:
                name = f"{prefix}ngram_embedding.shards.{i}.{f}"
            else:
                name = f"{prefix}ngram_embedding.shard_{i}.{f}"
            files[i * 2 // len(shards)].append((name, dt, list(a.shape), a))
    for i in range(2):
        unrelated = rng.integers(0, 1 << 16, size=(3 + i, 7), dtype=np.uint16) & 0x3FFF
        files[i].append((f"model.language_model.layers.{i}.ple.key_proj.weight", "bfloat16", [3 + i, 7], unrelated))
    for name, dt, shape, a in extra:
        files[1].append((name, dt, shape, np.ascontiguousarray(a)))
    weight_map = {}
    for i, tensors in enumerate(files):
        fname = f"model-{i + 1:05d}-of-00002.safetensors"
        keep = [np.ascontiguousarray(a) for _, _, _, a in tensors]
        specs = {
            name: TensorSpec(dtype=dt, shape=shape, data_ptr=a.ctypes.data, data_len=a.nbytes)
            for (name, dt, shape, _), a in zip(tensors, keep)
        }
        serialize_file(specs, str(d / fname), {"format": "pt"})
        for name in specs:
            weight_map[name] = fname
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}, indent=1))
    y = np.ascontiguousarray(y, dtype=F32)
    y.tofile(d / "expected.f32")
    to_bf16(y).astype("<u2").tofile(d / "expected.bf16")
    to_f16(y).astype("<u2").tofile(d / "expected.f16")
    return {"case": d.name, "encoding": enc, "rows": int(y.shape[0]), "row_elems": int(width)}


CASES = [
    # name, builder, kwargs for write_case
    ("bf16", case_bf16, {}),
    ("f16", case_f16, {}),
    ("fp8", case_fp8, {}),
    ("fp8-f32-scale", lambda r, p: case_fp8(r, p, "float32"), {}),
    ("fp8-row", case_fp8_row, {}),
    ("fp8-row-f32", lambda r, p: case_fp8_row(r, p, "float32"), {}),
    ("nvfp4", case_nvfp4, {}),
    ("mlx4", case_mlx4, {"prefix": MLX, "mlx": True}),
    ("gemma4-bf16", lambda r, p: case_bf16(r, p, width=512), {"gemma": True}),
]


def write_all(out: Path, rows: int, seed: int) -> None:
    manifest = []
    for k, (name, builder, kw) in enumerate(CASES):
        rng = np.random.default_rng([seed, k])
        if kw.get("gemma"):
            rows_per = [rows]
        else:
            rows_per = [rows // 2 + 1, rows - rows // 2 - 1]
        manifest.append(write_case(out / name, builder, rng, rows_per, **kw))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--live", type=Path, help="write fresh cases into this new directory")
    ap.add_argument("--rows", type=int, default=2000, help="rows per live case (default 2000)")
    ap.add_argument("--seed", type=int, help="live seed (default random, printed)")
    a = ap.parse_args()
    if a.live:
        seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
        print(f"ckpt_golden: live cases of {a.rows} rows, seed {seed}")
        write_all(a.live, max(a.rows, 24), seed)
    else:
        import shutil
        if GOLDEN_DIR.exists():
            shutil.rmtree(GOLDEN_DIR)
        write_all(GOLDEN_DIR, 24, 20261201)
        print(f"wrote {GOLDEN_DIR}")


if __name__ == "__main__":
    main()
