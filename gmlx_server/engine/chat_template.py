"""Chat templates, rendered the way transformers' `apply_chat_template` renders them.

Same sandboxed jinja environment (trim_blocks, lstrip_blocks, loopcontrols, `raise_exception`,
`strftime_now`, a `tojson` that keeps non-ASCII text), same inputs (messages without None
values, tools, add_generation_prompt, bos/eos tokens, any extra variables). The template comes
from the config override, the GGUF, or a built-in one for the model family.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from gmlx_plan.families import LLAMA, family_of

log = logging.getLogger("gmlx.engine")


class TemplateError(ValueError):
    """The chat template could not be compiled or rendered (the server answers 400)."""


# Gemma 3's official template (google/gemma-3-*-it): system folded into the first user turn.
GEMMA_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

# Meta-Llama-3-*-Instruct's template.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# ChatML with Qwen2.5's tool-calling layout, without Qwen's default system prompt.
CHATML_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" }}
    {{- "You are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments" }}
    {{- " within <tool_call></tool_call> XML tags:\n<tool_call>\n" }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or
          (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {{- tool_call.arguments | tojson if tool_call.arguments is not string else tool_call.arguments }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

FAMILY_TEMPLATES: dict[str, str] = {
    "gemma": GEMMA_TEMPLATE, "llama3": LLAMA3_TEMPLATE, "chatml": CHATML_TEMPLATE,
}
# Message fields transformers fills from each other so templates find reasoning under either name.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class JinjaChatTemplate:
    """A compiled chat template; satisfies `types.ChatTemplate`."""

    def __init__(self, source_text: str, source: str, special_tokens: Mapping[str, str] | None = None) -> None:
        env = _environment()
        try:
            self._template = env.from_string(source_text)
            variables = jinja2.meta.find_undeclared_variables(env.parse(source_text))
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template ({source}) does not compile: {e}") from e
        self.text = source_text
        self.source = source
        self.variables = frozenset(variables)
        # bos_token/eos_token (and unk/pad where the GGUF names them), as transformers passes its special tokens.
        self.special_tokens = {"bos_token": "", "eos_token": "", **(special_tokens or {})}

    @classmethod
    def from_metadata(
        cls, metadata: Mapping[str, Any], family: str, override: str | None = None
    ) -> JinjaChatTemplate:
        special = _special_tokens(metadata)
        if override:
            return cls(_read_override(override), "config", special)
        gguf = metadata.get("tokenizer.chat_template")
        name = fallback_family(family, metadata.get("tokenizer.ggml.tokens") or ())
        if isinstance(gguf, str) and gguf.strip():
            try:
                return cls(gguf, "gguf", special)
            except TemplateError as e:  # a broken GGUF template should not keep the model from loading
                log.warning("%s; using the built-in %r template instead", e, name)
        else:
            log.info("chat template: the GGUF has none; using the built-in %r template (family %r)", name, family)
        return cls(FAMILY_TEMPLATES[name], f"family:{name}", special)

    def render(
        self,
        messages: Sequence[Mapping[str, object]],
        tools: Sequence[Mapping[str, object]] | None = None,
        add_generation_prompt: bool = True,
        **variables: object,
    ) -> str:
        context: dict[str, Any] = {**self.special_tokens, "documents": None}
        context.update(_plain(dict(variables)))
        context.update(
            messages=[_message(m) for m in messages],
            tools=_plain(list(tools)) if tools is not None else None,
            add_generation_prompt=add_generation_prompt,
        )
        try:
            return self._template.render(**context)
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template ({self.source}): {e.message or e}") from e
        except (TypeError, ValueError, LookupError, AttributeError) as e:
            raise TemplateError(f"chat template ({self.source}) failed on these messages: {e}") from e


def fallback_family(family: str, tokens: Sequence[str]) -> str:
    """The built-in template for a family; the vocabulary decides when the family does not."""
    known = family_of(family)
    if known.template is not None:
        return known.template
    vocab = set(tokens) & {"<|start_header_id|>", "<start_of_turn>", "<|im_start|>"}
    if known is LLAMA and "<|start_header_id|>" in vocab:
        return "llama3"
    if "<|im_start|>" in vocab:
        return "chatml"
    if "<|start_header_id|>" in vocab:
        return "llama3"
    return "gemma" if "<start_of_turn>" in vocab else "chatml"


def _special_tokens(metadata: Mapping[str, Any]) -> dict[str, str]:
    tokens = metadata.get("tokenizer.ggml.tokens") or ()
    found = {}
    for name, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
        index = metadata.get(f"tokenizer.ggml.{key}_token_id")
        if isinstance(index, int) and 0 <= index < len(tokens):
            found[f"{name}_token"] = str(tokens[index])
    return found


def _read_override(override: str) -> str:
    """Inline jinja, or a path to a file holding it."""
    if "{{" in override or "{%" in override:
        return override
    path = Path(override).expanduser()
    if not path.is_file():
        raise TemplateError(f"chat_template override {override!r} is neither a file nor a jinja template")
    return path.read_text(encoding="utf-8")


def _message(message: Mapping[str, object]) -> dict[str, Any]:
    # Drop None values (content=None, tool_calls=None) as transformers does: templates test presence.
    plain = {str(k): _plain(v) for k, v in message.items() if v is not None}
    reasoning = next((plain[k] for k in _REASONING_FIELDS if plain.get(k) is not None), None)
    if reasoning is not None:
        plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
    return plain


def _plain(value: Any) -> Any:
    """JSON-like data only: the sandbox should not see objects with methods of their own."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    for kind in (bool, str, int, float):
        if isinstance(value, kind):
            return kind(value)
    return f"<{type(value).__name__}>"


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # jinja's own tojson escapes HTML and ASCII-fies; transformers' keeps text as is.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (assistant-mask markers): render the body unchanged."""

    tags = {"generation"}  # noqa: RUF012 (jinja's declared class attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """`namespace()` that refuses underscore names, as transformers' does (no reach into internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # jinja's Namespace signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} may not start with '_'")


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    env.globals["dict"] = _TemplateDict()
    return env


class _TemplateDict:
    """`dict(...)` and `dict.fromkeys(...)` for templates, without exposing the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, keys: Any, value: Any = None) -> dict[Any, Any]:
        return dict.fromkeys(keys, value)
