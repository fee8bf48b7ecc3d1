"""A base model on a real `gmlx serve`: the test Gemma 3 270M has no chat template in its GGUF, so it never
learned `<end_of_turn>`; the turn opener it would write next (`<start_of_turn>`, its own control token) ends
its turn, on the OpenAI and Anthropic protocols, and a request that names no cap ends at default_max_tokens."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from tests.conftest import gemma_path
from tests.e2e.server import LiveServer, gmlx_serve

pytestmark = pytest.mark.slow
START_OF_TURN = 105  # Gemma's <start_of_turn>; the bias makes it the model's first choice
OPENER = {str(START_OF_TURN): 100}
CAP = 12


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("base")
    cfg = tmp / "gmlx.yaml"
    cfg.write_text(f"models:\n  gemma:\n    path: {gemma_path()}\n    default_max_tokens: {CAP}\n")
    with gmlx_serve(["--config", str(cfg)], tmp) as s:
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
