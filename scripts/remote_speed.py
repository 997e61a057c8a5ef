#!/usr/bin/env python3
"""A table in Redis, timed on loopback: one redis-server and a 3-master
Redis Cluster (started here, stopped by pid). Prints one JSON line per
run (docs/remote.md's tables, through scripts/reportmeta.py).

publish: how fast `pleio publish` uploads a table against `--in-flight N`,
the servers emptied (FLUSHALL) before each upload; and publishing the same
table again, when every bucket is there and only the resume check runs
(STRLEN of each bucket, spread over the N workers):

    python3 scripts/reportmeta.py --out docs/reports/publish-speed.json -- \\
        python3 scripts/remote_speed.py publish --pleio target/release/pleio \\
        --table ~/.cache/pleio/rivals/fp8-8M

gather: random batches of raw rows from the published table (the
`remote_gather` example of pleio-benches: medians and p90 per batch size),
with the servers' heap on 4 KiB pages and on transparent huge pages
(jemalloc's `thp:always` and Redis's `disable-thp no`); batches back to
back, 1792 rows after --pause-ms of idle before each batch, and the same
with lookahead (`--lookahead`: each batch was queued to the background
worker when the one before was taken, as llama.cpp's provider does; the
time is the caller's: taking the batch, then queueing the next; and the
handover alone):

    python3 scripts/reportmeta.py --out docs/reports/remote-gather.json -- \\
        python3 scripts/remote_speed.py gather --pleio target/release/pleio \\
        --table ~/.cache/pleio/rivals/fp8-8M

bench: `pleio bench TABLE --redis URL` against a 3-master cluster on huge
pages (the fastest setup above): the file's strategies and the table in
Redis, straight (`redis`) and behind the machine-wide cache
(`redis-shared`), on the same row lists in one run, every output checked
bit for bit. The report is pleio's own, its command this one:

    python3 scripts/remote_speed.py bench --pleio target/release/pleio \\
        --table ~/.cache/pleio/rivals/fp8-8M --json docs/reports/bench-redis.json

Without --table a synthetic IQ4_NL table of --rows rows is used (`pleio
synth`). Runs are sequential; for publish the fastest of --repeat runs is
kept (the machine's other work only ever slows a run down).
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from redis_servers import Servers, synth_table


def publish(pleio, table, url, in_flight):
    t0 = time.perf_counter()
    out = subprocess.run([pleio, "publish", str(table), url, "--in-flight", str(in_flight), "--json"],
                         check=True, capture_output=True, text=True).stdout
    return time.perf_counter() - t0, json.loads(out)["published"]


def the_table(a, d):
    if a.table:
        return Path(os.path.expanduser(a.table))
    return synth_table(a.pleio, a.rows, Path(d) / "q.gguf")


TARGETS = (("one server", 1), ("3-master cluster", 3))


@contextlib.contextmanager
def published(a, table, n, d, thp):
    """`n` servers (a cluster when n > 1) in `d` with `table` published as
    `t` (4 uploads in flight): yields the servers and the table's URL, and
    stops the servers by pid on the way out."""
    servers = Servers(n, d, thp=thp)
    try:
        url = servers.url("t")
        publish(a.pleio, table, url, 4)
        yield servers, url
    finally:
        servers.stop()


def publish_runs(a, d):
    table = the_table(a, d)
    for target, n in TARGETS:
        servers = Servers(n, Path(d) / f"p{n}")
        try:
            url = servers.url("t")
            for k in [int(x) for x in a.in_flight.split(",")]:
                fresh, again = [], []
                for _ in range(a.repeat):
                    servers.flush()
                    s, pub = publish(a.pleio, table, url, k)
                    if pub["uploaded"] != pub["buckets"]:
                        raise SystemExit(f"remote_speed: {pub['uploaded']} of {pub['buckets']} uploaded")
                    fresh.append(s)
                    s, pub2 = publish(a.pleio, table, url, k)
                    if pub2["uploaded"] != 0:
                        raise SystemExit(f"remote_speed: publishing again uploaded {pub2['uploaded']}")
                    again.append(s)
                print(json.dumps({
                    "target": target, "in_flight": k, "buckets": pub["buckets"],
                    "table_bytes": pub["table_bytes"], "publish_s": min(fresh), "publish_runs_s": fresh,
                    "mb_per_s": pub["table_bytes"] / min(fresh) / 1e6,
                    "again_s": min(again), "again_runs_s": again,
                }), flush=True)
        finally:
            servers.stop()


def gather_runs(a, d):
    table = the_table(a, d)
    example = subprocess.run(["cargo", "build", "--release", "-q", "-p", "pleio-benches", "--example",
                              "remote_gather", "--message-format", "json"], check=True, capture_output=True,
                             text=True).stdout
    exe_path = next(json.loads(l)["executable"] for l in example.splitlines()
                    if '"executable":"' in l and "remote_gather" in l)
    for target, n in TARGETS:
        for thp in (False, True):
            with published(a, table, n, Path(d) / f"g{n}{'h' if thp else ''}", thp) as (servers, url):
                # Back to back, then 1792 rows with a pause before each
                # batch (an engine's decode steps come tens of ms apart).
                # Last, the paused batches again with lookahead.
                for rows, pause, ahead in ((16, 0, False), (1792, 0, False), (1792, a.pause_ms, False),
                                           (1792, a.pause_ms, True)):
                    batches = a.batches if pause == 0 else min(a.batches, 100)
                    got = json.loads(subprocess.run([exe_path, url, str(rows), str(batches), "--pause-ms", str(pause),
                                                     "--json"] + (["--lookahead"] if ahead else []),
                                                    check=True, capture_output=True, text=True).stdout)
                    huge = sum(int(l.split()[1]) for p in servers.procs
                               for l in open(f"/proc/{p.pid}/smaps_rollup") if l.startswith("AnonHugePages:"))
                    print(json.dumps({"target": target, "thp": thp, "rows": rows, "batches": batches,
                                      "pause_ms": pause, "lookahead": ahead, "median_us": got["median_us"],
                                      "p90_us": got["p90_us"], "take_median_us": got.get("take_median_us"),
                                      "anon_huge_kib": huge}), flush=True)


def bench_run(a, d):
    if not a.json:
        raise SystemExit("remote_speed.py bench: --json OUT is required (the report)")
    table = the_table(a, d)
    out = Path(a.json).resolve()
    with published(a, table, 3, Path(d) / "b3h", True) as (_, url):
        subprocess.run([a.pleio, "bench", str(table), "--redis", url, "--rows", "16,1792",
                        "--batches", str(a.bench_batches), "--strategies", a.strategies, "--dtype", "raw",
                        "--json", str(out), "--force"], check=True)
    rep = json.loads(out.read_text())
    # The footer names the command that reproduces the run (this one), not
    # pleio's own, whose address was a port picked here.
    rep["run"]["argv"] = ["scripts/remote_speed.py"] + sys.argv[1:]
    rep["redis_setup"] = "a 3-master Redis Cluster on loopback, heap on transparent huge pages"
    out.write_text(json.dumps(rep, indent=2) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["publish", "gather", "bench"])
    ap.add_argument("--pleio", default="target/release/pleio")
    ap.add_argument("--table", help="the table to publish (default: a synthetic IQ4_NL table)")
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--in-flight", default="1,2,4,8,16", help="publish: the --in-flight values")
    ap.add_argument("--repeat", type=int, default=2, help="publish: runs per value")
    ap.add_argument("--batches", type=int, default=300, help="gather: batches per size")
    ap.add_argument("--pause-ms", type=int, default=50,
                    help="gather: the idle time before each batch of the paused 1792-row run (at most 100 batches)")
    ap.add_argument("--bench-batches", type=int, default=30, help="bench: row lists per size")
    ap.add_argument("--strategies", default="fault,auto,shared", help="bench: the file's strategies")
    ap.add_argument("--json", help="bench: where pleio bench writes its report")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        {"publish": publish_runs, "gather": gather_runs, "bench": bench_run}[a.what](a, d)

if __name__ == "__main__":
    main()
