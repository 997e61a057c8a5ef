#!/usr/bin/env python3
"""The floor's stability: `pleio demo` run several times in a row.

    python3 scripts/demo_floors.py --pleio target/release/pleio --runs 8 \\
        --report docs/reports/demo-floors.json [-- DEMO OPTIONS...]

Runs `pleio demo --json` RUNS times back to back (each run's options after
`--`, e.g. `--dir D`), keeps from each report its floors (the corpus
prefill and decode floor in tokens/s, the median 16- and 1792-row floor),
the queue depth the sweep chose, the noisy flag, every strategy's cold
prefill tokens/s and the run's `run` stamp, and writes them with this
script's own stamp (scripts/reportmeta.py) to the report. Prints the two
tables `scripts/docs_gen.py demo-floors REPORT` renders: the floors per
run, and each pair of runs' ratios (run 2 over 1, 4 over 3, ...).
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import reportmeta


def one(pleio, extra, path):
    cmd = [pleio, "demo", "--json", str(path)] + extra
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL)
    if r.returncode != 0:
        sys.exit(f"FAILED: {' '.join(cmd)}")
    j = json.loads(path.read_text())
    limit = {a["rows"]: a["median_us"] / 1e3 for a in j["arms"] if a["strategy"] == "limit" and a["cold"]}
    rf = j["replay_floor"]
    return {
        "prefill_floor_tokens_per_s": rf["prefill_tokens_per_s"],
        "decode_floor_tokens_per_s": rf["decode_tokens_per_s"],
        "floor_16_ms": limit.get(16),
        "floor_1792_ms": limit.get(1792),
        "queue_depth": j["floor"]["queue_depth"],
        "noisy": j["noisy"],
        "cold_prefill_tokens_per_s": {r["strategy"]: r["prefill_tokens_per_s"] for r in j["replays"] if r["cold"]},
        "run": j["run"],
    }


COLS = [("prefill floor, tokens/s", "prefill_floor_tokens_per_s", "{:,.0f}"),
        ("decode floor, tokens/s", "decode_floor_tokens_per_s", "{:,.0f}"),
        ("16-row floor, ms", "floor_16_ms", "{:.3f}"),
        ("1792-row floor, ms", "floor_1792_ms", "{:.2f}")]


def render(rep):
    runs = rep["runs"]
    out = ["| run | " + " | ".join(c[0] for c in COLS) + " | QD | load at start | noisy |",
           "|---|" + "---:|" * len(COLS) + "---:|---:|---|"]
    for i, r in enumerate(runs, 1):
        load = r["run"].get("load_start") or ["?"]
        out.append(f"| {i} | " + " | ".join(f.format(r[k]) for _, k, f in COLS)
                   + f" | {r['queue_depth']} | {load[0]} | {'yes' if r['noisy'] else 'no'} |")
    out += ["", "Each pair of runs, the second over the first:", "",
            "| pair | prefill | decode | 16 rows | 1792 rows |", "|---|---:|---:|---:|---:|"]
    for i in range(0, len(runs) - 1, 2):
        a, b = runs[i], runs[i + 1]
        out.append(f"| {i + 1}-{i + 2} | " + " | ".join(f"{b[k] / a[k]:.3f}" for _, k, _ in COLS) + " |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pleio", default="target/release/pleio")
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--report", type=Path, required=True)
    ap.add_argument("extra", nargs="*", help="demo options, after --")
    args = ap.parse_args()
    state = reportmeta.start()
    runs = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.runs):
            print(f"demo run {i + 1} of {args.runs}", file=sys.stderr)
            runs.append(one(args.pleio, args.extra, Path(d) / f"demo{i}.json"))
    rep = {"schema": "pleio-script-report/1", **reportmeta.stamp(state), "runs": runs}
    args.report.write_text(json.dumps(rep, indent=1) + "\n")
    print(render(rep))


if __name__ == "__main__":
    main()
