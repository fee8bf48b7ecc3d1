"""The tokenizer routes' bodies in llama-server's and vLLM's spellings -> requests, and answers -> JSON (pure).

/tokenize takes llama-server's `content` or vLLM's `prompt` (raw text), or chat `messages` rendered through the
template. Each answer carries both peers' fields, so either one's client reads it unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gmlx_server.errors import UnsupportedFeature
from gmlx_server.generation_params import GenerationParams
from gmlx_server.protocol import params as p
from gmlx_server.protocol.openai import body_object, chat_prompt

MAX_TOKEN_IDS = 1 << 20  # ids in one /detokenize body: the body limit bounds its bytes, this the decoding work
# Fields of the peers whose other value this server cannot honour: (name, the value refused, why).
_REFUSED = (("parse_special", False, "special-token text in the content is always parsed as those tokens"),
            ("continue_final_message", True, "the prompt always closes the last message"))
_CHAT_ONLY = ("tools", "tool_choice", "chat_template_kwargs", "add_generation_prompt")  # read with messages only


@dataclass(frozen=True)
class TokenizeRequest:
    params: GenerationParams  # model and profile, then `prompt` (raw text) or the chat fields
    add_special: bool  # the tokenizer's BOS/EOS around the text
    with_pieces: bool  # llama-server's: tokens as {id, piece}
    token_strs: bool  # vLLM's return_token_strs
    text_param: str = "content"  # the field that carried the text, for errors

    @property
    def wants_pieces(self) -> bool:
        return self.with_pieces or self.token_strs


@dataclass(frozen=True)
class DetokenizeRequest:
    params: GenerationParams  # model and profile
    tokens: tuple[int, ...]


def _target(body: Mapping[str, Any]) -> dict[str, Any]:
    return {"model": p.string(body, "model") or "", "profile": p.string(body, "profile") or None}


def _refuse_unhonoured(body: Mapping[str, Any]) -> None:
    for name, value, why in _REFUSED:
        if p.boolean(body, name) is value:
            raise UnsupportedFeature(f"'{name}': {str(value).lower()} is not supported: {why}", param=name)
    if body.get("chat_template") is not None:
        raise UnsupportedFeature("'chat_template': a per-request template is not supported; the model's "
                                 "chat_template is set in its config entry", param="chat_template")


def _chat(body: Mapping[str, Any]) -> GenerationParams:
    _refuse_unhonoured(body)
    return GenerationParams(**_target(body), **chat_prompt(body),
                            add_generation_prompt=p.boolean(body, "add_generation_prompt") is not False)


def _add_special(body: Mapping[str, Any], default: bool) -> bool:
    """llama-server's add_special or vLLM's add_special_tokens; the two spellings must agree."""
    ours, theirs = p.boolean(body, "add_special"), p.boolean(body, "add_special_tokens")
    if ours is not None and theirs is not None and ours != theirs:
        raise p.bad("add_special_tokens", "disagrees with add_special; send one of them")
    given = ours if ours is not None else theirs
    return default if given is None else given


def _text(body: Mapping[str, Any]) -> tuple[str, str]:
    """(field name, text): content or prompt, exactly one."""
    given = [n for n in ("content", "prompt") if body.get(n) is not None]
    if len(given) > 1:
        raise p.bad("prompt", "send content or prompt, not both")
    name = given[0] if given else "content"
    text = body.get(name)
    if not isinstance(text, str):
        raise p.bad(name, "required: a string, or send messages" if text is None
                    else f"expected a string, got {p.json_type(text)}")
    return name, text


def parse_tokenize(raw: Any) -> TokenizeRequest:
    """A /tokenize body. The add_special default is each peer's: off for llama-server's content and for messages
    (the template writes its own BOS), on for vLLM's prompt."""
    body = body_object(raw)
    flags = {"with_pieces": bool(p.boolean(body, "with_pieces")),
             "token_strs": bool(p.boolean(body, "return_token_strs"))}
    if body.get("messages") is not None:
        for name in ("content", "prompt"):
            if body.get(name) is not None:
                raise p.bad(name, "send either text or messages, not both")
        return TokenizeRequest(_chat(body), _add_special(body, False), **flags, text_param="messages")
    _refuse_unhonoured(body)
    for field in _CHAT_ONLY:
        if body.get(field) is not None:
            raise p.bad(field, "is read with messages only; this body sends text")
    name, text = _text(body)
    return TokenizeRequest(GenerationParams(**_target(body), prompt=text), _add_special(body, name == "prompt"),
                           **flags, text_param=name)


def parse_apply_template(raw: Any) -> GenerationParams:
    """An /apply-template body: messages, tools, chat_template_kwargs and add_generation_prompt."""
    return _chat(body_object(raw))


def _token_id(i: int, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise p.bad(f"tokens[{i}]", f"expected an integer token id, got {p.json_type(v)}")
    if v < 0:
        raise p.bad(f"tokens[{i}]", f"token ids are non-negative, got {v}")
    return v


def parse_detokenize(raw: Any) -> DetokenizeRequest:
    body = body_object(raw)
    tokens = body.get("tokens")
    if not isinstance(tokens, list):
        raise p.bad("tokens", "required: an array of token ids" if tokens is None
                    else f"expected an array of token ids, got {p.json_type(tokens)}")
    if len(tokens) > MAX_TOKEN_IDS:
        raise p.bad("tokens", f"{len(tokens)} ids, more than the {MAX_TOKEN_IDS} one request may hold")
    return DetokenizeRequest(GenerationParams(**_target(body)), tuple(_token_id(i, v) for i, v in enumerate(tokens)))


def piece(data: bytes) -> str | list[int]:
    """A token's text as llama-server writes it: a string when its bytes are UTF-8, else the bytes."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


def tokenize_answer(req: TokenizeRequest, model_id: str, ids: Sequence[int], pieces: Sequence[bytes],
                    window: int) -> dict[str, Any]:
    """vLLM's {count, max_model_len, tokens[, token_strs]} and llama-server's {tokens} in one body."""
    tokens: list[Any] = ([{"id": i, "piece": piece(b)} for i, b in zip(ids, pieces, strict=True)]
                         if req.with_pieces else list(ids))
    out: dict[str, Any] = {"model": model_id, "tokens": tokens, "count": len(ids), "max_model_len": window,
                           "n_ctx": window}
    if req.token_strs:
        out["token_strs"] = [b.decode("utf-8", "replace") for b in pieces]
    return out


def detokenize_answer(model_id: str, text: str) -> dict[str, Any]:
    """llama-server's content and vLLM's prompt: the same text."""
    return {"model": model_id, "content": text, "prompt": text}


def template_answer(model_id: str, prompt: str) -> dict[str, Any]:
    return {"model": model_id, "prompt": prompt}
