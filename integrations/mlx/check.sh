#!/usr/bin/env bash
# The mlx-vlm proof on Linux CPU: makes the mlx-vlm venv outside the clone
# (venv.sh: ${PLEIO_CACHE_DIR:-~/.cache/pleio}/mlx-venv, mlx + mlx-cpu
# 0.32.4 and mlx-vlm 0.7.10, torch and transformers from the torch venv),
# installs the Python package (crates/pleio-py) and pleio-mlx
# (integrations/mlx) into it the way a user does, and runs check.py:
# mlx-vlm's own PLE module, stock and served by pleio, must give the same
# bits.
#
#   integrations/mlx/check.sh [--json OUT]
#
# Says SKIPPED (exit 0) with the reason when mlx-vlm cannot be installed,
# never "passed"; exits 1 when any check fails.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${PLEIO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pleio}
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
status=0
PY=$(bash "$ROOT/integrations/mlx/venv.sh") || status=$?
if [ "$status" -ne 0 ]; then
    echo "MLX check: SKIPPED (the mlx-vlm venv could not be made, exit $status)"
    exit 0
fi
export CARGO_TARGET_DIR=${PLEIO_PY_TARGET_DIR:-$CACHE/target-py}
echo "MLX check: pip install crates/pleio-py and integrations/mlx into $(dirname "$(dirname "$PY")")"
nice -n 19 "$PY" -m pip install --quiet --force-reinstall --no-deps "$ROOT/crates/pleio-py"
nice -n 19 "$PY" -m pip install --quiet --force-reinstall --no-deps "$ROOT/integrations/mlx"
export HF_HUB_OFFLINE=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1 TOKENIZERS_PARALLELISM=false PYTHONWARNINGS=ignore
unset PLEIO_MLX_PATH PLEIO_MLX_STRATEGY PLEIO_MLX_BUDGET
exec "$PY" "$ROOT/integrations/mlx/check.py" "$@"
