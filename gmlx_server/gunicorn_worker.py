"""`gunicorn -k gmlx_server.gunicorn_worker.UvicornWorker -w 1 ... gmlx_server.asgi:app`: uvicorn's gunicorn worker
with the connection limits `gmlx serve` sets (request head deadline and size)."""

from __future__ import annotations

from typing import Any

from uvicorn_worker import UvicornWorker as _UvicornWorker

from gmlx_server.config import read_env
from gmlx_server.header_timeout import uvicorn_limits


class UvicornWorker(_UvicornWorker):  # type: ignore[misc]  # uvicorn_worker ships no type hints
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Per instance, read when the worker starts: the base class merges CONFIG_KWARGS into its Config.
        self.CONFIG_KWARGS = {**_UvicornWorker.CONFIG_KWARGS, **uvicorn_limits(read_env().header_timeout_s)}
        super().__init__(*args, **kwargs)
