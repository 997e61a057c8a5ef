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
import subprocess
import tempfile
import time
from pathlib import Path

from redis_servers import Servers, info, synth_table


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pleio", default="target/release/pleio")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--buckets", default="16384,65536,262144,1048576,4194304")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        table = synth_table(a.pleio, a.rows, Path(d) / "q.gguf")
        inspect = json.loads(subprocess.run([a.pleio, "inspect", "--json", str(table)],
                                            check=True, capture_output=True, text=True).stdout)["table"]
        table_bytes = inspect["rows"] * inspect["row_bytes"]
        for b in [int(x) for x in a.buckets.split(",")]:
            servers = Servers(1, Path(d) / f"b{b}")
            port = servers.ports[0]
            try:
                before = info(port)
                t0 = time.perf_counter()
                pub = json.loads(subprocess.run(
                    [a.pleio, "publish", str(table), servers.url("q"), "--bucket-bytes", str(b), "--json"],
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
                servers.stop()


if __name__ == "__main__":
    main()
