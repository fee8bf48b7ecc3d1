"""The CPU layout without the kernels: dense fp32 only when it fits beside a full window's KV, else packed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gmlx_plan.gguf_header import read_header
from gmlx_plan.memory import kv_bytes, model_from_header
from gmlx_server.engine import layout
from tests.conftest import smollm2_path


@pytest.fixture
def openblas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layout, "current_blas", lambda: SimpleNamespace(name="openblas", note=""))


def _need() -> int:
    m = model_from_header(read_header(smollm2_path(), strings=False), "dense")
    return m.weights_bytes + kv_bytes(m, m.geometry.context_length)


def test_dense_when_it_fits(openblas: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layout, "available_memory", lambda: 2 * _need())
    header = read_header(smollm2_path(), strings=False)
    assert layout.choose_layout("auto", on_gpu=False, native=False, header=header)[0] == "dense"


def test_packed_with_the_reason_when_dense_does_not_fit(openblas: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layout, "available_memory", lambda: _need() - 1)
    header = read_header(smollm2_path(), strings=False)
    chosen, why = layout.choose_layout("auto", on_gpu=False, native=False, header=header)
    assert chosen == "packed" and "GB available" in why and "dense fp32" in why


def test_a_configured_layout_is_kept_whatever_it_needs(openblas: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layout, "available_memory", lambda: 1)
    header = read_header(smollm2_path(), strings=False)
    assert layout.choose_layout("dense", on_gpu=False, native=False, header=header) == ("dense", "configured")
