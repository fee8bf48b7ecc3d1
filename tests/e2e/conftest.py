"""The SDK clients of a module's `server` fixture (each e2e module that serves a model defines `server`)."""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.e2e.server import LiveServer, anthropic_client, openai_client


@pytest.fixture(scope="module")
def oai(server: LiveServer) -> openai.OpenAI:
    return openai_client(server)


@pytest.fixture(scope="module")
def claude(server: LiveServer) -> anthropic.Anthropic:
    return anthropic_client(server)
