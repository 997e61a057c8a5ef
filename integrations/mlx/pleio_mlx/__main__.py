"""``python -m pleio_mlx SUBCOMMAND ...``: mlx-vlm's CLI (``python -m
mlx_vlm SUBCOMMAND ...``) with pleio serving the PLE tables (configured by
``PLEIO_MLX_PATH`` or config.json, see :mod:`pleio_mlx`)."""

import runpy
import sys


def main() -> None:
    from .plugin import patch

    patch()
    sys.argv[0] = "mlx_vlm"
    runpy.run_module("mlx_vlm", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
