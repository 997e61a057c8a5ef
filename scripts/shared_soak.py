#!/usr/bin/env python3
"""Soak of the machine-wide shared cache (strategy "shared") from three
doors at once, with chaos. Run by .ci/run (60 s) in the Python package's
venv; longer by hand:

    python scripts/shared_soak.py --pleio target/release/pleio [--seconds 60] [--rust 3 --python 3 --c 2]

Clients, all on one table and one segment (in a private directory under
/dev/shm, PLEIO_SHM_DIR), each checking every row it is served:
- Rust: `pleio bench --strategies pread,shared` in a loop (bench checks
  every arm's output against the others, bit for bit, and fails on a
  difference);
- Python: this script with --client: random batches through
  `pleio.open(strategy="shared")` against `strategy="pread"`;
- C: crates/pleio-capi/tests/c/capi_soak.c (built here against
  libpleio_capi.a), the same through the C ABI.
The segment is made first with a 1 MiB budget (PLEIO_SHARED_KEEP=1 keeps it
across detaches), so every batch evicts. Every 0.5-2 s the chaos loop does
one of: SIGKILL a random client (restarted at once), `pleio cache rm` (then
the segment is made again at 1 MiB), or shrink the segment file to 4 KiB
(a co-reader's ftruncate; docs/cache.md). At the end every client must have
exited 0 (killed ones aside) and none may have died by a signal it was not
sent. Prints a summary; --json writes it.
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reportmeta  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BUDGET = "1M"


def client(table, seconds, seed):
    """A Python client: random batches, shared against pread, raw bytes."""
    import numpy as np
    import pleio

    sh = pleio.open(table, strategy="shared", budget=1 << 20)
    ref = pleio.open(table, strategy="pread")
    rng = np.random.default_rng(seed)
    n_rows = ref.rows
    end = time.monotonic() + seconds
    batches = rows = 0
    while time.monotonic() < end:
        n = int(rng.integers(1, 2001))
        ids = np.where(np.arange(n) % 2 == 0, rng.integers(0, max(1, n_rows // 8), n), rng.integers(0, n_rows, n))
        a = sh.gather(ids.astype(np.int64), dtype="raw")
        b = ref.gather(ids.astype(np.int64), dtype="raw")
        if not np.array_equal(np.asarray(a), np.asarray(b)):
            bad = np.nonzero((np.asarray(a) != np.asarray(b)).any(axis=1))[0]
            print(f"python client {seed}: rows {ids[bad][:8].tolist()} differ from pread's", file=sys.stderr)
            sys.exit(1)
        batches += 1
        rows += n
    print(f"python client {seed}: {batches} batches, {rows} rows, all equal to pread's")


class Client:
    def __init__(self, kind, cmd, env, log):
        self.kind, self.cmd, self.env, self.log = kind, cmd, env, log
        self.p = None
        self.kills = self.runs = 0
        self.failures = []

    def start(self):
        self.runs += 1
        self.p = subprocess.Popen(self.cmd(), env=self.env, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)

    def check(self, killed=False):
        rc = self.p.wait()
        if killed and rc == -signal.SIGKILL:
            return
        if rc != 0:
            tail = Path(self.log).read_text(errors="replace")[-1500:]
            self.failures.append(f"{self.kind} client exited {rc}: {tail}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pleio", default=str(ROOT / "target" / "release" / "pleio"))
    ap.add_argument("--capi-lib", default=str(ROOT / "target" / "release" / "libpleio_capi.a"))
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--rust", type=int, default=3)
    ap.add_argument("--python", type=int, default=3)
    ap.add_argument("--c", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    ap.add_argument("--client", nargs=3, metavar=("TABLE", "SECONDS", "SEED"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.client:
        client(a.client[0], float(a.client[1]), int(a.client[2]))
        return 0

    a.meta = reportmeta.start()
    pleio_bin = os.path.abspath(a.pleio)
    work = Path(tempfile.mkdtemp(prefix="pleio-soak-", dir=ROOT / "target"))
    shm = Path(tempfile.mkdtemp(prefix="pleio-soak-", dir="/dev/shm"))
    env = {**os.environ, "PLEIO_SHM_DIR": str(shm), "PLEIO_SHARED_KEEP": "1"}
    try:
        return soak(a, pleio_bin, work, shm, env)
    finally:
        subprocess.run([pleio_bin, "cache", "rm"], env=env, capture_output=True)
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def soak(a, pleio_bin, work, shm, env):
    rng = random.Random(a.seed)
    table = work / "q.gguf"
    subprocess.run([pleio_bin, "synth", "--rows", "200000", "--seed", "21", "-o", str(table)], check=True,
                   capture_output=True)
    csoak = work / "capi_soak"
    native = ["-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl", "-lc"]
    subprocess.run(["cc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-I", str(ROOT / "include"),
                    str(ROOT / "crates/pleio-capi/tests/c/capi_soak.c"), a.capi_lib, *native, "-o", str(csoak)],
                   check=True)

    def make_segment():
        subprocess.run([pleio_bin, "gather", str(table), "--strategy", "shared", "--budget", BUDGET, "--rows", "0",
                        "--dtype", "raw", "-o", str(work / "row0.raw"), "--force"], env=env, check=True,
                       capture_output=True)

    make_segment()
    t_end = time.monotonic() + a.seconds
    left = lambda: max(1.0, t_end - time.monotonic())  # noqa: E731
    clients = []
    for k in range(a.rust):
        def rust(k=k):
            return [pleio_bin, "bench", str(table), "--strategies", "pread,shared", "--rows", "16,1792",
                    "--batches", "30", "--cold", "none", "--budget", BUDGET, "--seed", str(k + 100 * clients[k].runs)]
        clients.append(Client("rust", rust, env, work / f"rust{k}.log"))
    for k in range(a.python):
        def py(k=k):
            return [sys.executable, __file__, "--client", str(table), f"{left():.1f}", str(k + 1000 * rng.randrange(1000))]
        clients.append(Client("python", py, env, work / f"py{k}.log"))
    for k in range(a.c):
        def c(k=k):
            return [str(csoak), str(table), f"{left():.1f}", str(k + 1000 * rng.randrange(1000))]
        clients.append(Client("c", c, env, work / f"c{k}.log"))
    for c_ in clients:
        c_.start()
    chaos = {"kills": 0, "removes": 0, "shrinks": 0}
    seen = []  # each segment's counters before it was removed or shrunk
    while time.monotonic() < t_end:
        time.sleep(rng.uniform(0.5, 2.0))
        # Rust clients run bench rounds: restart the ones that finished.
        for c_ in clients:
            if c_.kind == "rust" and c_.p.poll() is not None:
                c_.check()
                if time.monotonic() < t_end:
                    c_.start()
        what = rng.choice(["kill", "kill", "rm", "shrink"])
        if what in ("rm", "shrink"):
            seen.extend(segment_stats(pleio_bin, env))
        if what == "kill":
            c_ = rng.choice(clients)
            if c_.p.poll() is None:
                c_.p.kill()
                c_.check(killed=True)
                c_.kills += 1
                chaos["kills"] += 1
                if time.monotonic() < t_end:
                    c_.start()
        elif what == "rm":
            subprocess.run([pleio_bin, "cache", "rm"], env=env, capture_output=True)
            make_segment()
            chaos["removes"] += 1
        else:
            for seg in shm.glob("pleio-*"):
                try:
                    with open(seg, "r+b") as f:
                        if os.fstat(f.fileno()).st_size > 4096:
                            f.truncate(4096)
                            chaos["shrinks"] += 1
                except OSError:
                    pass
    for c_ in clients:
        if c_.kind == "rust":
            c_.p.kill() if c_.p.poll() is None else None
            c_.check(killed=True)
        else:
            try:
                c_.p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                c_.p.kill()
                c_.failures.append(f"{c_.kind} client did not finish 120 s after its time (a hang)")
            c_.check()
    failures = [f for c_ in clients for f in c_.failures]
    seen.extend(segment_stats(pleio_bin, env))
    keys = ("budget_bytes", "hits", "misses", "evictions", "waits", "reclaims", "uncached")
    report = {"schema": "pleio-script-report/1", **reportmeta.stamp(a.meta), "seconds": a.seconds, "clients": {k: sum(c_.kind == k for c_ in clients) for k in ("rust", "python", "c")},
              "runs": sum(c_.runs for c_ in clients), "chaos": chaos, "failures": failures,
              "segments": [{k: s.get(k) for k in keys} for s in seen],
              "totals": {k: sum(s.get(k) or 0 for s in seen) for k in keys[1:]}}
    print(json.dumps({k: v for k, v in report.items() if k not in ("segments", "run", "machine")}, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1) + "\n")
    if failures:
        print("shared soak: FAILED", file=sys.stderr)
        return 1
    print(f"shared soak: OK ({sum(report['clients'].values())} clients, {report['runs']} client runs, {chaos})")
    return 0


def segment_stats(pleio_bin, env):
    out = subprocess.run([pleio_bin, "cache", "stats", "--json"], env=env, capture_output=True)
    return json.loads(out.stdout)["segments"] if out.returncode == 0 else []


if __name__ == "__main__":
    sys.exit(main())
