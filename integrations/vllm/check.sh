#!/usr/bin/env bash
# The vLLM plugin's CPU proof (run by .ci/run): makes the vLLM venv outside
# the clone (${PLEIO_CACHE_DIR:-~/.cache/pleio}/vllm-venv for the default
# vllm 0.33.0, vllm-$PLEIO_VLLM_VERSION-venv for another: vllm from the
# package registry, which brings PyPI torch and the transformers it pins),
# installs the Python package (crates/pleio-py) and the plugin
# (integrations/vllm) into it the way a user does, and runs check.py: vLLM's
# own engine builds and loads tiny qwen4exp models on CPU, stock and with
# the plugin, and their PLE modules must compute the same bits.
#
#   [PLEIO_VLLM_VERSION=0.33.0] integrations/vllm/check.sh [--rss] [--json OUT]
#
# --rss also measures peak RSS of the engine against stock on a model whose
# table is over 1 GiB. Says SKIPPED (exit 0) with the reason when vLLM
# cannot be installed, never "passed"; exits 1 when any check fails.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${PLEIO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pleio}
VLLM_DEFAULT=0.33.0
VLLM=${PLEIO_VLLM_VERSION:-$VLLM_DEFAULT}
if [ "$VLLM" = "$VLLM_DEFAULT" ]; then VENV=$CACHE/vllm-venv; else VENV=$CACHE/vllm-$VLLM-venv; fi
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$CACHE"
stamp="$VENV/.pleio-vllm-$VLLM"
if [ ! -e "$stamp" ]; then
    t0=$(date +%s)
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    if ! "$VENV/bin/python" -m pip install --quiet "vllm==$VLLM" >&2; then
        echo "vLLM check: SKIPPED (pip install vllm==$VLLM failed: see above)"
        exit 0
    fi
    touch "$stamp"
    echo "vLLM check: installed vllm==$VLLM in $(( $(date +%s) - t0 )) s, $(du -sh "$VENV" | cut -f1)"
fi
PY=$VENV/bin/python
export CARGO_TARGET_DIR=${PLEIO_PY_TARGET_DIR:-$CACHE/target-py}
echo "vLLM check: pip install crates/pleio-py and integrations/vllm into $VENV"
# maturin moves the built library out of the shared target directory: two
# builds at once (two versions checked in parallel) race on it, so one waits.
mkdir -p "$CARGO_TARGET_DIR"
flock "$CARGO_TARGET_DIR/.pleio-py-build.lock" \
    "$PY" -m pip install --quiet --force-reinstall --no-deps "$ROOT/crates/pleio-py"
"$PY" -m pip install --quiet --force-reinstall --no-deps "$ROOT/integrations/vllm"
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 VLLM_HOST_IP=127.0.0.1 \
    HF_HUB_OFFLINE=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1 TOKENIZERS_PARALLELISM=false \
    VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
unset PLEIO_VLLM_PATH PLEIO_VLLM_STRATEGY PLEIO_VLLM_BUDGET
exec "$PY" "$ROOT/integrations/vllm/check.py" "$@"
