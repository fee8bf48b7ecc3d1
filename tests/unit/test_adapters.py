"""Dynamic attribute access (getattr/hasattr/setattr/delattr) lives in the two adapters, engine/mlx_adapter.py
and engine/vlm_adapter.py, and nowhere else in the product but the few reasoned cases below (issue 31 item 2):
gmlx's own types are read through their typed fields, MLX's and mlx-vlm's through named functions."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("gmlx_server", "gmlx_plan", "gmlx_top")
ADAPTERS = {"gmlx_server/engine/mlx_adapter.py", "gmlx_server/engine/vlm_adapter.py"}
PROBES = {"getattr", "hasattr", "setattr", "delattr"}
ALLOWED = {  # (file, the call as written): why it is not a probe
    ("gmlx_server/config/parse.py", "getattr(d, k)"):
        "a ServerSettings field's default, read by the name the kinds table gives it",
    ("gmlx_server/engine/types.py", "hasattr(engine, name)"):
        "check_engine itself: the structural check that refuses an incomplete engine by name at load",
    ("gmlx_server/engine/kernels/__init__.py", "hasattr(ext, f)"):
        "a compiled extension on disk built from older sources is known by the functions it lacks",
    ("gmlx_server/log_format.py", "getattr(record, FIELDS, None)"):
        "logging's extra= sets fields as LogRecord attributes: the stdlib's one way to read them back",
}


def probes(source: str) -> list[tuple[int, str]]:
    """(line, call text) of every getattr/hasattr/setattr/delattr call in a module's source."""
    tree = ast.parse(source)
    return [(node.lineno, ast.get_source_segment(source, node) or "") for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in PROBES]


def stray_probes(root: Path) -> list[str]:
    out = []
    for package in PRODUCT:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in ADAPTERS:
                continue
            out += [f"{rel}:{line}: {call}" for line, call in probes(path.read_text())
                    if (rel, call) not in ALLOWED]
    return out


def test_no_probe_outside_the_adapters() -> None:
    assert stray_probes(ROOT) == []


def test_every_allowed_probe_is_still_there() -> None:
    """An allow-list entry whose call is gone is removed too, so the list cannot grow stale."""
    found = {(rel, call) for rel, _ in ALLOWED for _, call in probes((ROOT / rel).read_text())}
    assert set(ALLOWED) <= found


def test_a_new_probe_is_caught(tmp_path: Path) -> None:
    (tmp_path / "gmlx_server").mkdir()
    (tmp_path / "gmlx_server" / "x.py").write_text("def f(m):\n    return getattr(m, 'norm', None)\n")
    for package in PRODUCT[1:]:
        (tmp_path / package).mkdir()
    assert stray_probes(tmp_path) == ["gmlx_server/x.py:2: getattr(m, 'norm', None)"]


@pytest.mark.parametrize(("family", "config"), [("qwen2", "ModelConfig"), ("gemma3", "TextConfig"),
                                                 ("llama", "ModelConfig")])
def test_the_vlm_adapter_reads_each_family(family: str, config: str) -> None:
    from mlx_vlm.models.base import scaled_dot_product_attention

    from gmlx_server.engine import vlm_adapter

    assert vlm_adapter.config_class(family).__name__ == config
    cls = vlm_adapter.language_model_class(family)
    assert vlm_adapter.family_module_of(cls.__new__(cls)) == family
    attention = importlib.import_module(f"mlx_vlm.models.{family}.language").Attention
    assert vlm_adapter.calls_attention(attention) and not vlm_adapter.calls_attention(cls)
    assert vlm_adapter.family_attention(attention) is scaled_dot_product_attention
