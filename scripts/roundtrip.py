#!/usr/bin/env python3
"""End-to-end check of `pleio synth` and `pleio gather` against gguf-py.

For several table types: writes a small synthetic file with `pleio synth`,
reads it back with gguf-py's own GGUFReader (an independent GGUF parser),
gathers random rows (with duplicates and the last row) with `pleio gather`
in raw and npy form, and compares the f32 bits with gguf-py's
`gguf.quants.dequantize` of the same rows. Exits non-zero on any mismatch.

Usage: python3 scripts/roundtrip.py --pleio target/release/pleio
"""
import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import gguf
from gguf.quants import dequantize

CASES = [
    ("qwen4exp", "IQ4_NL", 5000),
    ("qwen4exp", "Q4_0", 3000),
    ("qwen4exp", "Q5_0", 3000),
    ("qwen4exp", "Q5_1", 3000),
    ("qwen4exp", "Q4_1", 3000),
    ("qwen4exp", "Q8_0", 3000),
    ("qwen4exp", "MXFP4", 3000),
    ("qwen4exp", "F16", 2000),
    ("qwen4exp", "BF16", 2000),
    ("qwen4exp", "F32", 2000),
    ("gemma4", "Q5_K", 300),
    ("gemma4", "Q6_K", 200),
    ("gemma4", "IQ2_XXS", 200),
]


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAILED: {' '.join(map(str, cmd))}\n{r.stdout}{r.stderr}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pleio", required=True, help="path to the pleio binary")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rnd = random.Random(args.seed)
    failures = 0
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        for arch, ty, rows in CASES:
            f = d / f"{arch}-{ty}.gguf"
            extra = ["--layers", "2"] if arch == "gemma4" else []
            run([args.pleio, "synth", "--arch", arch, "--type", ty, "--rows", str(rows),
                 "--seed", str(rnd.randrange(1 << 32)), "-o", f, *extra])
            info = json.loads(run([args.pleio, "inspect", "--json", f]))
            reader = gguf.GGUFReader(f)
            t = next(t for t in reader.tensors if t.name == "per_layer_token_embd.weight")
            assert t.tensor_type.name == ty, (t.tensor_type.name, ty)
            assert info["table"]["rows"] == rows and int(t.shape[1]) == rows
            assert info["table"]["offset"] == t.data_offset, (info["table"]["offset"], t.data_offset)
            ids = [rnd.randrange(rows) for _ in range(200)] + [rows - 1, 0, 0, rows - 1]
            expected = dequantize(np.asarray(t.data)[ids], t.tensor_type).astype(np.float32)
            expected = expected.reshape(len(ids), -1)
            (d / "rows.txt").write_text(" ".join(map(str, ids)))
            run([args.pleio, "gather", f, "--rows-file", d / "rows.txt", "-o", d / "out.f32", "--force"])
            got = np.fromfile(d / "out.f32", dtype="<f4").reshape(expected.shape)
            run([args.pleio, "gather", f, "--rows-file", d / "rows.txt", "--format", "npy", "-o", d / "out.npy", "--force"])
            got_npy = np.load(d / "out.npy")
            ok = np.array_equal(got.view(np.uint32), expected.view(np.uint32)) and \
                np.array_equal(got_npy.view(np.uint32), expected.view(np.uint32))
            print(f"{arch:9} {ty:8} rows={rows:6} gathered={len(ids)} {'ok' if ok else 'MISMATCH'}")
            failures += not ok
            # Cross-check the metadata gguf-py sees.
            if arch == "qwen4exp":
                sizes = info["table"]["ngram"]["head_vocab_sizes"]
                assert sum(sizes) <= rows and len(sizes) == 16
    print(f"roundtrip: {len(CASES) - failures} passed, {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
