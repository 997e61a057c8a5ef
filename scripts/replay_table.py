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
reports say; `--json-dir D` keeps every report. Every figure comes from a
report; the script only formats them and checks that every strategy
gathered the same floats (equal checksums), failing otherwise.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("table")
    ap.add_argument("--pleio", default="target/release/pleio")
    ap.add_argument("--strategies", default=STRATEGIES)
    ap.add_argument("--json-dir", type=Path)
    ap.add_argument("extra", nargs="*", help="more replay options, after --")
    args = ap.parse_args()

    rows, sums = [], set()
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
        rows.append((s, c, w))

    if len(sums) != 1:
        sys.exit(f"strategies gathered different floats: checksums {sorted(sums)}")
    c0 = rows[0][1]
    p, fl = c0["prefill"], c0["prefill"]["floor"]
    print(f"{p['tokens']:,} corpus tokens in {p['steps']} ubatches of {c0['ubatch']}, then "
          f"{c0['decode']['steps']} decode steps; prefill floor: {fl['extents']:,} extents, "
          f"{mib(fl['bytes'])}, queue depth {fl['queue_depth']}, median of {fl['samples']} passes "
          f"{p['floor_ms']:.0f} ms = {p['floor_tokens_per_s']:,.0f} tokens/s (each strategy's run "
          "measures its own floor; the columns show each run's).\n")
    print("| strategy | prefill tokens/s, cold | floor tokens/s | cold time / floor | "
          "ubatch p50 / p99 ms, cold | read, cold | prefill tokens/s, warm | "
          "decode tokens/s, cold / warm | decode cold / floor |")
    print("|---|---:|---:|---:|---|---:|---:|---|---:|")
    for s, c, w in rows:
        p, d = c["prefill"], c["decode"]
        lat = p["latency_ms"]
        print(f"| {s} | {p['tokens_per_s']:,.0f} | {p['floor_tokens_per_s']:,.0f} | "
              f"{p['ratio_to_floor']:.2f}x | {lat['p50']:.1f} / {lat['p99']:.1f} | "
              f"{mib(c['read_bytes'])} | {w['prefill']['tokens_per_s']:,.0f} | "
              f"{d['tokens_per_s']:,.0f} / {w['decode']['tokens_per_s']:,.0f} | "
              f"{d['ratio_to_floor']:.2f}x |")
    print(f"\nchecksum of every strategy's floats: {sums.pop()}")


if __name__ == "__main__":
    main()
