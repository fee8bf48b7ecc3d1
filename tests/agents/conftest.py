"""One `gmlx serve` for the whole agents directory: the three chat test models of the harness matrix
(tests/agents/matrix.py), loaded as the tests first name them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.agents.harness import config_server
from tests.agents.matrix import matrix_config
from tests.conftest import gemma_path, qwen_coder_path, smollm2_path
from tests.e2e.server import LiveServer


@pytest.fixture(scope="session")
def agents_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    paths = {"smollm2": smollm2_path(), "gemma": gemma_path(), "qwen": qwen_coder_path("0.5b")}
    with config_server(tmp_path_factory.mktemp("agents"), matrix_config(paths)) as server:
        yield server

