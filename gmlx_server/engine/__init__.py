"""The engine: GGUF models on MLX. Never imports falcon, prometheus_client or the protocol layer.

Importing it has no side effects: the entry points preload OpenBLAS before mlx (gmlx_server/startup.py).
"""
