"""The engine: GGUF models on MLX. Never imports falcon, prometheus_client or the protocol layer."""

from gmlx_server.engine.blas import prefer_openblas

# OpenBLAS must be in front of the reference BLAS before mlx is first imported (see blas.py).
prefer_openblas()
