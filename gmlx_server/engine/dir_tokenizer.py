"""The tokenizer and chat template of a model directory (Hugging Face / MLX layout: tokenizer.json,
tokenizer_config.json, chat_template.jinja, generation_config.json), behind the same interface as the GGUF
ones. Encoding is the directory's own tokenizer.json; a token's bytes follow its pieces (byte-level BPE,
or SentencePiece's '▁' and <0xNN> byte tokens), so streaming and llguidance read them as they read GGUF
vocabularies. No MLX: the estimate route reads a directory that is not loaded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from gmlx_server.engine.chat_template import JinjaChatTemplate
from gmlx_server.engine.tokenizer import bytes_to_unicode

_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_UNBYTE = {c: b for b, c in bytes_to_unicode().items()}


def read_json(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    return out


def _token_text(value: Any) -> str | None:
    return value.get("content") if isinstance(value, dict) else value if isinstance(value, str) else None


class DirTokenizer:
    """Satisfies `types.Tokenizer` (and what the detokenizer and llguidance read)."""

    def __init__(self, directory: str | Path) -> None:
        d = Path(directory)
        spec = read_json(d / "tokenizer.json")
        self.backend = Tokenizer.from_file(str(d / "tokenizer.json"))
        cfg = read_json(d / "tokenizer_config.json")
        self.vocab_size = self.backend.get_vocab_size(with_added_tokens=True)
        self._pieces = {i: p for p, i in self.backend.get_vocab(with_added_tokens=True).items()}
        added = spec.get("added_tokens", [])
        self.special_ids = frozenset(int(t["id"]) for t in added if t.get("special"))
        self._literal = frozenset(int(t["id"]) for t in added)
        self.byte_level = "ByteLevel" in json.dumps(spec.get("decoder"))
        # SentencePiece's dummy prefix: the decoded text loses the space the encoder put first (HF's Strip)
        self.strip_leading_space = '"Strip"' in json.dumps(spec.get("decoder"))
        self.bos_id = self._id(_token_text(cfg.get("bos_token")))
        self.add_bos = bool(cfg.get("add_bos_token", False)) and self.bos_id is not None
        self.eos_ids = frozenset(self._eos(d, cfg))
        self.max_token_chars = max(map(len, self._pieces.values())) if self.byte_level else None

    def _id(self, piece: str | None) -> int | None:
        return self.backend.token_to_id(piece) if piece else None

    def _eos(self, d: Path, cfg: dict[str, Any]) -> set[int]:
        """eos_token_id of generation_config.json and config.json (an id or a list), and the tokenizer's."""
        ids: set[int] = set()
        for conf in (read_json(d / "generation_config.json"), read_json(d / "config.json")):
            for key in ("eos_token_id",):
                value = conf.get(key, (conf.get("text_config") or {}).get(key))
                ids.update(value if isinstance(value, list) else [value] if isinstance(value, int) else [])
        eos = self._id(_token_text(cfg.get("eos_token")))
        return ids | ({eos} if eos is not None else set())

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = self.backend.encode_batch([text], add_special_tokens=False)[0].ids
        return [self.bos_id, *ids] if add_special_tokens and self.add_bos and self.bos_id is not None else ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        skip = self.special_ids if skip_special_tokens else frozenset()
        text = b"".join(self.token_bytes(i) for i in ids if i not in skip).decode("utf-8", errors="replace")
        return text[1:] if self.strip_leading_space and text.startswith(" ") else text

    def token_bytes(self, token_id: int) -> bytes:
        piece = self._pieces.get(token_id)
        if piece is None:
            return b""
        if token_id in self._literal:
            return piece.encode("utf-8")
        if self.byte_level:
            return bytes(_UNBYTE[c] for c in piece) if all(c in _UNBYTE for c in piece) else piece.encode("utf-8")
        m = _BYTE.fullmatch(piece)
        return bytes([int(m.group(1), 16)]) if m else piece.replace("▁", " ").encode("utf-8")

    def id_to_piece(self, token_id: int) -> str:
        return self._pieces[token_id]

    def token_to_id(self, piece: str) -> int | None:
        return self._id(piece)


def dir_template(directory: str | Path, family: str, override: str | None = None) -> JinjaChatTemplate:
    """`override`, else chat_template.jinja, else tokenizer_config.json's chat_template, else the family's;
    rendered with the tokenizer's special tokens as transformers passes them."""
    d = Path(directory)
    cfg = read_json(d / "tokenizer_config.json")
    text = (d / "chat_template.jinja").read_text() if (d / "chat_template.jinja").is_file() else cfg.get(
        "chat_template")
    special = {f"{n}_token": t for n in ("bos", "eos", "unk", "pad") if (t := _token_text(cfg.get(f"{n}_token")))}
    if isinstance(text, str) and text.strip() and not override:
        return JinjaChatTemplate(text, "directory", special)
    template = JinjaChatTemplate.from_metadata({}, family, override)
    template.special_tokens.update(special)
    return template
