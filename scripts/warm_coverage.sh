#!/bin/sh
# Prewarm coverage (issue 13): for each part of the bundled corpus (chat,
# code, docs, licenses), prewarm the row cache from the rest of the corpus
# and report how much of the held-out part's rows the warm set covers, at
# each budget. One `pleio warm --strategy cached --json` per case; prints
# one JSON line per case, which `scripts/docs_gen.py warm-coverage` makes a
# Markdown table of (docs/cache.md keeps the run's report):
#   python3 scripts/reportmeta.py --out docs/reports/warm-coverage.json -- \
#     scripts/warm_coverage.sh PLEIO TABLE ["16M 64M 256M"]
set -eu
pleio=$1 table=$2 budgets=${3:-"16M 64M 256M"}
root=$(cd "$(dirname "$0")/.." && pwd)
for part in chat code docs licenses; do
  profile=""
  for other in chat code docs licenses; do
    [ "$other" = "$part" ] && continue
    for f in "$root"/corpus/"$other"/*; do profile="$profile --from-text $f"; done
  done
  held=""
  for f in "$root"/corpus/"$part"/*; do held="$held --held-out-text $f"; done
  for b in $budgets; do
    # shellcheck disable=SC2086 # word splitting of the file lists is meant
    "$pleio" warm "$table" --budget "$b" --strategy cached $profile $held --json |
      python3 -c '
import json, sys
part, b = sys.argv[1:3]
j = json.load(sys.stdin)
keep = ["profile_distinct_rows", "warm_rows", "held_out_coverage", "held_out_distinct_coverage", "seconds"]
print(json.dumps({"held_out": part, "budget": b, **{k: j[k] for k in keep}}))
' "$part" "$b"
  done
done
