#!/usr/bin/env bash
# pleio inside llama.cpp, speed (not CI): prefill tokens/s of one prompt, cold and warm, on a
# qwen4exp model whose PLE table is >= 4 GiB, for
#
#   upstream     stock llama.cpp, lazy mode on: upstream's llama_prefetch_rows (sorted, merged
#                madvise(WILLNEED) per ubatch) then ggml_get_rows on the lazy mapping
#   no-prefetch  the same with upstream's prefetch off (PLEIO_UPSTREAM_PREFETCH=off): plain
#                lazy-mmap page faults
#   pleio-S      the provider patch with pleio linked, strategy S (PLEIO_STRATEGY=S)
#
#   bash integrations/llama.cpp/speed.sh [--rows 48M] [--tokens 8192] [--ubatch 512]
#                                        [--runs 5] [--threads 2] [--strategies auto,advise,uring-direct]
#
# Each run of each arm is a fresh process: the table's byte range is evicted from the page cache
# first (posix_fadvise DONTNEED; `pleio residency` must then report < 1% resident), the prompt
# is prefilled once (cold) and once more in the same process (warm: every row it needs is
# resident). Arms are interleaved run by run so drift spreads over all of them. Prints medians,
# ratios to upstream's prefetch, and writes $LLAMA_CACHE/work/speed/speed.json.
#
# Needs the pleio C ABI (pleio-llama-driver-pleio, see build.sh). The strategy reaches pleio
# through PLEIO_STRATEGY, which the provider patch passes to pleio_open_with.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

ROWS=48M
N_TOKENS=8192
UBATCH=512
RUNS=5
THREADS=2
STRATEGIES=auto,advise,uring-direct
while [ $# -gt 0 ]; do
    case "$1" in
        --rows) ROWS="$2"; shift 2 ;;
        --tokens) N_TOKENS="$2"; shift 2 ;;
        --ubatch) UBATCH="$2"; shift 2 ;;
        --runs) RUNS="$2"; shift 2 ;;
        --threads) THREADS="$2"; shift 2 ;;
        --strategies) STRATEGIES="$2"; shift 2 ;;
        *) fail "unknown argument $1 (see the top of speed.sh)" ;;
    esac
done

bash "$INTEGRATION_DIR/build.sh"
[ -x "$DRIVER_PLEIO" ] || fail "speed.sh needs the pleio C ABI: $DRIVER_PLEIO was not built"

W="$LLAMA_WORK/speed"
mkdir -p "$W"
MODEL="$W/qwen4exp-$ROWS.gguf"
stamp="$(cat "$INTEGRATION_DIR/write_model.py" "$PLEIO" | sha256sum | cut -c1-16)"
if [ ! -f "$MODEL" ] || [ "$(cat "$MODEL.stamp" 2>/dev/null)" != "$stamp" ]; then
    say "writing $MODEL (synth table of $ROWS rows, then the model around it)"
    "$PLEIO" synth --rows "$ROWS" --force -o "$W/table.gguf"
    python3 "$INTEGRATION_DIR/write_model.py" --llama-src "$LLAMA_SRC" --table "$W/table.gguf" -o "$MODEL" --force
    rm -f "$W/table.gguf"
    echo "$stamp" >"$MODEL.stamp"
fi
table_bytes="$("$PLEIO" residency "$MODEL" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["bytes"])')"
[ "$table_bytes" -ge $((4 << 30)) ] || fail "the table is $table_bytes bytes, under 4 GiB: use a larger --rows"

"$PLEIO" rows "$MODEL" --corpus --json | python3 -c '
import json, sys
n = int(sys.argv[1])
t = json.load(sys.stdin)["tokens"][:n]
if len(t) < n:
    sys.exit(f"the corpus has only {len(t)} tokens")
open(sys.argv[2], "w").write(" ".join(map(str, t)) + "\n")' "$N_TOKENS" "$W/tokens.txt"

# evict the table's byte range and check that it is gone
evict() {
    python3 - "$MODEL" <<'EOF'
import json, os, subprocess, sys
model = sys.argv[1]
r = json.loads(subprocess.check_output([os.environ["PLEIO"], "residency", model, "--json"]))
fd = os.open(model, os.O_RDONLY)
os.fsync(fd)
os.posix_fadvise(fd, r["offset"], r["bytes"], os.POSIX_FADV_DONTNEED)
os.close(fd)
after = json.loads(subprocess.check_output([os.environ["PLEIO"], "residency", model, "--json"]))
if after["resident_fraction"] > 0.01:
    sys.exit(f"eviction left {after['resident_fraction']:.1%} of the table resident")
EOF
}
export PLEIO

arms=(upstream no-prefetch)
IFS=, read -r -a strategies <<<"$STRATEGIES"
for s in "${strategies[@]}"; do arms+=("pleio-$s"); done

run_arm() {
    local arm="$1" out="$2"
    local args=(-m "$MODEL" -t "$W/tokens.txt" --ubatch "$UBATCH" --batch "$N_TOKENS" --threads "$THREADS"
                --lazy on --runs 2 --json "$out")
    case "$arm" in
        upstream) env -u PLEIO_TABLE "$DRIVER" "${args[@]}" ;;
        no-prefetch) env -u PLEIO_TABLE PLEIO_UPSTREAM_PREFETCH=off "$DRIVER" "${args[@]}" ;;
        pleio-*) PLEIO_TABLE="$MODEL" PLEIO_STRATEGY="${arm#pleio-}" "$DRIVER_PLEIO" "${args[@]}" ;;
    esac
}

rm -rf "$W/runs"
mkdir -p "$W/runs"
for r in $(seq 1 "$RUNS"); do
    for arm in "${arms[@]}"; do
        evict
        say "run $r/$RUNS: $arm"
        run_arm "$arm" "$W/runs/$arm-$r.json" 2>"$W/runs/$arm-$r.log" \
            || { cat "$W/runs/$arm-$r.log" >&2; fail "$arm run $r"; }
    done
done

python3 - "$W" "$RUNS" "$table_bytes" "${arms[@]}" <<'EOF'
import json, statistics, sys
w, runs, table_bytes, arms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
res = {}
for arm in arms:
    js = [json.load(open(f"{w}/runs/{arm}-{r}.json")) for r in range(1, runs + 1)]
    cold = [j["runs"][0]["tokens_per_s"] for j in js]
    warm = [j["runs"][1]["tokens_per_s"] for j in js]
    res[arm] = {"cold_tokens_per_s": cold, "warm_tokens_per_s": warm,
                "cold_median": statistics.median(cold), "warm_median": statistics.median(warm),
                "tokens": js[0]["tokens"], "ubatch": js[0]["ubatch"]}
up = res["upstream"]
print(f"\nprefill of {res['upstream']['tokens']} tokens, ubatch {res['upstream']['ubatch']}, "
      f"table {table_bytes / 2**30:.2f} GiB, median of {runs} runs (tokens/s)\n")
print("| arm | cold | warm | cold vs upstream | warm vs upstream | cold vs no-prefetch |")
print("|---|---|---|---|---|---|")
for arm, v in res.items():
    print(f"| {arm} | {v['cold_median']:.0f} | {v['warm_median']:.0f} | "
          f"{v['cold_median'] / up['cold_median']:.2f}x | {v['warm_median'] / up['warm_median']:.2f}x | "
          f"{v['cold_median'] / res['no-prefetch']['cold_median']:.2f}x |")
json.dump({"table_bytes": table_bytes, "runs": runs, "arms": res}, open(f"{w}/speed.json", "w"), indent=1)
print(f"\n(all runs in {w}/speed.json)")
EOF
