#!/usr/bin/env python3
"""Summarises a scripts/cache_targets.sh run: the issue 13 targets, met or not.

    python3 scripts/cache_targets_summary.py OUTDIR           # the Markdown table
    python3 scripts/cache_targets_summary.py OUTDIR --json    # the figures it uses, as JSON

The JSON (every figure the table shows, and each step's `run` stamp: its
command line, commit and load average) is what docs/reports/cache-targets.json
keeps, made by

    python3 scripts/reportmeta.py --out docs/reports/cache-targets.json -- \\
      sh -c 'scripts/cache_targets.sh PLEIO TABLE TOKENS OUT >&2 && python3 scripts/cache_targets_summary.py OUT --json'

and `scripts/docs_gen.py cache-targets REPORT` renders it with `table` below.
"""
import json
import sys
from pathlib import Path


def summary(out):
    """The figures of the targets, from the reports in OUTDIR."""

    def load(name):
        p = out / name
        return json.loads(p.read_text()) if p.exists() and p.stat().st_size else None

    s = {"cold_tokens_per_s": {}, "steps": {}}
    for p in sorted(out.glob("cold-*.json")):
        j = load(p.name)
        if j:
            r = j["replays"][0]
            s["cold_tokens_per_s"][r["strategy"]] = r["prefill"]["tokens_per_s"]
            s["steps"][p.stem] = j.get("run")
    cap = load("capped-cached.json")
    if cap:
        run, reps = cap["mem_cap"]["runs"][0], cap["replays"]
        s["capped"] = {"outcome": run["outcome"], "peak_bytes": run["peak_bytes"],
                       "limit_hits": run["limit_hits"],
                       "passes_tokens_per_s": [r["prefill"]["tokens_per_s"] for r in reps]}
        s["steps"]["capped-cached"] = cap.get("run")
    for st in ["fault", "auto"]:
        j = load(f"passes-{st}.json")
        if j:
            s.setdefault("warm_passes", {})[st] = [r["prefill"]["tokens_per_s"] for r in j["replays"]]
            s["steps"][f"passes-{st}"] = j.get("run")
    b = load("bench-1792.json")
    if b:
        s["bench_1792"] = {a["strategy"]: {"mean_us": a["mean_us"], "median_us": a["median_us"]}
                           for a in b["arms"] if a["cold"] and a["rows"] == 1792}
        s["steps"]["bench-1792"] = b.get("run")
    return s


def tps(x):
    return f"{x:,.0f}"


def table(s):
    """The Markdown table of the targets."""
    met = lambda ok: "met" if ok else "missed"
    cold = s["cold_tokens_per_s"]
    out = ["| target | measured | |", "|---|---|---|"]
    cap = s.get("capped")
    if cap:
        p1, p2 = cap["passes_tokens_per_s"][:2]
        peak = cap["peak_bytes"]
        out.append(f"| `cached --budget 256M` under `--mem-cap 320M`: finishes, peak charged memory "
                   f"<= 320 MiB, zero limit hits | {cap['outcome']}, peak {peak / 2**20:.1f} MiB, "
                   f"{cap['limit_hits']} limit hits | {met(peak <= 320 * 2**20 and cap['limit_hits'] == 0)} |")
        out.append(f"| its second pass >= 2x its first | {tps(p1)} then {tps(p2)} prefill tokens/s: "
                   f"{p2 / p1:.1f}x | {met(p2 >= 2 * p1)} |")
        best_t, best_s = max((t, st) for st, t in cold.items() if st != "cached")
        others = ", ".join(f"`{st}` {tps(t)}" for st, t in sorted(cold.items(), key=lambda x: -x[1]))
        out.append(f"| its cold prefill >= 0.9x the best uncapped strategy of the run | {tps(p1)} "
                   f"against `{best_s}`'s {tps(best_t)} tokens/s (uncapped cold: {others}): "
                   f"{p1 / best_t:.2f}x | {met(p1 >= 0.9 * best_t)} |")
    w = s.get("warm_passes")
    if w:
        f2, a2 = w["fault"][1], w["auto"][1]
        out.append(f"| `auto`'s first warm pass after a cold one >= 0.9x `fault`'s | {tps(a2)} against "
                   f"{tps(f2)} tokens/s: {a2 / f2:.3f}x | {met(a2 >= 0.9 * f2)} |")
    b = s.get("bench_1792")
    if b:
        auto, adv, lim = b["auto"], b["advise"], b["limit"]
        r = auto["mean_us"] / adv["mean_us"]
        out.append(f"| cold 1792 rows, `auto`/`advise` <= 1.0 | mean {auto['mean_us'] / 1e3:.2f} against "
                   f"{adv['mean_us'] / 1e3:.2f} ms: {r:.3f} (medians "
                   f"{auto['median_us'] / adv['median_us']:.2f}) | {met(r <= 1.0)} |")
        r = auto["mean_us"] / lim["median_us"]
        out.append(f"| cold 1792 rows, `auto`/`limit` <= 1.15 | mean {auto['mean_us'] / 1e3:.2f} against "
                   f"the floor's median {lim['median_us'] / 1e3:.2f} ms: {r:.2f} (medians "
                   f"{auto['median_us'] / lim['median_us']:.2f}) | {met(r <= 1.15)} |")
    return "\n".join(out)


def main():
    args = sys.argv[1:]
    if not args or args[1:] not in ([], ["--json"]):
        sys.exit(__doc__)
    s = summary(Path(args[0]))
    print(json.dumps(s, indent=1) if args[1:] else table(s))


if __name__ == "__main__":
    main()
