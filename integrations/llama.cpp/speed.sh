#!/usr/bin/env bash
# pleio inside llama.cpp, speed (not CI): prefill tokens/s of one prompt, cold and warm, on a
# qwen4exp model whose PLE table is >= 4 GiB (or, with --arch gemma4, a gemma4 model with the
# released table geometry: 262,144 rows of --layers x 256 Q5_K, two pages a row at 42 layers), for
#
#   upstream     stock llama.cpp, lazy mode on: upstream's llama_prefetch_rows (sorted, merged
#                madvise(WILLNEED) per ubatch) then ggml_get_rows on the lazy mapping
#   no-prefetch  the same with upstream's prefetch off (PLEIO_UPSTREAM_PREFETCH=off): plain
#                lazy-mmap page faults
#   pleio-S      the provider patch with pleio linked, strategy S (PLEIO_STRATEGY=S), lookahead
#                on (PLEIO_LOOKAHEAD=1: ubatch k+1's rows are read while ubatch k computes, and a
#                decode step's rows from the moment its llama_decode starts)
#   pleio-S-noahead  the same with the lookahead off (PLEIO_LOOKAHEAD=0): each ubatch's rows
#                are read when its gather runs
#   pleio-S-resident (the first strategy only) pleio-S with nothing evicted: the prompt's rows
#                are resident from the arms before it, so its "cold" prefill is only the
#                process's first prefill. Its cold/warm is what a cold table could reach at
#                best: the first prefill of a process pays its own setup (buffers first
#                touched, threads started) whatever the table does
#
#   bash integrations/llama.cpp/speed.sh [--arch qwen4exp] [--rows 48M] [--layers 42] [--tokens 8192] [--ubatch 512] [--decode 32]
#                                        [--runs 5] [--threads 2] [--strategies cached]
#                                        [--report FILE]
#
# After each prefill, --decode N greedy decode steps (one token per llama_decode), timed apart.
# --report FILE also writes the summary with the command, the commit and the load average
# (/proc/loadavg before and after) for docs/reports (scripts/docs_gen.py llama-speed).
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

ARCH=qwen4exp
ROWS=48M
LAYERS=42
N_TOKENS=8192
UBATCH=512
RUNS=5
THREADS=2
STRATEGIES=cached
DECODE=32
REPORT=
COMMAND="bash integrations/llama.cpp/speed.sh $*"
while [ $# -gt 0 ]; do
    case "$1" in
        --arch) ARCH="$2"; shift 2 ;;
        --rows) ROWS="$2"; shift 2 ;;
        --layers) LAYERS="$2"; shift 2 ;;
        --tokens) N_TOKENS="$2"; shift 2 ;;
        --ubatch) UBATCH="$2"; shift 2 ;;
        --runs) RUNS="$2"; shift 2 ;;
        --threads) THREADS="$2"; shift 2 ;;
        --strategies) STRATEGIES="$2"; shift 2 ;;
        --decode) DECODE="$2"; shift 2 ;;
        --report) REPORT="$(realpath -m "$2")"; shift 2 ;;
        *) fail "unknown argument $1 (see the top of speed.sh)" ;;
    esac
done

bash "$INTEGRATION_DIR/build.sh"
[ -x "$DRIVER_PLEIO" ] || fail "speed.sh needs the pleio C ABI: $DRIVER_PLEIO was not built"

W="$LLAMA_WORK/speed"
mkdir -p "$W"
case "$ARCH" in
    # qwen4exp: --rows rows of IQ4_NL; gemma4: one row per token of its 262,144-token vocabulary
    qwen4exp) MODEL="$W/qwen4exp-$ROWS.gguf"; synth_args=(--arch qwen4exp --rows "$ROWS") ;;
    gemma4) MODEL="$W/gemma4-L$LAYERS.gguf"; synth_args=(--arch gemma4 --layers "$LAYERS") ;;
    *) fail "--arch $ARCH: qwen4exp or gemma4" ;;
esac
stamp="$(cat "$INTEGRATION_DIR/write_model.py" "$PLEIO" | sha256sum | cut -c1-16)"
if [ ! -f "$MODEL" ] || [ "$(cat "$MODEL.stamp" 2>/dev/null)" != "$stamp" ]; then
    say "writing $MODEL (synth ${synth_args[*]}, then the model around it)"
    "$PLEIO" synth "${synth_args[@]}" --force -o "$W/table.gguf"
    python3 "$INTEGRATION_DIR/write_model.py" --llama-src "$LLAMA_SRC" --table "$W/table.gguf" -o "$MODEL" --force
    rm -f "$W/table.gguf"
    echo "$stamp" >"$MODEL.stamp"
fi
table_bytes="$("$PLEIO" residency "$MODEL" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["bytes"])')"
[ "$ARCH" != qwen4exp ] || [ "$table_bytes" -ge $((4 << 30)) ] || fail "the table is $table_bytes bytes, under 4 GiB: use a larger --rows"

# the prompt: the corpus in Qwen tokens (gemma4 reuses these ids, all under its vocabulary, as
# check.sh does; pleio has no gemma4 tokenizer), tokenized through a sparse qwen4exp file
"$PLEIO" synth --arch qwen4exp --rows 1M --sparse --force -o "$W/tokenizer.gguf" >/dev/null
"$PLEIO" rows "$W/tokenizer.gguf" --corpus --json | python3 -c '
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
for s in "${strategies[@]}"; do arms+=("pleio-$s" "pleio-$s-noahead"); done
arms+=("pleio-${strategies[0]}-resident")

run_arm() {
    local arm="$1" out="$2"
    local args=(-m "$MODEL" -t "$W/tokens.txt" --ubatch "$UBATCH" --batch "$N_TOKENS" --threads "$THREADS"
                --lazy on --runs 2 --decode "$DECODE" --json "$out")
    case "$arm" in
        upstream) env -u PLEIO_TABLE "$DRIVER" "${args[@]}" ;;
        no-prefetch) env -u PLEIO_TABLE PLEIO_UPSTREAM_PREFETCH=off "$DRIVER" "${args[@]}" ;;
        pleio-*-resident)
            local s="${arm#pleio-}"
            PLEIO_TABLE="$MODEL" PLEIO_STRATEGY="${s%-resident}" PLEIO_LOOKAHEAD=1 "$DRIVER_PLEIO" "${args[@]}" ;;
        pleio-*-noahead)
            local s="${arm#pleio-}"
            PLEIO_TABLE="$MODEL" PLEIO_STRATEGY="${s%-noahead}" PLEIO_LOOKAHEAD=0 "$DRIVER_PLEIO" "${args[@]}" ;;
        pleio-*) PLEIO_TABLE="$MODEL" PLEIO_STRATEGY="${arm#pleio-}" PLEIO_LOOKAHEAD=1 "$DRIVER_PLEIO" "${args[@]}" ;;
    esac
}

rm -rf "$W/runs"
mkdir -p "$W/runs"
load_before="$(cat /proc/loadavg)"
for r in $(seq 1 "$RUNS"); do
    for arm in "${arms[@]}"; do
        [[ $arm == *-resident ]] || evict
        say "run $r/$RUNS: $arm"
        run_arm "$arm" "$W/runs/$arm-$r.json" 2>"$W/runs/$arm-$r.log" \
            || { cat "$W/runs/$arm-$r.log" >&2; fail "$arm run $r"; }
    done
done

load_after="$(cat /proc/loadavg)"
commit="$(git -C "$REPO_ROOT" rev-parse --short HEAD)"
git -C "$REPO_ROOT" diff --quiet HEAD -- || commit="$commit+dirty"

python3 - "$W" "$RUNS" "$table_bytes" "$REPORT" "$COMMAND" "$commit" "$load_before" "$load_after" "$ARCH" "${arms[@]}" <<'EOF'
import json, os, statistics, sys, time
w, runs, table_bytes, report = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
command, commit, load_before, load_after, arch, arms = sys.argv[5], sys.argv[6], sys.argv[7], sys.argv[8], sys.argv[9], sys.argv[10:]
med = statistics.median
res = {}
for arm in arms:
    js = [json.load(open(f"{w}/runs/{arm}-{r}.json")) for r in range(1, runs + 1)]
    cold, warm = [j["runs"][0] for j in js], [j["runs"][1] for j in js]
    n_decode = js[0].get("decode", 0)
    res[arm] = {
        "cold_tokens_per_s": [r["tokens_per_s"] for r in cold],
        "warm_tokens_per_s": [r["tokens_per_s"] for r in warm],
        # milliseconds per decode step after the cold prefill (rows of new n-grams: cold) and the warm one
        "cold_decode_ms_per_token": [r["decode_ms"] / n_decode for r in cold] if n_decode else [],
        "warm_decode_ms_per_token": [r["decode_ms"] / n_decode for r in warm] if n_decode else [],
        # time inside the PLE gathers (pleio arms): what the lookahead did not hide
        "cold_prefill_gather_ms": [r["lookahead_prefill"]["gather_ms"] for r in cold],
        "cold_decode_gather_ms": [r["lookahead_decode"]["gather_ms"] for r in cold],
        "cold_prefill_ubatches_from_lookahead": [r["lookahead_prefill"]["prefetched"] for r in cold],
        "max_rss_kib": [j["max_rss_kib"] for j in js],
        "tokens": js[0]["tokens"], "ubatch": js[0]["ubatch"], "decode": n_decode, "threads": js[0]["threads"],
    }
up = res["upstream"]
for arm, v in res.items():
    v["cold_median"] = med(v["cold_tokens_per_s"])
    v["warm_median"] = med(v["warm_tokens_per_s"])
    # medians of per-run ratios (runs are interleaved arm by arm, so run r of every arm saw the same drift)
    v["cold_over_warm"] = med(c / x for c, x in zip(v["cold_tokens_per_s"], v["warm_tokens_per_s"]))
    v["cold_vs_upstream"] = med(c / u for c, u in zip(v["cold_tokens_per_s"], up["cold_tokens_per_s"]))
    v["cold_vs_upstream_runs"] = [c / u for c, u in zip(v["cold_tokens_per_s"], up["cold_tokens_per_s"])]
    v["warm_vs_upstream"] = med(c / u for c, u in zip(v["warm_tokens_per_s"], up["warm_tokens_per_s"]))
    v["cold_vs_no_prefetch"] = med(c / u for c, u in zip(v["cold_tokens_per_s"], res["no-prefetch"]["cold_tokens_per_s"]))
    v["max_rss_mib_median"] = med(v["max_rss_kib"]) / 1024
    if v["decode"]:
        v["cold_decode_ms_median"] = med(v["cold_decode_ms_per_token"])
        v["warm_decode_ms_median"] = med(v["warm_decode_ms_per_token"])
print(f"\n{arch}: prefill of {up['tokens']} tokens, ubatch {up['ubatch']}, {up['threads']} threads, "
      f"table {table_bytes / 2**30:.2f} GiB, {runs} runs; tokens/s medians, ratios: medians of per-run ratios\n")
print("| arm | cold | warm | cold/warm | cold vs upstream | warm vs upstream | cold vs no-prefetch | peak RSS |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for arm, v in res.items():
    print(f"| {arm} | {v['cold_median']:.0f} | {v['warm_median']:.0f} | {v['cold_over_warm']:.2f} | "
          f"{v['cold_vs_upstream']:.2f}x | {v['warm_vs_upstream']:.2f}x | {v['cold_vs_no_prefetch']:.2f}x | "
          f"{v['max_rss_mib_median']:,.0f} MiB |")
if up["decode"]:
    print(f"\n{up['decode']} greedy decode steps after the prefill (ms per token, medians; PLE gathers: ms in the cold run)\n")
    print("| arm | cold decode | warm decode | cold prefill PLE gathers | cold decode PLE gathers |")
    print("|---|---:|---:|---:|---:|")
    for arm, v in res.items():
        print(f"| {arm} | {v['cold_decode_ms_median']:.2f} | {v['warm_decode_ms_median']:.2f} | "
              f"{med(v['cold_prefill_gather_ms']):.1f} | {med(v['cold_decode_gather_ms']):.1f} |")
out = {"arch": arch, "table_bytes": table_bytes, "runs": runs, "arms": res}
json.dump(out, open(f"{w}/speed.json", "w"), indent=1)
print(f"\n(all runs in {w}/speed.json)")
if report:
    out.update({"command": command, "commit": commit, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "loadavg_before": load_before, "loadavg_after": load_after, "cpus": os.cpu_count()})
    json.dump(out, open(report, "w"), indent=1)
    print(f"(report in {report})")
EOF
