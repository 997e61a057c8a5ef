#!/usr/bin/env bash
# Makes (once) the mlx-vlm venv the MLX check runs in, outside the clone:
# ${PLEIO_CACHE_DIR:-~/.cache/pleio}/mlx-venv with mlx + mlx-cpu 0.32.4 (MLX
# on Linux CPU) and mlx-vlm 0.7.10 (--no-deps, then the few packages its
# model loading imports). torch and transformers (to write the tiny models
# mlx-vlm converts) come from the torch venv (integrations/transformers/
# venv.sh) through a .pth file, so nothing is installed twice and nothing
# into the shared torch venv; PLEIO_MLX_BASE_PY names another python to
# take them from.
#
#   integrations/mlx/venv.sh      # prints the venv's python on success
#
# Exits 3 (and says why) when the packages cannot be installed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${PLEIO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pleio}
VENV=$CACHE/mlx-venv
MLX=${PLEIO_MLX_VERSION:-0.32.4}
MLX_VLM=${PLEIO_MLX_VLM_VERSION:-0.7.10}
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
BASE=${PLEIO_MLX_BASE_PY:-}
if [ -z "$BASE" ]; then
    BASE=$(bash "$ROOT/integrations/transformers/venv.sh") || { echo "venv.sh: no torch venv" >&2; exit 3; }
fi
mkdir -p "$CACHE"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" >&2
base_site=$("$BASE" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
own_site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$base_site" >"$own_site/pleio-base-venv.pth"
stamp="$VENV/.pleio-mlx-$MLX-mlx-vlm-$MLX_VLM"
if [ ! -e "$stamp" ]; then
    t0=$(date +%s)
    PIP=(nice -n 19 "$VENV/bin/python" -m pip install --quiet)
    if ! "${PIP[@]}" "mlx==$MLX" "mlx-cpu==$MLX" numpy safetensors==0.8.0 pillow requests jinja2 tqdm \
        huggingface_hub >&2 || ! "${PIP[@]}" --no-deps "mlx-vlm==$MLX_VLM" >&2; then
        echo "venv.sh: could not install mlx==$MLX mlx-vlm==$MLX_VLM" >&2
        exit 3
    fi
    touch "$stamp"
    echo "mlx venv: installed in $(( $(date +%s) - t0 )) s, $(du -sh "$VENV" | cut -f1)" >&2
fi
echo "$VENV/bin/python"
