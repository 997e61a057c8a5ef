#!/usr/bin/env bash
# pleio inside llama.cpp, correctness (run by .ci/run):
#
#   1. llama's own PLE gather, seen through its eval callback (no patch needed): for a prompt of
#      2,100 tokens of the bundled corpus (with <|endoftext|> resets) prefilled in ubatches of
#      64, llama's row ids equal `pleio rows` and llama's gathered floats equal `pleio gather`,
#      bit for bit.
#   2. the provider patch: with pleio linked and PLEIO_TABLE set, the PLE gather is pleio's
#      custom op (checked through the same callback, same ids and floats), and the logits of
#      every position equal stock llama.cpp's, bit for bit. Needs the pleio C ABI (the
#      pleio-capi crate); without it check 2 is reported PENDING, never passed.
#
#   bash integrations/llama.cpp/check.sh
#
# Builds through build.sh; models and outputs go to $LLAMA_CACHE/work/check (see common.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

N_TOKENS=2100
UBATCH=64
EOT=248044

bash "$INTEGRATION_DIR/build.sh"

W="$LLAMA_WORK/check"
mkdir -p "$W"
# outputs of an earlier run must not satisfy this one
rm -rf "$W/stock" "$W/pleio" "$W"/*.f32 "$W"/*.txt "$W"/*.json

# --- the tiny model around a small synth table -----------------------------------------
# 1M rows (86 MiB); regenerated when the writer or the table generator changed
stamp="$(cat "$INTEGRATION_DIR/write_model.py" "$PLEIO" | sha256sum | cut -c1-16)"
if [ ! -f "$W/tiny.gguf" ] || [ "$(cat "$W/tiny.stamp" 2>/dev/null)" != "$stamp" ]; then
    say "writing the tiny qwen4exp model"
    "$PLEIO" synth --rows 1M --seed 12 --force -o "$W/table.gguf" >/dev/null
    python3 "$INTEGRATION_DIR/write_model.py" --llama-src "$LLAMA_SRC" --table "$W/table.gguf" \
        -o "$W/tiny.gguf" --force
    rm -f "$W/table.gguf"
    echo "$stamp" >"$W/tiny.stamp"
fi
MODEL="$W/tiny.gguf"

# --- the prompt and pleio's answers ------------------------------------------------------
"$PLEIO" rows "$MODEL" --corpus --json >"$W/corpus.json"
python3 - "$W" "$N_TOKENS" "$EOT" <<'EOF'
import json, sys
w, n, eot = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tokens = json.load(open(f"{w}/corpus.json"))["tokens"][:n]
if len(tokens) < n:
    sys.exit(f"the corpus has only {len(tokens)} tokens")
resets = [i for i, t in enumerate(tokens) if t == eot]
if not resets or resets[0] < 64 or resets[-1] > n - 64:
    sys.exit(f"want an end-of-text reset well inside the prompt, found at {resets}")
open(f"{w}/tokens.txt", "w").write(" ".join(map(str, tokens)) + "\n")
print(f"prompt: {n} corpus tokens, end-of-text resets at {resets}", file=sys.stderr)
EOF
# the row ids pleio computes for exactly this stream, one per line, token after token
"$PLEIO" rows "$MODEL" --tokens "$W/tokens.txt" --json >"$W/pleio-rows.json"
python3 - "$W" <<'EOF'
import json, sys
w = sys.argv[1]
rows = json.load(open(f"{w}/pleio-rows.json"))["rows"]
open(f"{w}/pleio-rows.txt", "w").write("".join(f"{r}\n" for tok in rows for r in tok))
EOF
"$PLEIO" gather "$MODEL" --rows-file "$W/pleio-rows.txt" -o "$W/pleio-gather.f32"

# compare one capture (DIR/rows.txt, DIR/rows.f32) with pleio's answers
compare_capture() {
    local dir="$1" what="$2"
    cmp -s "$dir/rows.txt" "$W/pleio-rows.txt" \
        || fail "$what: llama's PLE row ids differ from pleio rows ($(diff "$dir/rows.txt" "$W/pleio-rows.txt" | head -3 | tr '\n' ' '))"
    cmp -s "$dir/rows.f32" "$W/pleio-gather.f32" \
        || fail "$what: llama's gathered rows differ from pleio gather ($(cmp "$dir/rows.f32" "$W/pleio-gather.f32" | head -1))"
    say "$what: $(wc -l <"$dir/rows.txt") row ids and $(stat -c %s "$dir/rows.f32") bytes of f32 rows equal pleio's, bit for bit"
}

# --- check 1: stock llama.cpp -------------------------------------------------------------
say "check 1: stock llama.cpp, lazy mode on (upstream prefetch), ubatch $UBATCH"
mkdir -p "$W/stock"
"$DRIVER" -m "$MODEL" -t "$W/tokens.txt" --ubatch "$UBATCH" --lazy on \
    --capture "$W/stock" --expect-op get_rows
compare_capture "$W/stock" "check 1 (stock get_rows)"

# --- check 2: the provider patch --------------------------------------------------------
if [ ! -x "$DRIVER_PLEIO" ]; then
    if have_capi_crate; then
        fail "the workspace has crates/pleio-capi but $DRIVER_PLEIO was not built"
    fi
    say "check 2 PENDING: no pleio C ABI in this tree (crates/pleio-capi), so no provider build; NOT checked"
    exit 0
fi
say "check 2: the provider (PLEIO_TABLE=$MODEL), same prompt"
mkdir -p "$W/pleio"
PLEIO_TABLE="$MODEL" "$DRIVER_PLEIO" -m "$MODEL" -t "$W/tokens.txt" --ubatch "$UBATCH" --lazy on \
    --capture "$W/pleio" --expect-op pleio
compare_capture "$W/pleio" "check 2 (pleio custom op)"
say "check 2: logits of every position, stock and provider"
"$DRIVER" -m "$MODEL" -t "$W/tokens.txt" --ubatch "$UBATCH" --lazy on --logits "$W/logits-stock.f32"
PLEIO_TABLE="$MODEL" "$DRIVER_PLEIO" -m "$MODEL" -t "$W/tokens.txt" --ubatch "$UBATCH" --lazy on \
    --logits "$W/logits-pleio.f32"
size="$(stat -c %s "$W/logits-stock.f32")"
[ "$size" -gt 0 ] || fail "no logits"
cmp -s "$W/logits-stock.f32" "$W/logits-pleio.f32" \
    || fail "check 2: logits differ ($(cmp "$W/logits-stock.f32" "$W/logits-pleio.f32" | head -1))"
say "check 2: $size bytes of logits ($N_TOKENS positions) equal stock llama.cpp's, bit for bit"
rm -f "$W/logits-stock.f32" "$W/logits-pleio.f32"
