#!/usr/bin/env python3
"""The paper design of docs/remote.md ("100 nodes x 8 engine processes"),
computed from measurements, so every figure has a source:

- Redis memory per table byte: docs/reports/remote-memory.json (the
  default 256 KiB buckets: allocator overhead over the stored records);
- wire bytes per row: the exact RESP of one pipelined GETRANGE (request
  and reply) for pleio's key format, computed here;
- rows that reach Redis per token, with and without the machine-wide
  cache: `pleio cache-sim` (policy sieve, pleio's default) on a sparse
  table of qwen4exp's real geometry (`pleio synth --rows full --sparse`,
  320,001,536 rows: the real row ids), over the bundled corpus once and
  4 times reordered;
- publishing speed: docs/reports/remote-rivals.json (a 1.34 GB FP8 table
  to one server and to a 3-master cluster on loopback);
- Redis CPU per row: --server-us-per-row, from docs/remote.md's
  `remote_gather` measurement (3.05 ms of server CPU per 1792-row batch).

Assumptions are arguments and are written into the report:

    python3 scripts/reportmeta.py --out docs/reports/cluster-paper.json -- \\
        python3 scripts/cluster_paper.py --pleio target/release/pleio
"""

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GIB = 2**30

# The released qwen4exp table in each encoding: row bytes, whole table.
ENCODINGS = [
    ("IQ4_NL (GGUF)", 90),
    ("FP8 (checkpoint)", 160),
    ("Q8_0 (GGUF)", 170),
]
ROWS = 320_001_536
CHECK = 4  # bytes of each record's check


def resp_bulk(n):
    return len(f"${n}\r\n") + n + 2


def getrange_bytes(key_len, start, end, record):
    """Request and reply bytes of one GETRANGE."""
    req = len("*4\r\n") + resp_bulk(len("GETRANGE")) + resp_bulk(key_len)
    req += resp_bulk(len(str(start))) + resp_bulk(len(str(end)))
    return req, resp_bulk(record)


def cache_sim(pleio, table, orders, budgets):
    out = subprocess.run([pleio, "cache-sim", str(table), "--corpus", "--orders", str(orders),
                          "--budgets", budgets, "--policies", "sieve", "--json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pleio", default="target/release/pleio")
    ap.add_argument("--nodes", type=int, default=100, help="inference nodes")
    ap.add_argument("--procs", type=int, default=8, help="engine processes per node")
    ap.add_argument("--tokens-per-s", type=int, default=2000,
                    help="tokens per second per process (prefill and decode together)")
    ap.add_argument("--masters", type=int, default=50, help="Redis masters (one Redis per inference node: 50 masters, 50 replicas)")
    ap.add_argument("--replicas", type=int, default=1, help="replicas per master")
    ap.add_argument("--bucket-bytes", type=int, default=256 * 1024)
    ap.add_argument("--budgets", default="16M,64M,256M,1G")
    ap.add_argument("--server-us-per-row", type=float, default=3050 / 1792)
    a = ap.parse_args()

    mem = json.loads((ROOT / "docs/reports/remote-memory.json").read_text())
    m = next(x for x in mem["output"] if x["bucket_bytes"] == a.bucket_bytes)
    alloc = m["used_memory"] / m["stored_bytes"]

    rivals = json.loads((ROOT / "docs/reports/remote-rivals.json").read_text())
    file_bytes = rivals["table"]["file_bytes"]
    publish = {k: file_bytes / v["setup"]["publish_s"] for k, v in rivals["engines"].items()
               if "publish_s" in (v.get("setup") or {})}

    with tempfile.TemporaryDirectory(prefix="pleio-paper-") as d:
        table = Path(d) / "full.gguf"
        subprocess.run([a.pleio, "synth", "--rows", "full", "--sparse", "-o", str(table)],
                       check=True, capture_output=True)
        sims = {o: cache_sim(a.pleio, table, o, a.budgets) for o in (1, 4)}

    procs = a.nodes * a.procs
    tokens_per_s = procs * a.tokens_per_s
    redis_nodes = a.masters * (1 + a.replicas)
    encodings = []
    for name, row in ENCODINGS:
        record = row + CHECK
        per_bucket = a.bucket_bytes // record
        buckets = -(-ROWS // per_bucket)
        key_len = len(f"pleio:t:{'0' * 16}:b{buckets - 1}")
        req, rep = getrange_bytes(key_len, (per_bucket - 1) * record, per_bucket * record - 1, record)
        used = ROWS * record * alloc
        encodings.append({
            "encoding": name, "row_bytes": row, "table_bytes": ROWS * row, "buckets": buckets,
            "redis_used_bytes": used, "per_master_bytes": used / a.masters,
            "cluster_bytes": used * (1 + a.replicas), "request_bytes": req, "reply_bytes": rep,
            "publish_s": {k: ROWS * row / v for k, v in publish.items()},
        })
    streams = []
    for orders, s in sims.items():
        per_tok_ids = s["row_ids"] / s["tokens"]
        for r in s["results"]:
            streams.append({
                "orders": orders, "tokens": s["tokens"], "row_ids": s["row_ids"],
                "distinct_rows": s["distinct_rows"], "budget_bytes": r["budget_bytes"],
                "ids_per_token": per_tok_ids, "lookups_per_token": r["lookups"] / s["tokens"],
                "misses_per_token": r["misses"] / s["tokens"], "hit_rate": r["hit_rate"],
            })
    print(json.dumps({
        "assumptions": {"nodes": a.nodes, "procs_per_node": a.procs, "tokens_per_s_per_proc": a.tokens_per_s,
                        "masters": a.masters, "replicas_per_master": a.replicas, "redis_nodes": redis_nodes,
                        "bucket_bytes": a.bucket_bytes, "server_us_per_row": a.server_us_per_row},
        "measured": {"alloc_overhead": alloc, "publish_bytes_per_s": publish},
        "rows": ROWS, "processes": procs, "tokens_per_s": tokens_per_s,
        "encodings": encodings, "streams": streams,
    }))


if __name__ == "__main__":
    main()
