#!/usr/bin/env python3
"""Independent reference for the qwen4exp n-gram row ids (docs/ple-tables.md s.2).

Reads the token ids of ONE sequence and prints their row ids as JSON:

    python3 scripts/ngram_ref.py --tokens FILE
    -> {"tokens": [...], "rows": [[h0, ..., h15], ...]}

FILE (or "-" for stdin) holds token ids as a JSON array or as integers
separated by whitespace or commas. The released model's constants are used
unless --params names a JSON file with the keys ngram_size, heads_per_ngram,
eos_token_id, layer_multipliers, head_vocab_sizes, head_offsets (the metadata
names without the "qwen4exp.ple." prefix).

The algorithm is written straight from the document (walk back per slot,
recompute the mix per n-gram order) and shares no code with the Rust mapper.
"""
import argparse
import json
import re
import sys

U64 = (1 << 64) - 1

RELEASED = {
    "ngram_size": 3,
    "heads_per_ngram": 8,
    "eos_token_id": 248044,
    "layer_multipliers": [23703573157769, 20109073645365, 8052911324071],
    "head_vocab_sizes": [
        20000003, 20000023, 20000033, 20000047, 20000059, 20000063, 20000069, 20000077,
        20000081, 20000093, 20000107, 20000147, 20000153, 20000159, 20000161, 20000171,
    ],
}
RELEASED["head_offsets"] = [sum(RELEASED["head_vocab_sizes"][:h]) for h in range(16)]


def context(tokens, p, n, eos):
    """ctx[0] = tok[p]; ctx[s] = tok[p-s] until a predecessor is missing or EOS."""
    ctx = [tokens[p]]
    stopped = False
    for s in range(1, n):
        if not stopped and (p - s < 0 or tokens[p - s] == eos):
            stopped = True
        ctx.append(eos if stopped else tokens[p - s])
    return ctx


def rows_for(tokens, prm):
    n_gram = prm["ngram_size"]
    per = prm["heads_per_ngram"]
    m = prm["layer_multipliers"]
    size = prm["head_vocab_sizes"]
    off = prm["head_offsets"]
    eos = prm["eos_token_id"]
    out = []
    for p in range(len(tokens)):
        ctx = context(tokens, p, n_gram, eos)
        row = [0] * ((n_gram - 1) * per)
        for n in range(2, n_gram + 1):
            mixed = (ctx[0] * m[0]) & U64
            for j in range(1, n):
                mixed ^= (ctx[j] * m[j]) & U64
            for g in range(per):
                h = (n - 2) * per + g
                row[h] = mixed % size[h] + off[h]
        out.append(row)
    return out


def read_tokens(path):
    text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    text = text.strip()
    if text.startswith("["):
        vals = json.loads(text)
    elif text.startswith("{"):
        vals = json.loads(text)["tokens"]
    else:
        vals = [int(v) for v in re.split(r"[\s,]+", text) if v]
    for v in vals:
        if not isinstance(v, int) or not 0 <= v < 2**32:
            sys.exit(f"ngram_ref: token {v!r} is not a u32")
    return vals


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", required=True, help="token id file, or - for stdin")
    ap.add_argument("--params", help="JSON file with the hash parameters (default: released)")
    args = ap.parse_args()
    prm = dict(RELEASED)
    if args.params:
        with open(args.params, encoding="utf-8") as f:
            prm.update(json.load(f))
    tokens = read_tokens(args.tokens)
    json.dump({"tokens": tokens, "rows": rows_for(tokens, prm)}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
