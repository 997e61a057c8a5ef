#!/usr/bin/env bash
# Checks pleio's rounding rules (`pleio gather --rounding exact|vllm|mlx`)
# bit for bit against the engines' own arithmetic: torch's
# `w.to(dtype) * scale.to(dtype)` (vLLM, SGLang) on FP8 checkpoints and
# mlx's `mx.dequantize` on an MLX 4-bit checkpoint (scripts/rounding_check.py).
#
#   scripts/rounding_check.sh PATH/TO/pleio
#
# Runs in the torch venv of integrations/transformers/venv.sh, adding
# mlx==0.32.4 + mlx-cpu==0.32.4 to it if missing. Prints SKIPPED (and
# exits 0) when that venv or mlx cannot be installed; exits 1 on any
# mismatch, 2 on a usage error.
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: $0 PATH/TO/pleio" >&2
    exit 2
fi
PLEIO=$(realpath "$1")
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PIP_ROOT_USER_ACTION=ignore
if ! PY=$(bash "$ROOT/integrations/transformers/venv.sh"); then
    echo "rounding_check: SKIPPED: the torch venv could not be made (integrations/transformers/venv.sh failed)"
    exit 0
fi
if ! "$PY" -c "import mlx.core" 2>/dev/null; then
    if ! "$PY" -m pip install --quiet --disable-pip-version-check \
        mlx==0.32.4 mlx-cpu==0.32.4 >&2 || ! "$PY" -c "import mlx.core" 2>/dev/null; then
        echo "rounding_check: SKIPPED: mlx==0.32.4 and mlx-cpu==0.32.4 could not be installed in $PY's venv"
        exit 0
    fi
fi
exec "$PY" "$ROOT/scripts/rounding_check.py" --pleio "$PLEIO"
