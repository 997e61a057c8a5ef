#!/bin/sh
# Real replays of the row cache's eviction policies: cold prefill + decode of
# a token stream through `cached` at several budgets, one JSON line per run.
#   scripts/cache_policies.sh PLEIO TABLE TOKENS "16M 64M 256M 1G" > runs.jsonl
# TOKENS: e.g. `pleio rows TABLE --corpus --orders 4 --json | jq -c .tokens`.
set -eu
pleio=$1 table=$2 tokens=$3 budgets=${4:-"64M 256M 1G"}
for b in $budgets; do
  for p in lru clock sieve s3-fifo; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    "$pleio" replay "$table" --tokens "$tokens" --strategy cached --budget "$b" \
      --cache-policy "$p" --cold --json |
      python3 -c '
import json, sys
b, p, load = sys.argv[1:4]
r = json.load(sys.stdin)["replays"][0]
g = r["prefill"]
hits, misses = g["cache_hits"], g["cache_misses"]
print(json.dumps({"budget": b, "policy": p, "load": float(load),
  "prefill_tokens_per_s": g["tokens_per_s"], "decode_tokens_per_s": r["decode"]["tokens_per_s"],
  "hit_rate": hits / max(1, hits + misses), "misses": misses,
  "read_bytes": r["read_bytes"], "peak_rss_bytes": r["peak_rss_bytes"]}))' "$b" "$p" "$load"
  done
done
