"""The ASGI target: `uvicorn gmlx_server.asgi:app` or `gunicorn -k uvicorn_worker.UvicornWorker ...`.

Config comes from the environment (GMLX_CONFIG, else GMLX_MODEL, else the embedded default).
Importing is cheap: engines load on a model's first request. Run one worker per model host:
each worker would load its own copy of every model and its own KV memory.
"""

from __future__ import annotations

import sys

from gmlx_server.app import GmlxApp, create_app
from gmlx_server.config import ConfigError, load_config_from_env
from gmlx_server.serving.model_files import check_drafts
from gmlx_server.startup import prepare_process


def _build() -> GmlxApp:
    try:
        config = check_drafts(load_config_from_env())
        prepare_process(config)  # OpenBLAS before mlx loads with the first engine
        return create_app(config)
    except ConfigError as e:
        print(f"gmlx: {e}", file=sys.stderr)
        raise SystemExit(2) from None


app = _build()
