#!/usr/bin/env python3
"""pleio's rounding rules against the engines' own code, bit for bit.

Writes small synthetic checkpoints with `pleio synth --format safetensors`:

- FP8 with its BF16 table scale, and the same rows with the scale rewritten
  as a random F32 near 2e-4 that bf16 cannot hold;
- FP8 with per-row scales: BF16 as written, and rewritten as random F32s;
- MLX affine 4-bit (group 32, BF16 scales and biases);
- NVFP4 (E4M3 block scales, one F32 global scale);

gathers every row with `pleio gather --rounding R --dtype D` for each rule
and output type, and compares the bits with:

- vllm: torch, `w.to(dtype) * scale.to(dtype)` (vLLM's and SGLang's
  dequantize), the tensors read with `safetensors.torch`;
- vllm on NVFP4: vLLM 0.33's CPU `dequantize_to_dtype`, restated in torch
  (block scale times global scale first, then times the E2M1 value);
- mlx: `mx.dequantize(w, scales, biases, group_size=32, bits=4, dtype=D)`,
  the tensors read with `mx.load`;
- exact: the exact product / affine value in float64, rounded once to D.

It also asserts that the engine rules differ from exact where they should
(vllm with an F32 scale: about 40% of bf16 elements; mlx bf16: about 16%)
and equal it where they must (vllm with BF16 scales, bf16 output), so the
check cannot pass vacuously.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import ml_dtypes
import numpy as np
import torch
from safetensors.torch import load_file, save_file
import mlx.core as mx

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
MX = {"bf16": mx.bfloat16, "f16": mx.float16, "f32": mx.float32}
NP = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}
FAILURES = []


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"rounding_check: {' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def index(ckpt):
    with open(os.path.join(ckpt, "model.safetensors.index.json")) as f:
        return json.load(f)["weight_map"]


def tensors(ckpt, suffix_re):
    """name -> file for the table tensors whose name ends with suffix_re."""
    import re

    return {n: f for n, f in index(ckpt).items() if re.search(suffix_re, n)}


def shard_key(name):
    import re

    return int(re.search(r"shard(?:s\.|_)(\d+)\.", name).group(1))


def load_shards(ckpt, field):
    """The table's per-shard tensors `field`, concatenated in shard order."""
    import re

    names = tensors(ckpt, r"ngram_embedding\.shard(s\.|_)\d+\." + re.escape(field) + "$")
    by_file = {}
    for n, f in names.items():
        by_file.setdefault(f, []).append(n)
    got = {}
    for f, ns in by_file.items():
        t = load_file(os.path.join(ckpt, f))
        for n in ns:
            got[n] = t[n]
    return torch.cat([got[n] for n in sorted(got, key=shard_key)])


def rewrite(ckpt, names_values):
    """Replaces tensors (name -> new torch tensor) in their files."""
    wm = index(ckpt)
    files = {}
    for n, v in names_values.items():
        files.setdefault(wm[n], {})[n] = v
    for f, new in files.items():
        path = os.path.join(ckpt, f)
        t = load_file(path)
        t.update(new)
        tmp = path + ".tmp"
        save_file({k: v.contiguous() for k, v in t.items()}, tmp, metadata={"format": "pt"})
        os.replace(tmp, path)


def gather(pleio, ckpt, rows, dtype, rounding, work):
    out = os.path.join(work, f"g-{rounding}-{dtype}.npy")
    if os.path.exists(out):
        os.remove(out)
    rows_file = os.path.join(work, "rows.txt")
    with open(rows_file, "w") as f:
        f.write(" ".join(str(i) for i in range(rows)))
    r = run([pleio, "gather", ckpt, "--rows-file", rows_file, "--dtype", dtype,
             "--rounding", rounding, "--format", "npy", "--json", "-o", out])
    stats = json.loads(r.stdout)
    assert stats["rounding"] == ("vllm" if rounding == "sglang" else rounding), stats
    a = np.load(out)
    return a.view(np.uint16 if dtype != "f32" else np.uint32)


def bits(a, dtype):
    a = np.ascontiguousarray(a)
    return a.view(np.uint16 if dtype != "f32" else np.uint32)


def torch_bits(t, dtype):
    t = t.contiguous()
    if dtype == "f32":
        return t.view(torch.int32).numpy().view(np.uint32)
    return t.view(torch.int16).numpy().view(np.uint16)


def compare(label, got, want):
    if got.shape != want.shape:
        FAILURES.append(f"{label}: shape {got.shape} != {want.shape}")
        print(f"  FAIL {label}: shape {got.shape} != {want.shape}")
        return
    bad = np.argwhere(got != want)
    if len(bad):
        r, c = bad[0]
        FAILURES.append(label)
        print(f"  FAIL {label}: {len(bad)} of {got.size} elements differ; first at row {r} "
              f"col {c}: pleio {got[r, c]:#x}, reference {want[r, c]:#x}")
    else:
        print(f"  ok   {label}: {got.size} elements bit-identical")


def share_differing(a, b):
    return float(np.mean(a != b))


def expect_share(label, share, lo, hi):
    ok = lo <= share <= hi
    print(f"  {'ok  ' if ok else 'FAIL'} {label}: {share:.1%} of elements differ from exact "
          f"(expected {lo:.0%}..{hi:.0%})")
    if not ok:
        FAILURES.append(label)


def check_fp8(pleio, ckpt, work, name, scale_kind):
    w = load_shards(ckpt, "weight")  # float8_e4m3fn [rows, D]
    rows = w.shape[0]
    if scale_kind == "table":
        (sname, sfile), = tensors(ckpt, r"ngram_embedding\.weight_scale$").items()
        scale = load_file(os.path.join(ckpt, sfile))[sname]
    else:
        scale = load_shards(ckpt, "weight_scale")  # [rows, 1]
    print(f"{name}: {rows} rows x {w.shape[1]}, scale {scale.dtype} "
          f"{'per tensor' if scale_kind == 'table' else 'per row'}")
    exact64 = w.to(torch.float64) * scale.to(torch.float64)
    out = {}
    for dt, tdt in DTYPES.items():
        vllm = torch_bits(w.to(tdt) * scale.to(tdt), dt)
        exact = bits(exact64.numpy().astype(np.float32).astype(NP[dt]), dt)
        got_v = gather(pleio, ckpt, rows, dt, "vllm", work)
        got_s = gather(pleio, ckpt, rows, dt, "sglang", work)
        got_e = gather(pleio, ckpt, rows, dt, "exact", work)
        compare(f"{name} vllm {dt} == torch w.to({dt}) * scale.to({dt})", got_v, vllm)
        compare(f"{name} sglang {dt} == vllm {dt}", got_s, got_v)
        compare(f"{name} exact {dt} == exact value rounded once", got_e, exact)
        out[dt] = share_differing(vllm, exact)
    return out


def check_mlx(pleio, ckpt, work):
    import re

    arrays = {}
    for f in sorted(set(index(ckpt).values())):
        arrays.update(mx.load(os.path.join(ckpt, f)))

    def cat(field):
        names = [n for n in arrays if re.search(r"ngram_embedding\.shards\.\d+\." + field + "$", n)]
        return mx.concatenate([arrays[n] for n in sorted(names, key=shard_key)])

    w, s, b = cat("weight"), cat("scales"), cat("biases")
    rows = w.shape[0]
    print(f"mlx4: {rows} rows x {w.shape[1] * 8}, scales {s.dtype}, biases {b.dtype}")
    # The exact affine value, in float64, from the same arrays.
    wn = np.array(w)
    q = np.stack([(wn >> (4 * k)) & 15 for k in range(8)], axis=-1).reshape(rows, -1)
    sn = np.array(s.astype(mx.float32)).astype(np.float64).repeat(32, axis=1)
    bn = np.array(b.astype(mx.float32)).astype(np.float64).repeat(32, axis=1)
    exact64 = sn * q + bn
    shares = {}
    for dt in DTYPES:
        y = mx.dequantize(w, s, b, group_size=32, bits=4, mode="affine", dtype=MX[dt])
        mx.eval(y)
        if dt == "bf16":
            ref = np.array(y.view(mx.uint16))
        elif dt == "f16":
            ref = np.array(y.view(mx.uint16))
        else:
            ref = np.array(y.view(mx.uint32))
        exact = bits(exact64.astype(np.float32).astype(NP[dt]), dt)
        got_m = gather(pleio, ckpt, rows, dt, "mlx", work)
        got_e = gather(pleio, ckpt, rows, dt, "exact", work)
        compare(f"mlx4 mlx {dt} == mx.dequantize(..., dtype={dt})", got_m, ref)
        compare(f"mlx4 exact {dt} == exact value rounded once", got_e, exact)
        shares[dt] = share_differing(ref, exact)
    return shares


def check_nvfp4(pleio, ckpt, work):
    """vllm: vLLM 0.33's CPU NVFP4 decode (``dequantize_to_dtype`` with
    ``swizzle=False``, as its device table runs it off CUDA), restated in
    torch: E2M1 values from a table times the sign, block scales times the
    global scale first, then the product, then the cast. exact: the exact
    value, rounded once to f32, then to the output type (vLLM's GPU kernel
    order, ``(v * scale) * global``)."""
    w = load_shards(ckpt, "weight")  # uint8 [rows, D/2]
    sf = load_shards(ckpt, "weight_scale")  # float8_e4m3fn [rows, D/16]
    (gname, gfile), *_ = tensors(ckpt, r"weight_scale_2$").items()
    g = load_file(os.path.join(ckpt, gfile))[gname].float()
    rows, d = w.shape[0], w.shape[1] * 2
    print(f"nvfp4: {rows} rows x {d}, global scale {g.item()!r}")
    low, high = w & 0x0F, (w & 0xF0) >> 4
    codes = torch.stack((low, high), dim=-1).reshape(rows, d)
    lut = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float32)
    values = lut[(codes & 0x07).long()] * torch.where((codes & 0x08).bool(), -1.0, 1.0)
    block = sf.to(torch.float32) * g  # the block scale times the global one
    vllm32 = (values.reshape(rows, -1, 16) * block.unsqueeze(-1)).reshape(rows, d)
    e = sf.to(torch.float64).repeat_interleave(16, dim=1)
    exact64 = values.to(torch.float64) * e * g.to(torch.float64)
    shares = {}
    for dt, tdt in DTYPES.items():
        ref = torch_bits(vllm32.to(tdt), dt)
        exact = bits(exact64.numpy().astype(np.float32).astype(NP[dt]), dt)
        got_v = gather(pleio, ckpt, rows, dt, "vllm", work)
        got_e = gather(pleio, ckpt, rows, dt, "exact", work)
        compare(f"nvfp4 vllm {dt} == vLLM's CPU dequantize_to_dtype", got_v, ref)
        compare(f"nvfp4 exact {dt} == exact value rounded once", got_e, exact)
        shares[dt] = share_differing(ref, exact)
    return shares


def refused(pleio, ckpt, rounding, work):
    out = os.path.join(work, "refused.bin")
    r = subprocess.run([pleio, "gather", ckpt, "--rows", "0", "--dtype", "bf16",
                        "--rounding", rounding, "-o", out], capture_output=True, text=True)
    ok = r.returncode == 2 and "rounding rule" in r.stderr and not os.path.exists(out)
    print(f"  {'ok  ' if ok else 'FAIL'} --rounding {rounding} refused: {r.stderr.strip()[:160]}")
    if not ok:
        FAILURES.append(f"refusal of {rounding}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pleio", required=True)
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=20)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    work = tempfile.mkdtemp(prefix="pleio-rounding-")
    try:
        ck = {}
        for enc in ["fp8", "fp8-row", "mlx4", "nvfp4"]:
            ck[enc] = os.path.join(work, enc)
            run([a.pleio, "synth", "--format", "safetensors", "--encoding", enc,
                 "--rows", str(a.rows), "--files", "2", "--seed", str(a.seed), "-o", ck[enc]])
        # The same FP8 rows with an F32 table scale bf16 cannot hold.
        ck["fp8-f32"] = os.path.join(work, "fp8-f32")
        shutil.copytree(ck["fp8"], ck["fp8-f32"])
        (sname, _), = tensors(ck["fp8-f32"], r"ngram_embedding\.weight_scale$").items()
        while True:
            v = np.float32(2e-4 * (1 + rng.random()))
            if np.float32(v.astype(ml_dtypes.bfloat16)) != v and np.float32(np.float16(v)) != v:
                break
        rewrite(ck["fp8-f32"], {sname: torch.tensor(float(v), dtype=torch.float32).reshape(())})
        # Per-row F32 scales.
        ck["fp8-row-f32"] = os.path.join(work, "fp8-row-f32")
        shutil.copytree(ck["fp8-row"], ck["fp8-row-f32"])
        names = tensors(ck["fp8-row-f32"], r"ngram_embedding\.shard_\d+\.weight_scale$")
        new = {}
        for n, f in names.items():
            t = load_file(os.path.join(ck["fp8-row-f32"], f))[n]
            vals = (2e-4 * np.exp(rng.normal(0, 0.5, size=t.shape))).astype(np.float32)
            new[n] = torch.from_numpy(vals)
        rewrite(ck["fp8-row-f32"], new)

        shares = {}
        shares["fp8"] = check_fp8(a.pleio, ck["fp8"], work, "fp8 (bf16 table scale)", "table")
        shares["fp8-f32"] = check_fp8(a.pleio, ck["fp8-f32"], work,
                                      f"fp8 (f32 table scale {float(v)!r})", "table")
        shares["fp8-row"] = check_fp8(a.pleio, ck["fp8-row"], work, "fp8-row (bf16 scales)", "row")
        shares["fp8-row-f32"] = check_fp8(a.pleio, ck["fp8-row-f32"], work,
                                          "fp8-row (f32 scales)", "row")
        shares["mlx4"] = check_mlx(a.pleio, ck["mlx4"], work)
        shares["nvfp4"] = check_nvfp4(a.pleio, ck["nvfp4"], work)

        print("how often the engine rules differ from exact:")
        expect_share("vllm bf16, bf16 table scale", shares["fp8"]["bf16"], 0.0, 0.0)
        expect_share("vllm f32, bf16 table scale", shares["fp8"]["f32"], 0.0, 0.0)
        expect_share("vllm bf16, f32 table scale", shares["fp8-f32"]["bf16"], 0.2, 0.7)
        expect_share("vllm f16, f32 table scale", shares["fp8-f32"]["f16"], 0.01, 0.7)
        expect_share("vllm f32, f32 table scale", shares["fp8-f32"]["f32"], 0.0, 0.0)
        expect_share("vllm bf16, bf16 row scales", shares["fp8-row"]["bf16"], 0.0, 0.0)
        expect_share("vllm bf16, f32 row scales", shares["fp8-row-f32"]["bf16"], 0.1, 0.7)
        expect_share("mlx bf16", shares["mlx4"]["bf16"], 0.05, 0.4)
        expect_share("mlx f32 (mlx computes in bf16, then casts)", shares["mlx4"]["f32"], 0.5, 1.0)
        expect_share("vllm nvfp4 f32 (block scale times global first)", shares["nvfp4"]["f32"], 0.01, 0.5)

        print("rules that do not apply:")
        refused(a.pleio, ck["fp8"], "mlx", work)
        refused(a.pleio, ck["mlx4"], "vllm", work)
        refused(a.pleio, ck["nvfp4"], "mlx", work)
        gg = os.path.join(work, "t.gguf")
        run([a.pleio, "synth", "--rows", "500", "-o", gg])
        refused(a.pleio, gg, "vllm", work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if FAILURES:
        print(f"rounding_check: FAILED: {len(FAILURES)} check(s): {FAILURES}")
        sys.exit(1)
    print("rounding_check: passed")


if __name__ == "__main__":
    main()
