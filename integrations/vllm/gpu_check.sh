#!/usr/bin/env bash
# The vLLM plugin's GPU proof, for a machine with a CUDA GPU (not run by
# .ci/run: CI has no GPU). Same venv and installs as check.sh, then
# gpu_check.py: the pinned-host table class's _lookup served by pleio (D2H
# ids, host-node gather into pinned staging, H2D rows on the prefetch
# stream), bit for bit with the stock UVA kernel, captured in a CUDA graph,
# and greedy generation with CUDA graphs on.
#
#   integrations/vllm/gpu_check.sh [--work DIR]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${PLEIO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pleio}
VENV=$CACHE/vllm-venv
VLLM=${PLEIO_VLLM_VERSION:-0.33.0}
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
if [ ! -e "$VENV/.pleio-vllm-$VLLM" ]; then
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet "vllm==$VLLM"
    touch "$VENV/.pleio-vllm-$VLLM"
fi
export CARGO_TARGET_DIR=${PLEIO_PY_TARGET_DIR:-$CACHE/target-py}
"$VENV/bin/python" -m pip install --quiet --force-reinstall --no-deps "$ROOT/crates/pleio-py" "$ROOT/integrations/vllm"
unset PLEIO_VLLM_PATH PLEIO_VLLM_STRATEGY PLEIO_VLLM_BUDGET
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
exec "$VENV/bin/python" "$ROOT/integrations/vllm/gpu_check.py" "$@"
