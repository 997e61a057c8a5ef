"""Cold gathers through the machine-wide cache (strategy "shared"): N
processes ask for the same cold batch at once; each prints its gather time,
then the segment's counters say how many rows the device read.

    python3 scripts/shared_cold.py TABLE.gguf [--procs 4] [--rows 1792] [--runs 2] [--report OUT.json]

Needs the `pleio` Python package (or PYTHONPATH at a built one) and the
`pleio` CLI on PATH (for `pleio cache rm/stats`). Removes every segment in
$PLEIO_SHM_DIR (default /dev/shm) first, so each run starts cold; the table
is read with O_DIRECT, so the page cache does not matter."""

import argparse, json, multiprocessing as mp, os, subprocess, sys, time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reportmeta  # noqa: E402


def worker(path, ids, go, out):
    import pleio

    t = pleio.open(path, strategy="shared", budget=256 << 20)
    t.gather(np.array([0], dtype=np.int64))  # attach (row 0 is not in the batch)
    go.wait()
    t0 = time.perf_counter()
    t.gather(ids, dtype="raw")
    out.put(time.perf_counter() - t0)
    go.wait()  # stay attached until every process has gathered


def run(path, procs, ids):
    subprocess.run(["pleio", "cache", "rm"], check=True, capture_output=True)
    go, out = mp.Barrier(procs + 1), mp.Queue()
    ps = [mp.Process(target=worker, args=(path, ids, go, out)) for _ in range(procs)]
    for p in ps:
        p.start()
    go.wait()
    times = sorted(out.get() * 1e3 for _ in range(procs))
    stats = json.loads(
        subprocess.run(["pleio", "cache", "stats", "--json"], check=True, capture_output=True).stdout
    )["segments"][0]
    go.wait()
    for p in ps:
        p.join()
    return times, stats


def main():
    a = argparse.ArgumentParser()
    a.add_argument("table")
    a.add_argument("--procs", type=int, default=4)
    a.add_argument("--rows", type=int, default=1792)
    a.add_argument("--seed", type=int, default=1)
    a.add_argument("--runs", type=int, default=1, help="runs of (1 process, then --procs)")
    a.add_argument("--report", help="also write the figures, stamped, as JSON here")
    args = a.parse_args()
    state = reportmeta.start()
    os.environ["PLEIO_SHARED_KEEP"] = "1"
    import pleio

    n = pleio.open(args.table).rows
    rng = np.random.default_rng(args.seed)
    ids = rng.choice(np.arange(1, n), size=args.rows, replace=False).astype(np.int64)
    runs = []
    for k in range(1, args.runs + 1):
        for procs in (1, args.procs):
            times, st = run(args.table, procs, ids)
            runs.append({"run": k, "procs": procs, "times_ms": times, "reads": st["reads"],
                         "rows_read": st["misses"] - 1, "bytes_read": st["bytes_read"],
                         "waits": st["waits"], "uncached": st["uncached"]})
            print(
                f"{procs} process(es), {args.rows} cold rows: gather ms "
                + " ".join(f"{t:.2f}" for t in times)
                + f"; device reads {st['reads']}, rows read {st['misses'] - 1}"
                + f" (+1 attach row), bytes {st['bytes_read']}, waits {st['waits']}, uncached {st['uncached']}"
            )
    if args.report:
        rep = {"schema": "pleio-script-report/1", **reportmeta.stamp(state),
               "table": args.table, "rows": args.rows, "runs": runs}
        Path(args.report).write_text(json.dumps(rep, indent=1) + "\n")


if __name__ == "__main__":
    main()
