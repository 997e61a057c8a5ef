#!/usr/bin/env python3
"""Redis memory per table byte, and publishing time, for each bucket size:
a synthetic 1M-row IQ4_NL table (`pleio synth`) published with
`pleio publish --bucket-bytes B` to a fresh redis-server on loopback
(started here, stopped by pid), its `INFO memory` read before and after.
Prints one JSON line per bucket size (docs/remote.md's table, through
scripts/reportmeta.py):

    python3 scripts/reportmeta.py --out docs/reports/remote-memory.json -- \\
        python3 scripts/remote_memory.py --pleio target/release/pleio
"""

import argparse
import json
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def info(port):
    out = subprocess.run(["redis-cli", "-p", str(port), "info", "memory"],
                         capture_output=True, text=True, check=True).stdout
    return {k: v for k, _, v in (l.strip().partition(":") for l in out.splitlines()) if v}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pleio", default="target/release/pleio")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--buckets", default="16384,65536,262144,1048576,4194304")
    a = ap.parse_args()
    exe = shutil.which("redis-server")
    if not exe:
        raise SystemExit("remote_memory: no redis-server in PATH (apt-get install redis-server)")
    with tempfile.TemporaryDirectory() as d:
        table = Path(d) / "q.gguf"
        subprocess.run([a.pleio, "synth", "--rows", str(a.rows), "--seed", "3", "-o", str(table)],
                       check=True, capture_output=True)
        inspect = json.loads(subprocess.run([a.pleio, "inspect", "--json", str(table)],
                                            check=True, capture_output=True, text=True).stdout)["table"]
        table_bytes = inspect["rows"] * inspect["row_bytes"]
        for b in [int(x) for x in a.buckets.split(",")]:
            port = free_port()
            srv = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                    "--appendonly", "no", "--dir", d],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                for _ in range(200):
                    try:
                        socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                        break
                    except OSError:
                        time.sleep(0.05)
                before = info(port)
                t0 = time.perf_counter()
                pub = json.loads(subprocess.run(
                    [a.pleio, "publish", str(table), f"redis://127.0.0.1:{port}/q", "--bucket-bytes", str(b), "--json"],
                    check=True, capture_output=True, text=True).stdout)["published"]
                seconds = time.perf_counter() - t0
                after = info(port)
                used = int(after["used_memory"]) - int(before["used_memory"])
                print(json.dumps({
                    "bucket_bytes": b, "buckets": pub["buckets"], "table_bytes": table_bytes,
                    "stored_bytes": pub["table_bytes"], "used_memory": used,
                    "used_per_table_byte": used / table_bytes,
                    "rss_per_table_byte": int(after["used_memory_rss"]) / table_bytes,
                    "publish_seconds": seconds,
                }), flush=True)
            finally:
                srv.kill()
                srv.wait()


if __name__ == "__main__":
    main()
