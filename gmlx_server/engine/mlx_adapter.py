"""Every name gmlx looks up by string on MLX itself (mlx.core, mlx.nn), in one place.

The rest of the tree calls these typed functions instead of getattr/hasattr/setattr on MLX objects
(tests/unit/test_adapters.py holds the rule), so an MLX upgrade that moves a name breaks here, by name.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def mlx_version() -> str:
    return str(getattr(mx, "__version__", "?"))


def dtype_named(name: str) -> mx.Dtype:
    """float32/float16/bfloat16 by name (a config's compute type)."""
    if name not in _DTYPES:
        raise ValueError(f"no MLX float dtype named {name!r}: {', '.join(_DTYPES)}")
    return _DTYPES[name]


def child(module: nn.Module, name: str) -> Any | None:
    """A module's attribute `name` (a submodule, an array or a plain value), None when it has none."""
    return getattr(module, name, None)


def set_child(module: nn.Module, name: str, new: nn.Module) -> None:
    setattr(module, name, new)


def module_at(root: nn.Module, path: str) -> Any:
    """The submodule at a dotted parameter path ("model.layers.3.mlp"): list entries by index."""
    node: Any = root
    for p in path.split(".") if path else ():
        node = node[int(p)] if p.isdigit() else getattr(node, p)
    return node


def replace_module(root: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    set_child(module_at(root, parent), name, new)
