#!/usr/bin/env python3
"""The machine-wide cache (strategy "shared") with N processes at once, in
two measurements:

    python3 scripts/shared_bench.py cold TABLE [--procs 4] [--rows 1792] [--runs 2] [--report OUT.json]
    python3 scripts/shared_bench.py warm TABLE [--procs 4] [--batches 50] [--repeat 5] [--shm-dir DIR] [--report OUT.json]

- cold: 1 process, then N, ask for the same cold batch of `--rows` random
  rows at once, each from an empty segment; each prints its gather time,
  then the segment's counters (`pleio cache stats`) say how many rows the
  device read. The table is read with O_DIRECT: the page cache does not
  matter.
- warm: `shared` against private row caches (`cached`), from Python and
  from Rust. Python: N processes each open the table (256 MiB budget),
  gather every batch once (the rows land in the cache: for `shared` in one
  segment for all, for `cached` in each process's own), wait for the
  others, then gather the same batches `--repeat` times into a
  preallocated raw output, timing each call; batches of 16 and 1792 random
  distinct rows. Rust: N `pleio bench --strategies cached,shared --cold
  none` at once (bench warms each arm's rows first; its `limit-warm` arm
  is the warm floor). Then 1 process alone, for the uncontended figure.
  With more processes than cores, each gather also waits for a core, for
  both strategies alike.

Needs the `pleio` Python package and the `pleio` CLI (`--pleio`, default
target/release/pleio). Segments go to a private directory under /dev/shm,
removed after."""

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reportmeta  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SIZES = (16, 1792)
BUDGET = 256 << 20


def in_processes(procs, target, args):
    """Starts `target(*args, go, out)` in `procs` processes, waits until all
    are ready (the first barrier), and returns what each put in `out`; they
    stay attached at the second barrier until `finish`."""
    go, out = mp.Barrier(procs + 1), mp.Queue()
    ps = [mp.Process(target=target, args=(*args, go, out)) for _ in range(procs)]
    for p in ps:
        p.start()
    go.wait()
    got = [out.get() for _ in range(procs)]
    return got, go, ps


def finish(go, ps):
    go.wait()
    for p in ps:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"a worker exited {p.exitcode}")


def cold_worker(path, ids, go, out):
    import pleio

    t = pleio.open(path, strategy="shared", budget=BUDGET)
    t.gather(np.array([0], dtype=np.int64))  # attach (row 0 is not in the batch)
    go.wait()
    t0 = time.perf_counter()
    t.gather(ids, dtype="raw")
    out.put(time.perf_counter() - t0)
    go.wait()


def warm_worker(path, strategy, batches, repeat, go, out):
    import pleio

    t = pleio.open(path, strategy=strategy, budget=BUDGET)
    buf = np.empty((max(SIZES), t.row_bytes), np.uint8)
    for ids in batches:
        t.gather(ids, out=buf[:len(ids)], dtype="raw")
    go.wait()
    times = {n: [] for n in SIZES}
    for _ in range(repeat):
        for ids in batches:
            t0 = time.perf_counter_ns()
            t.gather(ids, out=buf[:len(ids)], dtype="raw")
            times[len(ids)].append(time.perf_counter_ns() - t0)
    out.put(times)
    go.wait()


def pleio_cli(a, *args):
    return subprocess.run([a.pleio, *args], check=True, capture_output=True).stdout


def cold(a, rows):
    rng = np.random.default_rng(a.seed)
    ids = rng.choice(np.arange(1, rows), size=a.rows, replace=False).astype(np.int64)
    runs = []
    for k in range(1, a.runs + 1):
        for procs in (1, a.procs):
            pleio_cli(a, "cache", "rm")
            got, go, ps = in_processes(procs, cold_worker, (a.table, ids))
            times = sorted(t * 1e3 for t in got)
            st = json.loads(pleio_cli(a, "cache", "stats", "--json"))["segments"][0]
            finish(go, ps)
            runs.append({"run": k, "procs": procs, "times_ms": times, "reads": st["reads"],
                         "rows_read": st["misses"] - 1, "bytes_read": st["bytes_read"],
                         "waits": st["waits"], "uncached": st["uncached"]})
            print(f"{procs} process(es), {a.rows} cold rows: gather ms " + " ".join(f"{t:.2f}" for t in times)
                  + f"; device reads {st['reads']}, rows read {st['misses'] - 1} (+1 attach row), "
                  f"bytes {st['bytes_read']}, waits {st['waits']}, uncached {st['uncached']}")
    return {"rows": a.rows, "runs": runs}


def warm_rust(a, procs):
    with tempfile.TemporaryDirectory() as d:
        cmds = [[a.pleio, "bench", a.table, "--strategies", "cached,shared", "--rows", ",".join(map(str, SIZES)),
                 "--batches", str(a.batches * a.repeat), "--cold", "none", "--dtype", "raw", "--budget", "256M",
                 "--seed", str(k + 1), "--json", f"{d}/{k}.json"] for k in range(procs)]
        ps = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in cmds]
        for p in ps:
            _, err = p.communicate()
            if p.returncode != 0:
                raise SystemExit(f"pleio bench exited {p.returncode}: {err.decode()[-800:]}")
        reps = [json.loads(Path(f"{d}/{k}.json").read_text()) for k in range(procs)]
    out = {}
    for arm in ("limit-warm", "cached", "shared"):
        for n in SIZES:
            x = [r for rep in reps for r in rep["arms"] if r["strategy"] == arm and r["rows"] == n and not r.get("cold")]
            if x:
                out.setdefault(arm, {})[n] = {"median_us": float(np.median([r["median_us"] for r in x])),
                                              "min_us": min(r["min_us"] for r in x), "processes": len(x)}
    return out


def summary(ns):
    ns = np.asarray(ns, dtype=np.float64) / 1e3
    return {"median_us": float(np.median(ns)), "min_us": float(ns.min()), "p99_us": float(np.percentile(ns, 99)),
            "gathers": len(ns)}


def warm(a, rows):
    rng = np.random.default_rng(a.seed)
    batches = [rng.choice(rows, size=s, replace=False).astype(np.int64) for s in SIZES for _ in range(a.batches)]
    runs = []
    for procs in (1, a.procs):
        run = {"procs": procs, "python": {}, "rust": warm_rust(a, procs)}
        for strategy in ("cached", "shared"):
            got, go, ps = in_processes(procs, warm_worker, (a.table, strategy, batches, a.repeat))
            finish(go, ps)
            run["python"][strategy] = {n: summary([x for g in got for x in g[n]]) for n in SIZES}
        runs.append(run)
        for door in ("python", "rust"):
            for n in SIZES:
                c, s = run[door]["cached"][n], run[door]["shared"][n]
                print(f"{procs} process(es), {door:6}, {n:5} rows: cached {c['median_us']:8.1f} us, "
                      f"shared {s['median_us']:8.1f} us ({s['median_us'] / c['median_us']:.2f}x), "
                      f"min {c['min_us']:.1f} / {s['min_us']:.1f} us")
    return {"sizes": list(SIZES), "batches": a.batches, "repeat": a.repeat, "runs": runs}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("table")
    common.add_argument("--procs", type=int, default=4)
    common.add_argument("--seed", type=int, default=1)
    common.add_argument("--pleio", default=str(ROOT / "target" / "release" / "pleio"))
    common.add_argument("--report", help="also write the figures, stamped, as JSON here")
    common.add_argument("--shm-dir", default="/dev/shm",
                        help="where the run's private segment directory goes (default /dev/shm; a tmpfs "
                             "mounted huge=within_size gives the segment huge pages)")
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("cold", parents=[common], help="N processes gather one cold batch at once")
    c.add_argument("--rows", type=int, default=1792)
    c.add_argument("--runs", type=int, default=1, help="runs of (1 process, then --procs)")
    w = sub.add_parser("warm", parents=[common], help="warm hits: shared against cached, Python and Rust")
    w.add_argument("--batches", type=int, default=50, help="batches of each size (default 50)")
    w.add_argument("--repeat", type=int, default=5, help="timed passes over them (default 5)")
    a = ap.parse_args()
    a.pleio = os.path.abspath(a.pleio)
    state = reportmeta.start()
    shm = tempfile.mkdtemp(prefix="pleio-bench-", dir=a.shm_dir)
    os.environ["PLEIO_SHM_DIR"] = shm
    # cold: segments outlive their last handle, for `pleio cache stats`.
    os.environ.pop("PLEIO_SHARED_KEEP", None)
    if a.what == "cold":
        os.environ["PLEIO_SHARED_KEEP"] = "1"
    try:
        import pleio

        rows = pleio.open(a.table).rows
        figures = (cold if a.what == "cold" else warm)(a, rows)
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    if a.report:
        rep = {"schema": "pleio-script-report/1", **reportmeta.stamp(state), "table": a.table, **figures}
        Path(a.report).write_text(json.dumps(rep, indent=1) + "\n")


if __name__ == "__main__":
    main()
