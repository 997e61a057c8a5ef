#!/usr/bin/env python3
"""Summarises a scripts/cache_targets.sh run: the issue 13 targets, met or not.

    python3 scripts/cache_targets_summary.py OUTDIR
"""
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])


def load(name):
    p = out / name
    return json.loads(p.read_text()) if p.exists() and p.stat().st_size else None


rows = []
cold = {}
for p in sorted(out.glob("cold-*.json")):
    j = load(p.name)
    if j:
        r = j["replays"][0]
        cold[r["strategy"]] = r["prefill"]["tokens_per_s"]
print("uncapped cold corpus prefill, tokens/s:")
for s, t in sorted(cold.items(), key=lambda x: -x[1]):
    print(f"  {s:13} {t:8.0f}")
best = max((t, s) for s, t in cold.items() if s != "cached") if cold else None

cap = load("capped-cached.json")
if cap:
    run = cap["mem_cap"]["runs"][0]
    reps = cap["replays"]
    p1 = reps[0]["prefill"]["tokens_per_s"]
    p2 = reps[1]["prefill"]["tokens_per_s"] if len(reps) > 1 else None
    peak = run["peak_bytes"]
    print(f"capped cached (--mem-cap 320M --budget 256M): {run['outcome']}, peak {peak / 2**20:.1f} MiB, "
          f"{run['limit_hits']} limit hits")
    print(f"  pass 1 (cold) prefill {p1:.0f} tokens/s, pass 2 {p2:.0f} tokens/s: {p2 / p1:.2f}x")
    print(f"  target peak <= 320 MiB, 0 limit hits: {'met' if peak <= 320 * 2**20 and run['limit_hits'] == 0 else 'missed'}")
    print(f"  target pass 2 >= 2x pass 1: {'met' if p2 >= 2 * p1 else 'missed'}")
    if best:
        print(f"  target cold >= 0.9x best uncapped ({best[1]} {best[0]:.0f}): {p1 / best[0]:.2f}x, "
              f"{'met' if p1 >= 0.9 * best[0] else 'missed'}")

warm = {}
for s in ["fault", "auto"]:
    j = load(f"passes-{s}.json")
    if j:
        warm[s] = [r["prefill"]["tokens_per_s"] for r in j["replays"]]
if len(warm) == 2:
    f2, a2 = warm["fault"][1], warm["auto"][1]
    print(f"first warm pass after a cold one: fault {f2:.0f}, auto {a2:.0f} tokens/s: auto/fault {a2 / f2:.2f}x, "
          f"{'met' if a2 >= 0.9 * f2 else 'missed'} (target >= 0.9x)")
    print(f"  (cold passes: fault {warm['fault'][0]:.0f}, auto {warm['auto'][0]:.0f} tokens/s)")

b = load("bench-1792.json")
if b:
    arms = {a["strategy"]: a for a in b["arms"] if a["cold"] and a["rows"] == 1792}
    auto, adv, lim = arms["auto"]["mean_us"], arms["advise"]["mean_us"], arms["limit"]["mean_us"]
    print(f"cold 1792 rows (mean us): auto {auto:.0f}, advise {adv:.0f}, limit {lim:.0f}, fault {arms['fault']['mean_us']:.0f}")
    print(f"  auto/advise {auto / adv:.2f} ({'met' if auto <= adv else 'missed'}, target <= 1.0), "
          f"auto/limit {auto / lim:.2f} ({'met' if auto <= 1.15 * lim else 'missed'}, target <= 1.15)")
    med = {s: a["median_us"] for s, a in arms.items()}
    print(f"  medians: auto/advise {med['auto'] / med['advise']:.2f}, auto/limit {med['auto'] / med['limit']:.2f}")
