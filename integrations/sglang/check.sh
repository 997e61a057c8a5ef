#!/usr/bin/env bash
# The SGLang plugin's CPU proof: makes the SGLang venv outside the clone
# (venv.sh: ${PLEIO_CACHE_DIR:-~/.cache/pleio}/sglang-venv, sglang 0.5.23
# with the torch and transformers it pins, without its GPU kernel
# packages), installs the Python package (crates/pleio-py) and the plugin
# (integrations/sglang) into it the way a user does, and runs check.py:
# SGLang's own PLE module is built and loaded on CPU for tiny qwen4exp
# models, stock and with the plugin, and must compute the same bits.
#
#   integrations/sglang/check.sh [--rss] [--json OUT]
#
# --rss also measures peak RSS against stock on a model whose table is over
# 1 GiB. Says SKIPPED (exit 0) with the reason when SGLang cannot be
# installed, never "passed"; exits 1 when any check fails.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${PLEIO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pleio}
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
status=0
PY=$(bash "$ROOT/integrations/sglang/venv.sh") || status=$?
if [ "$status" -ne 0 ]; then
    echo "SGLang check: SKIPPED (the SGLang venv could not be made, exit $status)"
    exit 0
fi
export CARGO_TARGET_DIR=${PLEIO_PY_TARGET_DIR:-$CACHE/target-py}
echo "SGLang check: pip install crates/pleio-py and integrations/sglang into $(dirname "$(dirname "$PY")")"
nice -n 19 "$PY" -m pip install --quiet --force-reinstall --no-deps "$ROOT/crates/pleio-py"
nice -n 19 "$PY" -m pip install --quiet --force-reinstall --no-deps "$ROOT/integrations/sglang"
# Triton's interpreter runs SGLang's stock gather kernel on CPU.
export TRITON_INTERPRET=1 HF_HUB_OFFLINE=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1 TOKENIZERS_PARALLELISM=false \
    PYTHONWARNINGS=ignore
unset PLEIO_SGLANG_PATH PLEIO_SGLANG_STRATEGY PLEIO_SGLANG_BUDGET
exec "$PY" "$ROOT/integrations/sglang/check.py" "$@"
