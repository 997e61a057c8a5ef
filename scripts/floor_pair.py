#!/usr/bin/env python3
"""Compares the device-floor figures of two `pleio demo --json` runs (the
docs/benchmarks.md's "The floor's stability" table and issue 15's check: two runs in a
row on an idle machine agree within 10%).

    pleio demo --json a.json; pleio demo --json b.json
    python3 scripts/floor_pair.py a.json b.json [--markdown]

Exits 1 when a figure moved by more than 10%.
"""
import argparse
import json
import sys


def figures(path):
    j = json.load(open(path))
    limit = {a["rows"]: a for a in j["arms"] if a["strategy"] == "limit" and a["cold"]}
    rf = j.get("replay_floor") or {}
    return {
        "prefill floor, tokens/s": rf.get("prefill_tokens_per_s"),
        "decode floor, tokens/s": rf.get("decode_tokens_per_s"),
        "16-row floor, ms": limit.get(16, {}).get("median_us", 0) / 1e3 or None,
        "1792-row floor, ms": limit.get(1792, {}).get("median_us", 0) / 1e3 or None,
    }, {
        "16": limit.get(16, {}).get("samples"),
        "1792": limit.get(1792, {}).get("samples"),
        "prefill passes": rf.get("prefill", {}).get("samples"),
        "decode passes": rf.get("decode", {}).get("samples"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("first")
    ap.add_argument("second")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    a = ap.parse_args()
    (f1, n1), (f2, _) = figures(a.first), figures(a.second)
    worst = 0.0
    rows = []
    for k in f1:
        x, y = f1[k], f2[k]
        if not x or not y:
            rows.append((k, x, y, None))
            continue
        r = y / x
        worst = max(worst, abs(r - 1))
        rows.append((k, x, y, r))
    fmt = lambda v: "-" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:.3f}")
    if a.markdown:
        print("| floor figure | run 1 | run 2 | run 2 / run 1 |")
        print("|---|---:|---:|---:|")
        for k, x, y, r in rows:
            print(f"| {k} | {fmt(x)} | {fmt(y)} | {'-' if r is None else f'{r:.3f}'} |")
    else:
        for k, x, y, r in rows:
            print(f"{k:26} {fmt(x):>10} {fmt(y):>10} {'-' if r is None else f'{r:.3f}':>7}")
    print(f"samples (run 1): {n1}; largest move {worst:.1%}")
    sys.exit(1 if worst > 0.10 else 0)


if __name__ == "__main__":
    main()
