#!/usr/bin/env python3
"""The replay table of docs/benchmarks.md: the bundled corpus through every strategy,
cold (with the device floor of the same ubatches) and then warm.

    python3 scripts/replay_table.py --pleio target/release/pleio big.gguf

For each strategy, in one process each: `pleio replay TABLE --corpus --cold
--strategy S --json` (the table evicted before the prefill and again before
decode; the report carries the floor of the same ubatches, `floor_ms`,
`floor_tokens_per_s` and `ratio_to_floor`), then the same twice without
`--cold`, the second measured (warm: the first brought the stream's rows
into the page cache; `uring-direct` never fills it, so its warm run reads
the device again). Prints a Markdown table of what the
reports say; `--json-dir D` keeps every report, `--report OUT` one small
report of them all (each replay's figures without per-ubatch lists, with
the command line, commit, machine and load average: what
`scripts/docs_gen.py replay OUT` renders as this same table). Every
figure comes from a report; the script only formats them and checks that
every strategy gathered the same floats (equal checksums), failing
otherwise.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import reportmeta

STRATEGIES = "fault,advise,pread,uring,uring-direct,pool,auto"


def replay(pleio, table, strategy, cold, extra):
    cmd = [pleio, "replay", table, "--corpus", "--strategy", strategy, "--json"] + extra
    if cold:
        cmd.append("--cold")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAILED: {' '.join(cmd)}\n{r.stderr}")
    return json.loads(r.stdout)


def mib(b):
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"


def slim(x):
    """A replay report without its per-ubatch lists (more than 16 items)."""
    if isinstance(x, dict):
        return {k: slim(v) for k, v in x.items() if not (isinstance(v, list) and len(v) > 16)}
    if isinstance(x, list):
        return [slim(v) for v in x]
    return x


def render(rep):
    """The table, from `--report`'s report."""
    runs = rep["runs"]
    c0 = runs[0]["cold"]
    p, fl = c0["prefill"], c0["prefill"]["floor"]
    out = [f"{p['tokens']:,} corpus tokens in {p['steps']} ubatches of {c0['ubatch']}, then "
           f"{c0['decode']['steps']} decode steps; prefill floor: {fl['extents']:,} extents, "
           f"{mib(fl['bytes'])}, queue depth {fl['queue_depth']}, median of {fl['samples']} passes "
           f"{p['floor_ms']:.0f} ms = {p['floor_tokens_per_s']:,.0f} tokens/s (each strategy's run "
           "measures its own floor; the columns show each run's).", "",
           "| strategy | prefill tokens/s, cold | floor tokens/s | cold time / floor | "
           "ubatch p50 / p99 ms, cold | read, cold | prefill tokens/s, warm | "
           "decode tokens/s, cold / warm | decode cold / floor |",
           "|---|---:|---:|---:|---|---:|---:|---|---:|"]
    for r in runs:
        c, w = r["cold"], r["warm"]
        p, d = c["prefill"], c["decode"]
        lat = p["latency_ms"]
        out.append(f"| {r['strategy']} | {p['tokens_per_s']:,.0f} | {p['floor_tokens_per_s']:,.0f} | "
                   f"{p['ratio_to_floor']:.2f}x | {lat['p50']:.1f} / {lat['p99']:.1f} | "
                   f"{mib(c['read_bytes'])} | {w['prefill']['tokens_per_s']:,.0f} | "
                   f"{d['tokens_per_s']:,.0f} / {w['decode']['tokens_per_s']:,.0f} | "
                   f"{d['ratio_to_floor']:.2f}x |")
    out += ["", f"checksum of every strategy's floats: {rep['checksum']}"]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("table")
    ap.add_argument("--pleio", default="target/release/pleio")
    ap.add_argument("--strategies", default=STRATEGIES)
    ap.add_argument("--json-dir", type=Path)
    ap.add_argument("--report", type=Path, help="write one small report of every run here")
    ap.add_argument("extra", nargs="*", help="more replay options, after --")
    args = ap.parse_args()
    state = reportmeta.start()

    runs, sums = [], set()
    for s in args.strategies.split(","):
        print(f"replay {s}: cold, then warm", file=sys.stderr)
        cold = replay(args.pleio, args.table, s, True, args.extra)
        # the cold run evicts the prefill's rows again before its decode:
        # one run without --cold brings them back, the next is measured
        replay(args.pleio, args.table, s, False, args.extra)
        warm = replay(args.pleio, args.table, s, False, args.extra)
        if args.json_dir:
            args.json_dir.mkdir(parents=True, exist_ok=True)
            (args.json_dir / f"replay-{s}-cold.json").write_text(json.dumps(cold, indent=1))
            (args.json_dir / f"replay-{s}-warm.json").write_text(json.dumps(warm, indent=1))
        c, w = cold["replays"][0], warm["replays"][0]
        sums.update([c["checksum"], w["checksum"]])
        runs.append({"strategy": s, "cold": slim(c), "warm": slim(w)})

    if len(sums) != 1:
        sys.exit(f"strategies gathered different floats: checksums {sorted(sums)}")
    rep = {"schema": "pleio-script-report/1", **reportmeta.stamp(state),
           "table": cold["table"], "runs": runs, "checksum": sums.pop()}
    if args.report:
        args.report.write_text(json.dumps(rep, indent=1) + "\n")
    print(render(rep))


if __name__ == "__main__":
    main()
