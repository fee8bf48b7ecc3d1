"""First on PYTHONPATH for the gmlx processes the tests start (tests/e2e/server.py's production_env): torch
is hidden as if not installed, as in a production install. The test set-up installs torch for the
transformers reference only, and mlx-vlm's transformers import would load it into every server (3-5 s a
start). A test's own sitecustomize further along PYTHONPATH (a fault hook, a network guard) still runs."""

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

sys.modules["torch"] = None  # type: ignore[assignment]  # import torch: ModuleNotFoundError; find_spec: None

_here = Path(__file__).resolve().parent
_rest = [p for p in sys.path if Path(p or ".").resolve() != _here]
_next = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _next is not None and _next.loader is not None:
    _module = importlib.util.module_from_spec(_next)
    sys.modules["sitecustomize"] = _module
    _next.loader.exec_module(_module)
