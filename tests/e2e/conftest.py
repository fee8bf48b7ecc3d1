"""The SDK clients of a module's `server` fixture (each e2e module that serves a model defines `server`), and
the plain server the modules that need nothing else share."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from tests.e2e.server import LiveServer, anthropic_client, gmlx_serve, openai_client


@pytest.fixture(scope="package")
def default_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """`gmlx serve` with no arguments (the embedded SmolLM2, default settings), started once for every module
    that asks for it: each start costs about 10 s on two cores."""
    with gmlx_serve([], tmp_path_factory.mktemp("default-serve")) as s:
        yield s


@pytest.fixture(scope="module")
def oai(server: LiveServer) -> openai.OpenAI:
    return openai_client(server)


@pytest.fixture(scope="module")
def claude(server: LiveServer) -> anthropic.Anthropic:
    return anthropic_client(server)
