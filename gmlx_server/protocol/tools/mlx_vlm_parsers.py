"""mlx-vlm's tool-call parser modules (mlx_vlm/tools/parsers), loaded for their body parsing.

Importing them normally runs mlx_vlm/__init__, which pulls in transformers and fastapi (~15 s on
our CPUs) although the parser files import only json/regex/ast; so unless mlx_vlm is already loaded
(the server's case), the file is loaded alone, with a normal import as the fallback.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import sys
from pathlib import Path
from types import ModuleType

log = logging.getLogger("gmlx.tools")


@functools.cache
def mlx_vlm_parser(name: str) -> ModuleType:
    full = f"mlx_vlm.tools.parsers.{name}"
    if "mlx_vlm.tools" in sys.modules:
        return importlib.import_module(full)
    package = importlib.util.find_spec("mlx_vlm")  # locates the package without importing it
    if package is None or not package.submodule_search_locations:
        raise ImportError("mlx-vlm is not installed")
    path = Path(next(iter(package.submodule_search_locations))) / "tools" / "parsers" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"gmlx_server.protocol.tools._mlx_vlm_{name}", path)
    if spec is None or spec.loader is None:
        return _slow_import(full, f"no loader for {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as e:  # a future parser with package-relative imports: take the slow road
        return _slow_import(full, str(e))
    return module


def _slow_import(full: str, why: str) -> ModuleType:
    """Said once per parser (the caller is cached): the import below loads all of mlx_vlm, seconds of CPU."""
    log.info("tool parser %s cannot load alone (%s): importing the mlx_vlm package", full, why)
    return importlib.import_module(full)
