#!/usr/bin/env bash
# pleio's row decoders against ggml's, speed (not CI; check.sh runs the same program's bit check):
# one ubatch of rows of every type both decode, decoded to f32 by ggml's CPU path (the type's
# to_float from ggml-base; ggml_cpu_fp16_to_fp32 / ggml_cpu_bf16_to_fp32 from ggml-cpu, as its
# get_rows does) and by pleio_decode, alternately in one process, beside a memset of the same
# output bytes (the stores alone: no decode to f32 can beat it). Prints a table on stderr and the
# JSON report on stdout:
#
#   bash integrations/llama.cpp/decode.sh [--rows 8192] [--rounds 41] [--types IQ4_NL,Q8_0,...]
#
# ggml here is the tree vendored in llama-cpp-python 0.3.36, built by build.sh (AVX2/FMA/F16C,
# ggml-base at the compiler's baseline as every ggml build compiles it). For docs/reports:
#
#   python3 scripts/reportmeta.py --out docs/reports/decode-vs-ggml-8192.json -- \
#       bash integrations/llama.cpp/decode.sh --rows 8192
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --rows|--rounds|--types) args+=("$1" "$2"); shift 2 ;;
        *) fail "unknown argument $1 (see the top of decode.sh)" ;;
    esac
done

bash "$INTEGRATION_DIR/build.sh" >&2
[ -x "$DECODE_VS_GGML" ] || fail "decode.sh needs the pleio C ABI: $DECODE_VS_GGML was not built"
report="$(mktemp)"
trap 'rm -f "$report"' EXIT
"$DECODE_VS_GGML" "${args[@]}" --json "$report" >&2
cat "$report"
