#!/usr/bin/env python3
"""Independent reference for the qwen4exp n-gram row ids (docs/ple-tables.md s.2).

Reads the token ids of ONE sequence and prints their row ids as JSON:

    python3 scripts/ngram_ref.py --tokens FILE
    -> {"tokens": [...], "rows": [[h0, ..., h15], ...]}

FILE (or "-" for stdin) holds token ids as a JSON array or as integers
separated by whitespace or commas. The released model's constants are used
unless --params names a JSON file with the keys ngram_size, heads_per_ngram,
eos_token_id, layer_multipliers, head_vocab_sizes, head_offsets (the metadata
names without the "qwen4exp.ple." prefix), or --config names a checkpoint's
config.json, from which the parameters of one PLE layer are derived:

    python3 scripts/ngram_ref.py --config CK/config.json --layer 2 --tokens FILE

--layer is the decoder layer (0-based, model.model.layers[L]; default: the
first of ple_layer_ids). Its PLE layer index k is the position of L + 1 in
the sorted ple_layer_ids (1-based); the multipliers are seeded
seed + 10007 * k, and head h takes the (16k + h + 1)-th prime after
ngram_vocab_size_base - 1 (transformers' qwen4_exp: _build_layer_multipliers,
_find_nth_prime_after). --layer-index K gives k directly.

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


MASK = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def splitmix64(v):
    v = (v + GAMMA) & MASK
    v = ((v ^ (v >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    v = ((v ^ (v >> 27)) * 0x94D049BB133111EB) & MASK
    return v ^ (v >> 31)


def is_prime(n):
    if n < 2:
        return False
    d = 2
    while d * d <= n:
        if n % d == 0:
            return False
        d += 1
    return True


def params_from_config(cfg, layer=None, index=None):
    """The hash parameters of one PLE layer, derived from a config.json."""
    c = cfg.get("text_config") if "ngram_size" in cfg.get("text_config", {}) else cfg
    get = lambda k, d=None: c.get(k, cfg.get(k, d))
    ids = sorted(set(get("ple_layer_ids") or []))
    if index is None:
        if layer is None:
            index = 0
        elif layer + 1 in ids:
            index = ids.index(layer + 1)
        else:
            sys.exit(f"ngram_ref: decoder layer {layer} is not in ple_layer_ids {ids} (1-based)")
    n_gram, per = get("ngram_size"), get("heads_per_ngram")
    heads = (n_gram - 1) * per
    vocab = get("vocab_size")
    seed = get("seed")
    seed = 1234 if seed is None else seed
    half = max(1, ((1 << 63) - 1) // max(vocab, 1) // 2)
    base_seed = seed + 10007 * index
    mult = [2 * (splitmix64((base_seed + GAMMA * (i + 1)) & MASK) % half) + 1 for i in range(n_gram)]
    sizes = []
    p = get("ngram_vocab_size_base") - 1
    skipped = 0
    while len(sizes) < heads:
        p += 1
        if is_prime(p):
            if skipped < index * heads:
                skipped += 1
            else:
                sizes.append(p)
    eos = get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    return {
        "ngram_size": n_gram,
        "heads_per_ngram": per,
        "eos_token_id": eos,
        "layer_multipliers": mult,
        "head_vocab_sizes": sizes,
        "head_offsets": [sum(sizes[:h]) for h in range(heads)],
    }


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
    ap.add_argument("--config", help="a checkpoint's config.json: derive the parameters of one PLE layer")
    ap.add_argument("--layer", type=int, help="with --config: the decoder layer (0-based)")
    ap.add_argument("--layer-index", type=int, help="with --config: the PLE layer index (position in ple_layer_ids)")
    args = ap.parse_args()
    prm = dict(RELEASED)
    if args.params and args.config:
        sys.exit("ngram_ref: give --params or --config, not both")
    if (args.layer is not None or args.layer_index is not None) and not args.config:
        sys.exit("ngram_ref: --layer and --layer-index need --config")
    if args.params:
        with open(args.params, encoding="utf-8") as f:
            prm.update(json.load(f))
    if args.config:
        with open(args.config, encoding="utf-8") as f:
            prm = params_from_config(json.load(f), args.layer, args.layer_index)
    tokens = read_tokens(args.tokens)
    json.dump({"tokens": tokens, "rows": rows_for(tokens, prm)}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
