#!/usr/bin/env python3
"""Warm gathers from Python, issue 24's "warm 1792 raw FP8 rows from
Python" figure: for each strategy, 16 lists of 1792 distinct random ids
gathered twice first (so their rows are resident, and in `cached`'s
cache), then 200 timed `t.gather(ids, dtype="raw")` calls, with `out=` a
preallocated array and without (a new array each call). Prints the
median per call. It measures, it does not test; run it on an idle
machine with the Python that has the package installed:

    ~/.cache/pleio/torch-venv/bin/python scripts/py_warm.py TABLE [--rows 1792] [--strategies auto,fault,cached]
"""

import argparse
import statistics
import time

import numpy as np
import pleio


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("table", help="a GGUF file or checkpoint directory")
    ap.add_argument("--rows", type=int, default=1792, help="ids per call (default 1792)")
    ap.add_argument("--strategies", default="auto,fault,cached", help="strategies, comma-separated")
    a = ap.parse_args()
    rng = np.random.default_rng(7)
    for strategy in a.strategies.split(","):
        t = pleio.open(a.table, strategy=strategy)
        lists = [rng.choice(t.rows, a.rows, replace=False).astype(np.int64) for _ in range(16)]
        buf = np.empty((a.rows, t.row_bytes), dtype=np.uint8)
        for ids in lists + lists:
            t.gather(ids, out=buf, dtype="raw")
        for mode in ("out=", "new array"):
            times = []
            for r in range(200):
                ids = lists[r % len(lists)]
                s = time.perf_counter()
                if mode == "out=":
                    t.gather(ids, out=buf, dtype="raw")
                else:
                    t.gather(ids, dtype="raw")
                times.append(time.perf_counter() - s)
            print(f"{strategy:8s} {mode:10s} {a.rows} rows: median {statistics.median(times) * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
