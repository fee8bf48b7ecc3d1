"""Fixtures shared by the unit tests."""

from __future__ import annotations

import shutil
from types import ModuleType

import pytest

from gmlx_server.engine.kernels import probe


@pytest.fixture(scope="module")
def ext() -> ModuleType:
    """The CPU kernels extension: skipped where no compiler could build it, a failure where one could."""
    status = probe()
    if status.ext is None:
        if shutil.which("c++") is None or shutil.which("cmake") is None:
            pytest.skip(f"no compiler to build the kernels: {status.reason}")
        pytest.fail(f"the kernels should be built here: {status.reason}")
    return status.ext
