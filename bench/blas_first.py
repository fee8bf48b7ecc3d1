"""Imported first by the benches that run MLX in this process: OpenBLAS (or GMLX_BLAS's choice) before
mlx loads, as gmlx's entry points do (gmlx_server/startup.py)."""

from gmlx_server.startup import preload_blas

BLAS = preload_blas()
