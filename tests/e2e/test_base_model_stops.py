"""A base model on a real `gmlx serve`: the test Gemma 3 270M has no chat template in its GGUF, so it never
learned `<end_of_turn>`; the turn opener it would write next (`<start_of_turn>`, its own control token) ends
its turn, on the OpenAI and Anthropic protocols, and a request that names no cap ends at default_max_tokens.
/v1/models says it is a base model, and `gmlx launch` refuses it up front unless a profile gives it stop strings."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.conftest import gemma_path, smollm2_path
from tests.e2e.server import ROOT, LiveServer, serve_config

pytestmark = pytest.mark.slow
START_OF_TURN = 105  # Gemma's <start_of_turn>; the bias makes it the model's first choice
OPENER = {str(START_OF_TURN): 100}
CAP = 12


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with serve_config(tmp_path_factory.mktemp("base"),
                      f"models:\n  gemma:\n    path: {gemma_path()}\n    default_max_tokens: {CAP}\n"
                      f"  smollm2:\n    path: {smollm2_path()}\n    tool_prompt_budget: 0.25\n"
                      'profiles:\n  oneline: {stop: ["\\n"]}\naliases:\n  gemma-oneline: gemma@oneline\n') as s:
        yield s


def test_opening_the_next_turn_ends_this_one_over_openai(oai: openai.OpenAI) -> None:
    r = oai.chat.completions.create(model="gemma", max_tokens=8, temperature=0, logit_bias=OPENER,
                                    messages=[{"role": "user", "content": "Say hi"}])
    assert r.usage is not None and (r.choices[0].finish_reason, r.usage.completion_tokens) == ("stop", 1)
    assert r.choices[0].message.content == ""  # the opener is not text of the reply


def test_opening_the_next_turn_ends_this_one_over_anthropic(claude: anthropic.Anthropic) -> None:
    r = claude.messages.create(model="gemma", max_tokens=8, messages=[
        {"role": "user", "content": "Say hi"}], extra_body={"logit_bias": OPENER})
    assert (r.stop_reason, r.usage.output_tokens) == ("end_turn", 1)


def test_a_turn_without_a_cap_ends_at_the_models_default(oai: openai.OpenAI) -> None:
    # Greedy, the base model repeats "Say hi mendatanguser" and never opens a turn: only the cap ends it
    r = oai.chat.completions.create(model="gemma", temperature=0, messages=[{"role": "user", "content": "Say hi"}])
    assert r.usage is not None and (r.choices[0].finish_reason, r.usage.completion_tokens) == ("length", CAP)


def test_models_say_which_is_a_base_model_its_stops_and_tool_budget(server: LiveServer) -> None:
    rows = {r["id"]: r for r in httpx.get(server.v1 + "/models", timeout=30).json()["data"]}
    assert [(rows[m]["base"], rows[m]["stop"]) for m in ("gemma", "smollm2", "gemma-oneline")] == [
        (True, []), (False, []), (True, ["\n"])]
    assert (rows["gemma"]["tool_prompt_budget"], rows["smollm2"]["tool_prompt_budget"]) == (0.5, 0.25)


def launch(server: LiveServer, tmp_path: Path, model: str) -> subprocess.CompletedProcess[str]:
    """`gmlx launch pi --dry-run` with a stand-in pi on PATH: launch's checks, no client run (pi's 1.5K-token
    prompt fits SmolLM2's window; Claude Code's takes more than half of it)."""
    (tmp_path / "pi").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "pi").chmod(0o755)
    return subprocess.run([sys.executable, "-m", "gmlx_server.cli", "launch", "pi", "--model", model, "--url",
                           server.base_url, "--dry-run"], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin", "HOME": str(tmp_path)})


def test_launch_refuses_a_base_model_without_stops_naming_one_that_ends_its_turns(server: LiveServer,
                                                                                    tmp_path: Path) -> None:
    proc = launch(server, tmp_path, "gemma")
    assert proc.returncode == 2, proc.stderr
    assert "'gemma' is a base model" in proc.stderr and "served models that fit: smollm2" in proc.stderr
    assert "clamp" not in proc.stderr  # no switch that cannot help
    for address in ("gemma@oneline", "gemma-oneline"):  # a profile's stop strings end its turns
        proc = launch(server, tmp_path, address)
        assert proc.returncode == 0 and "base model" not in proc.stderr, proc.stderr
