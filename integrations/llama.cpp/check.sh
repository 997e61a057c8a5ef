#!/usr/bin/env bash
# pleio inside llama.cpp, correctness (run by .ci/run), for a tiny qwen4exp and a tiny gemma4:
#
#   1. llama's own PLE gather, seen through its eval callback (no patch needed): for a prompt of
#      2,100 tokens of the bundled corpus (with <|endoftext|> resets) prefilled in ubatches of
#      64, so the n-gram history crosses ubatches, llama's row ids equal `pleio rows` and
#      llama's gathered floats equal `pleio gather`, bit for bit.
#   2. the provider patch: with pleio linked and PLEIO_TABLE set, the PLE gather is pleio's
#      custom op (seen through the same callback, same ids and floats), and the logits of every
#      position (and of DECODE greedy decode steps after the prompt) equal stock llama.cpp's,
#      bit for bit. The prompt goes in batches of BATCH tokens, which llama splits into ubatches
#      of UBATCH, and the provider's lookahead is on (PLEIO_LOOKAHEAD, default 1): every ubatch's
#      rows, prompt and decode, must come from the lookahead's background read
#      (--expect-lookahead). The provider's default strategy (cached) is checked, and the capture
#      is repeated with PLEIO_STRATEGY=auto. Needs the pleio C ABI (the pleio-capi crate's libpleio_capi.a, see
#      build.sh); without it check 2 is reported PENDING, never passed, and once the crate is in
#      the workspace check 2 is required.
#   3. the provider on the machine-wide shared cache: two drivers at once with
#      PLEIO_STRATEGY=shared (segment in a private /dev/shm directory) gather the same rows as
#      `pleio gather`, and the segment's counters show every distinct row read from the device
#      once for both processes (hits > 0; misses + uncached <= distinct rows + the two rows the
#      provider compares at open).
#
#   4. pleio_decode (the C ABI's decoder, the one every gather uses) against ggml's own CPU
#      conversion of the same blocks (the type's to_float; ggml_cpu_fp16/bf16_to_fp32), bit for
#      bit, for every type both decode: decode_vs_ggml.c, blocks made by ggml_quantize_chunk.
#
#   Two prompts: "corpus" (above) and "eos", 613 tokens of the corpus with <|endoftext|> put at
#   ubatch and batch boundaries (the last token of a ubatch, the first, both sides of one, the
#   second token of one), so predicted n-gram histories cross resets at the edges, and ending
#   with a partial ubatch of 37 tokens.
#
#   bash integrations/llama.cpp/check.sh
#
# Builds through build.sh; models and outputs go to $LLAMA_CACHE/work/check (see common.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

N_TOKENS=2100
UBATCH=64
BATCH=256   # check 2: four ubatches per llama_decode, so the lookahead reads across them
DECODE=4    # check 2: greedy decode steps after the prompt (their rows read ahead too)
EOT=248044
# the "eos" prompt: 9 ubatches and 37 tokens; end-of-text at these positions
EOS_TOKENS=613
EOS_AT="63 192 255 256 321 447 448 600"

bash "$INTEGRATION_DIR/build.sh"

W="$LLAMA_WORK/check"
mkdir -p "$W"

provider=1
if [ ! -f "$PLEIO_CAPI_LIB" ] || [ ! -x "$DRIVER_PLEIO" ]; then
    if have_capi_crate; then
        fail "the workspace has crates/pleio-capi but $DRIVER_PLEIO was not built"
    fi
    provider=0
fi

# the prompt: the first N_TOKENS tokens of the bundled corpus, with end-of-text resets inside
write_prompt() {
    python3 - "$1" "$2" "$N_TOKENS" "$EOT" <<'EOF'
import json, sys
corpus, out, n, eot = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
tokens = json.load(open(corpus))["tokens"][:n]
if len(tokens) < n:
    sys.exit(f"the corpus has only {len(tokens)} tokens")
resets = [i for i, t in enumerate(tokens) if t == eot]
if not resets or resets[0] < 64 or resets[-1] > n - 64:
    sys.exit(f"want an end-of-text reset well inside the prompt, found at {resets}")
open(out, "w").write(" ".join(map(str, tokens)) + "\n")
print(f"prompt: {n} corpus tokens, end-of-text resets at {resets}", file=sys.stderr)
EOF
}

# the eos prompt: the corpus prompt's first EOS_TOKENS tokens with end-of-text put at EOS_AT
write_eos_prompt() {
    python3 - "$1" "$2" "$EOS_TOKENS" "$EOT" $EOS_AT <<'EOF'
import sys
src, out, n, eot, at = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], [int(a) for a in sys.argv[5:]]
tokens = open(src).read().split()[:n]
for i in at:
    tokens[i] = eot
open(out, "w").write(" ".join(tokens) + "\n")
print(f"eos prompt: {n} tokens, end-of-text at {at}", file=sys.stderr)
EOF
}

# compare a capture (DIR/rows.txt, DIR/rows.f32) with pleio's answers in $A
compare_capture() {
    local dir="$1" what="$2"
    cmp -s "$dir/rows.txt" "$A/pleio-rows.txt" \
        || fail "$what: llama's PLE row ids differ from pleio rows ($(diff "$dir/rows.txt" "$A/pleio-rows.txt" | head -3 | tr '\n' ' '))"
    cmp -s "$dir/rows.f32" "$A/pleio-gather.f32" \
        || fail "$what: llama's gathered rows differ from pleio gather ($(cmp "$dir/rows.f32" "$A/pleio-gather.f32" | head -1))"
    say "$what: $(wc -l <"$dir/rows.txt") row ids and $(stat -c %s "$dir/rows.f32") bytes of f32 rows equal pleio's, bit for bit"
}

check_arch() {
    local arch="$1"
    shift
    A="$W/$arch"
    mkdir -p "$A"
    # outputs of an earlier run must not satisfy this one
    rm -rf "$A/stock" "$A/pleio" "$A/corpus" "$A/eos" "$A"/*.f32 "$A"/*.txt "$A"/*.json
    [ "$arch" != qwen4exp ] || rm -f "$W/tokens.txt" "$W/tokens-eos.txt"
    local model="$A/model.gguf"
    # regenerated when the writer or pleio (its synth tables) changed
    local stamp
    stamp="$(cat "$INTEGRATION_DIR/write_model.py" "$PLEIO" | sha256sum | cut -c1-16)"
    if [ ! -f "$model" ] || [ "$(cat "$A/model.stamp" 2>/dev/null)" != "$stamp" ]; then
        say "$arch: writing the tiny model"
        "$PLEIO" synth --arch "$arch" "$@" --seed 12 --force -o "$A/table.gguf" >/dev/null
        python3 "$INTEGRATION_DIR/write_model.py" --llama-src "$LLAMA_SRC" --table "$A/table.gguf" \
            -o "$model" --force
        rm -f "$A/table.gguf"
        echo "$stamp" >"$A/model.stamp"
    fi

    if [ "$arch" = qwen4exp ]; then
        # pleio tokenizes the corpus with the Qwen tokenizer; gemma4 reuses these ids (< its vocab)
        "$PLEIO" rows "$model" --corpus --json >"$A/corpus.json"
        write_prompt "$A/corpus.json" "$W/tokens.txt"
        write_eos_prompt "$W/tokens.txt" "$W/tokens-eos.txt"
    fi
    check_prompt "$arch" "$model" corpus "$W/tokens.txt"
    check_prompt "$arch" "$model" eos "$W/tokens-eos.txt"
}

# checks 1 and 2 for one model and one prompt; outputs in $A/<prompt>/
check_prompt() {
    local arch="$1" model="$2" name="$3" tokens="$4"
    local what="$arch $name"
    A="$W/$arch/$name"
    rm -rf "$A"
    mkdir -p "$A"
    # the row ids pleio computes for exactly this stream, one per line, token after token
    "$PLEIO" rows "$model" --tokens "$tokens" --json >"$A/pleio-rows.json"
    python3 -c '
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
open(sys.argv[2], "w").write("".join(f"{r}\n" for tok in rows for r in tok))' "$A/pleio-rows.json" "$A/pleio-rows.txt"
    "$PLEIO" gather "$model" --rows-file "$A/pleio-rows.txt" -o "$A/pleio-gather.f32"

    local run=(-m "$model" -t "$tokens" --ubatch "$UBATCH" --lazy on)

    say "$what check 1: stock llama.cpp, lazy mode on (upstream prefetch), ubatch $UBATCH"
    mkdir -p "$A/stock"
    "$DRIVER" "${run[@]}" --capture "$A/stock" --expect-op get_rows
    compare_capture "$A/stock" "$what check 1 (stock get_rows)"

    if [ "$provider" = 0 ]; then
        say "$what check 2 PENDING: no pleio C ABI in this tree (crates/pleio-capi), so no provider build; NOT checked"
        return
    fi
    say "$what check 2: the provider (PLEIO_TABLE=$model), batches of $BATCH, lookahead on"
    # the default (which the provider's log line must name: cached), then the strategy before it
    local s dir
    for s in "" auto; do
        dir="$A/pleio${s:+-$s}"
        mkdir -p "$dir"
        PLEIO_STRATEGY="$s" PLEIO_TABLE="$model" "$DRIVER_PLEIO" "${run[@]}" --batch "$BATCH" --capture "$dir" \
            --expect-op pleio --expect-lookahead --verbose 2>"$dir.log" \
            || { tail -20 "$dir.log" >&2; fail "$what check 2: the provider run failed (PLEIO_STRATEGY=$s)"; }
        grep -q "pleio serves .* (strategy ${s:-cached}," "$dir.log" \
            || fail "$what check 2: the provider did not serve with strategy ${s:-cached} ($(grep -m1 'pleio serves' "$dir.log" || echo 'no "pleio serves" line'))"
        compare_capture "$dir" "$what check 2 (pleio custom op, lookahead, strategy ${s:-cached}${s:+ by PLEIO_STRATEGY})"
    done
    say "$what check 2: logits of every position and $DECODE decode steps, stock and provider"
    "$DRIVER" "${run[@]}" --batch "$BATCH" --decode "$DECODE" --logits "$A/logits-stock.f32"
    PLEIO_TABLE="$model" "$DRIVER_PLEIO" "${run[@]}" --batch "$BATCH" --decode "$DECODE" --logits "$A/logits-pleio.f32" \
        --expect-lookahead
    local size
    size="$(stat -c %s "$A/logits-stock.f32")"
    [ "$size" -gt 0 ] || fail "$what: no logits"
    cmp -s "$A/logits-stock.f32" "$A/logits-pleio.f32" \
        || fail "$what check 2: logits differ ($(cmp "$A/logits-stock.f32" "$A/logits-pleio.f32" | head -1))"
    say "$what check 2: $size bytes of logits ($(wc -w <"$tokens") positions + $DECODE decode steps) equal stock llama.cpp's, bit for bit"
    rm -f "$A/logits-stock.f32" "$A/logits-pleio.f32"

    say "$what check 3: two providers at once on one machine-wide shared cache (PLEIO_STRATEGY=shared)"
    local shm p1 p2
    shm="$(mktemp -d -p /dev/shm pleio-check-XXXXXX)"
    mkdir -p "$A/shared1" "$A/shared2"
    for k in 1 2; do
        PLEIO_STRATEGY=shared PLEIO_SHM_DIR="$shm" PLEIO_SHARED_KEEP=1 PLEIO_TABLE="$model" "$DRIVER_PLEIO" "${run[@]}" \
            --batch "$BATCH" --capture "$A/shared$k" --expect-op pleio --expect-lookahead &
        eval "p$k=\$!"
    done
    wait "$p1" || fail "$what check 3: the first provider failed"
    wait "$p2" || fail "$what check 3: the second provider failed"
    compare_capture "$A/shared1" "$what check 3 (shared cache, process 1)"
    compare_capture "$A/shared2" "$what check 3 (shared cache, process 2)"
    # one segment; every distinct row (and the two the provider checks at open) read once machine-wide
    PLEIO_SHM_DIR="$shm" "$PLEIO" cache stats --json >"$A/shared-stats.json"
    python3 -c '
import json, sys
st = json.load(open(sys.argv[1]))["segments"]
rows = {int(r) for r in open(sys.argv[2]).read().split()}
assert len(st) == 1, f"{len(st)} segments"
s = st[0]
read = s["misses"] + s["uncached"]
assert s["hits"] > 0 and 0 < read <= len(rows) + 2, f"{read} rows read for {len(rows)} distinct, {s}"
hits = s["hits"]
print(f"{hits} hits, {read} rows read from the device for {len(rows)} distinct rows, two processes")
' "$A/shared-stats.json" "$A/pleio-rows.txt" || fail "$what check 3: the shared cache's counters"
    PLEIO_SHM_DIR="$shm" "$PLEIO" cache rm >/dev/null
    rmdir "$shm"
}

check_arch qwen4exp --rows 1M      # 1M (1,048,576) rows of IQ4_NL (90 MiB); writes the prompt
check_arch gemma4 --layers 2       # 262144 rows of 512 Q5_K (88 MiB)
if [ "$provider" = 0 ]; then
    say "done: check 1 passed for qwen4exp and gemma4, corpus and eos prompts; check 2 PENDING (no pleio C ABI)"
    exit 0
fi
# check 4: pleio_decode against ggml's own conversion (to_float; ggml_cpu_f16/bf16_to_fp32) on
# 8192 rows of blocks ggml quantized, every type both decode, bit for bit
[ -x "$DECODE_VS_GGML" ] || fail "$DECODE_VS_GGML was not built"
say "check 4: pleio_decode against ggml's to_float, every type both decode"
"$DECODE_VS_GGML" --rounds 0 >&2 || fail "check 4: a type decodes differently from ggml (above)"
say "done: checks 1, 2 (lookahead on), 3 (shared cache, two processes) and 4 (decode against ggml) passed for qwen4exp and gemma4, corpus and eos prompts"
