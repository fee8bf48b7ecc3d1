"""A tokenizer built from GGUF metadata alone (no hub, no torch).

llama.cpp stores the vocabulary, merges, scores and token types; we rebuild the HF `tokenizers`
pipeline that transformers' GGUF converter would build from them:

- 'gpt2' (byte-level BPE): merges from the file, the split regex named by `tokenizer.ggml.pre`.
- 'llama' (SentencePiece BPE): merges derived from the vocabulary, ranked by score (Gemma: by
  file order, as transformers does), byte fallback, '▁' for spaces.

Decoding goes through `token_bytes` (llama.cpp's token-to-piece rules), so `decode` and the
incremental detokenizer agree byte for byte.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from gmlx_plan.families import family_of
from gmlx_plan.gguf_types import is_base_model
from gmlx_server.engine.merges import NORMAL, USER_DEFINED, derive_merges

__all__ = ["GGUFTokenizer", "bytes_to_unicode", "derive_merges"]

log = logging.getLogger("gmlx.engine")

# llama.cpp token types (NORMAL and USER_DEFINED come with the merge derivation).
UNKNOWN, CONTROL, UNUSED, BYTE = 2, 3, 5, 6

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# `tokenizer.ggml.pre` -> split regex (llama.cpp's llama-vocab.cpp groups); unknown names get GPT-2's.
_PRE_SPLITS: dict[str, str] = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "dbrx", "smaug-bpe"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan", "megrez"), _QWEN2_SPLIT),
    **dict.fromkeys(("gpt-4o", "llama4", "chatglm-bpe", "minimax-m2"), _GPT4O_SPLIT),
    "tekken": _TEKKEN_SPLIT,
}
# These split every digit on its own before the GPT-2 regex (SmolLM, StarCoder, ...).
_DIGIT_PRES = frozenset({"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"})
_GPT2_PRES = frozenset({"gpt2", "gpt-2", "default", "mpt", "olmo", "jais", "trillion", "phi-2"})

# End-of-generation tokens llama.cpp recognises by name, when the file marks them control: a ChatML model's
# GGUF names <|im_end|> its eos, but the document end <|endoftext|> (Qwen2.5, SmolLM2) ends a reply too.
_EOG_NAMES = ("<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<|return|>", "<|call|>", "<|endoftext|>",
              "<|end_of_text|>")
# A base model never learned to end a turn, but one that opens the next has ended its own.
_TURN_OPENERS = ("<start_of_turn>", "<|im_start|>", "<|start_header_id|>")
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_GIL_FREE_CHARS = 1024  # longer texts go through encode_batch, which releases the GIL while it works


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the byte-level alphabet)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_BYTE_CHARS = bytes_to_unicode()
_UNBYTE = str.maketrans({c: chr(b) for b, c in _BYTE_CHARS.items()})


@dataclass(frozen=True)
class _Vocab:
    tokens: list[str]
    types: NDArray[np.int64]
    ids: dict[str, int]  # GGUF spelling -> id

    @classmethod
    def read(cls, metadata: Mapping[str, Any]) -> _Vocab:
        raw_tokens = metadata["tokenizer.ggml.tokens"]
        tokens: list[str] = raw_tokens if isinstance(raw_tokens, list) else list(raw_tokens)  # no copy while building
        raw = metadata.get("tokenizer.ggml.token_type")
        types = np.asarray(raw, dtype=np.int64) if raw else np.full(len(tokens), NORMAL, dtype=np.int64)
        return cls(tokens, types, {t: i for i, t in enumerate(tokens)})

    def of_type(self, kind: int) -> list[int]:
        return np.nonzero(self.types == kind)[0].tolist()

    def with_spelling(self, spelled: Mapping[int, str]) -> dict[str, int]:
        """The BPE vocabulary: the GGUF one with some tokens respelled."""
        vocab = self.ids
        if spelled:
            vocab = dict(vocab)
            for i, text in spelled.items():
                if vocab.get(self.tokens[i]) == i:
                    del vocab[self.tokens[i]]
                vocab.setdefault(text, i)  # a normal token already spelled so keeps its id: the merges make it
        return vocab

    def apart(self, spelled: Mapping[int, str]) -> tuple[dict[int, str], dict[str, int]]:
        """What a BPE over `with_spelling(spelled)` does not hold under the GGUF id, both ways: id -> piece
        (respelled tokens, a duplicated piece's earlier ids) and piece -> id (respelled pieces)."""
        held = self.with_spelling(spelled)
        return ({i: t for i, t in enumerate(self.tokens) if held.get(t) != i},
                {t: i for t, i in self.ids.items() if held.get(t) != i})


class GGUFTokenizer:
    """Text <-> ids for one GGUF model; satisfies `types.Tokenizer`."""

    def __init__(
        self,
        backend: Tokenizer,
        vocab: _Vocab,
        spelled: Mapping[int, str],
        *,
        byte_level: bool,
        strip_leading_space: bool,
        bos_id: int | None,
        eos_id: int | None,
        eos_ids: frozenset[int],
        add_bos: bool,
        add_eos: bool,
    ) -> None:
        self.backend = backend
        self.vocab_size = len(vocab.tokens)
        self.bos_id = bos_id
        self.eos_ids = eos_ids
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.byte_level = byte_level
        # SentencePiece with a space prefix drops the first space of the decoded text (HF's Strip decoder).
        self.strip_leading_space = strip_leading_space
        self.special_ids = frozenset(vocab.of_type(CONTROL))
        self._literal = frozenset(vocab.of_type(USER_DEFINED)) | self.special_ids
        # The pieces live once, in the backend's vocabulary (Gemma 3's 262K-piece list and id map held here
        # too were 42 MB): only those it holds under another spelling or id are kept beside it.
        self._pieces, self._piece_ids = vocab.apart(spelled)
        self._eos_id = eos_id
        self.max_token_chars = _max_token_chars(vocab, byte_level)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> GGUFTokenizer:
        model = str(metadata.get("tokenizer.ggml.model", ""))
        vocab = _Vocab.read(metadata)
        if model == "gpt2":
            backend, spelled, strip = *_build_byte_level(metadata, vocab), False
        elif model == "llama":
            backend, spelled, strip = _build_sentencepiece(metadata, vocab)
        else:
            raise ValueError(f"unsupported GGUF tokenizer model {model!r} (supported: 'gpt2', 'llama')")
        n = len(vocab.tokens)
        bos = _opt_id(metadata, "tokenizer.ggml.bos_token_id", n)
        eos = _opt_id(metadata, "tokenizer.ggml.eos_token_id", n)
        return cls(
            backend, vocab, spelled, byte_level=model == "gpt2", strip_leading_space=strip, bos_id=bos, eos_id=eos,
            eos_ids=_eos_ids(metadata, vocab),
            add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", model == "llama")) and bos is not None,
            add_eos=bool(metadata.get("tokenizer.ggml.add_eos_token", False)) and eos is not None,
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # `encode` holds the GIL for its whole run (49 s on 30 MB); `encode_batch` gives the same ids without it.
        if len(text) > _GIL_FREE_CHARS:
            ids: list[int] = self.backend.encode_batch([text], add_special_tokens=False)[0].ids
        else:
            ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos and self.bos_id is not None:
            ids.insert(0, self.bos_id)
        if add_special_tokens and self.add_eos and self._eos_id is not None:
            ids.append(self._eos_id)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        skip = self.special_ids if skip_special_tokens else frozenset()
        data = b"".join([self.token_bytes(i) for i in ids if i not in skip])
        text = data.decode("utf-8", errors="replace")
        if self.strip_leading_space and text.startswith(" "):
            text = text[1:]
        return text

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes a token stands for; ids past the vocabulary (padded embeddings) give b''."""
        if not 0 <= token_id < self.vocab_size:
            return b""
        piece = self.id_to_piece(token_id)
        if token_id in self._literal:
            return piece.encode("utf-8")  # llama.cpp prints control/user-defined tokens as their text
        if self.byte_level:
            return _unbyte(piece)
        if piece.startswith("<0x") and (match := _BYTE_TOKEN.fullmatch(piece)) is not None:
            return bytes([int(match.group(1), 16)])
        return piece.replace("▁", " ").encode("utf-8")

    def id_to_piece(self, token_id: int) -> str:
        if not 0 <= token_id < self.vocab_size:
            raise IndexError(f"token id {token_id} is outside the vocabulary ({self.vocab_size} tokens)")
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self.backend.id_to_token(token_id)
            assert piece is not None  # every id the backend does not hold is in self._pieces (_Vocab.apart)
        return piece

    def token_to_id(self, piece: str) -> int | None:
        """The piece's id in the GGUF list (its last, if listed twice); None for any other text, such as
        the spelling the BPE gives a respelled piece."""
        token_id = self._piece_ids.get(piece)
        if token_id is None:
            token_id = self.backend.token_to_id(piece)
            if token_id is not None and self.id_to_piece(token_id) != piece:
                return None
        return token_id


def _max_token_chars(vocab: _Vocab, byte_level: bool) -> int | None:
    """The most input characters one token can stand for, so a text needs at least len/this tokens.

    A token's spelling is never shorter than what it covers: byte-level pieces spell one character per
    byte, SentencePiece's '▁' stands for one space and '<0xAB>' for one byte. None (no bound) for a
    SentencePiece vocabulary without all 256 byte tokens, whose unknown token may swallow any run.
    """
    if not vocab.tokens:
        return None
    if not byte_level and len(vocab.of_type(BYTE)) < 256:
        return None
    return max(1, max(map(len, vocab.tokens)))


def _opt_id(metadata: Mapping[str, Any], key: str, n_tokens: int) -> int | None:
    value = metadata.get(key)
    return int(value) if value is not None and 0 <= int(value) < n_tokens else None


def _eos_ids(metadata: Mapping[str, Any], vocab: _Vocab) -> frozenset[int]:
    keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
    ids = {i for k in keys if (i := _opt_id(metadata, k, len(vocab.tokens))) is not None}
    names = list(_EOG_NAMES)
    template = metadata.get("tokenizer.chat_template")
    # ChatML ends a turn with <|im_end|>; count it only where the template (or the chatml fallback) does.
    if not isinstance(template, str) or "<|im_end|>" in template:
        names.append("<|im_end|>")
    if is_base_model(metadata):
        names += _TURN_OPENERS
    found = (vocab.ids.get(name) for name in names)
    ids.update(i for i in found if i is not None and vocab.types[i] == CONTROL)
    return frozenset(ids)


def _unbyte(piece: str) -> bytes:
    mapped = piece.translate(_UNBYTE)
    try:
        return mapped.encode("latin-1")
    except UnicodeEncodeError:  # characters outside the byte alphabet: keep them as UTF-8
        return b"".join(c.encode("latin-1") if ord(c) < 256 else c.encode("utf-8") for c in mapped)


def _build_byte_level(metadata: Mapping[str, Any], vocab: _Vocab) -> tuple[Tokenizer, dict[int, str]]:
    alphabet = frozenset(_BYTE_CHARS.values())
    # llama.cpp writes user-defined tokens as plain text; the BPE needs them in the byte alphabet.
    spelled = {i: "".join(_BYTE_CHARS[b] for b in t.encode("utf-8"))
               for i, t in enumerate(vocab.tokens) if not alphabet.issuperset(t)}
    merges = [_split_merge(m) for m in metadata.get("tokenizer.ggml.merges") or ()]
    bpe = BPE(vocab=vocab.with_spelling(spelled), merges=merges, fuse_unk=False, byte_fallback=False)
    backend = Tokenizer(bpe)
    backend.pre_tokenizer = _byte_level_pre(str(metadata.get("tokenizer.ggml.pre", "gpt2")))
    backend.decoder = decoders.ByteLevel()
    _add_tokens(backend, vocab, spelled)
    return backend, spelled


def _split_merge(merge: str) -> tuple[str, str]:
    left, _, right = merge.partition(" ")
    return left, right


def _byte_level_pre(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGIT_PRES:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    split = _PRE_SPLITS.get(pre)
    if split is None:
        if pre not in _GPT2_PRES:
            log.warning("tokenizer: unknown pre-tokenizer %r, splitting text like GPT-2", pre)
        return byte_level
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def _build_sentencepiece(metadata: Mapping[str, Any], vocab: _Vocab) -> tuple[Tokenizer, dict[int, str], bool]:
    gemma = family_of(str(metadata.get("general.architecture", ""))).spelled_spaces
    # Gemma stores runs of spaces as real spaces; the BPE sees them as '▁' runs.
    spelled = {i: "▁" * len(t) for i, t in enumerate(vocab.tokens) if gemma and " " in t and not t.strip()}
    bpe_vocab = vocab.with_spelling(spelled)
    file_merges = metadata.get("tokenizer.ggml.merges")
    if file_merges:
        merges = [_split_merge(m) for m in file_merges]
    else:
        scores = metadata.get("tokenizer.ggml.scores")
        # Gemma's scores do not follow its merge order; its file order does (as transformers found).
        n = len(vocab.tokens)
        key = -np.arange(n, dtype=np.float64) if gemma or scores is None else np.asarray(scores, np.float64)
        merges = derive_merges([spelled.get(i, t) for i, t in enumerate(vocab.tokens)], vocab.types, key)
    unk = _opt_id(metadata, "tokenizer.ggml.unknown_token_id", len(vocab.tokens))
    unk_token = vocab.tokens[unk] if unk is not None else None
    bpe = BPE(vocab=bpe_vocab, merges=merges, unk_token=unk_token, fuse_unk=True, byte_fallback=True)
    backend = Tokenizer(bpe)
    prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", not gemma))
    steps: list[decoders.Decoder] = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        # Spaces become '▁' and the whole text is one BPE word, as in SentencePiece.
        backend.normalizer = normalizers.Replace(" ", "▁")
    else:
        backend.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme="first" if prefix else "never", split=False
        )
        if prefix:
            steps.append(decoders.Strip(content=" ", left=1))
    backend.decoder = decoders.Sequence(steps)
    _add_tokens(backend, vocab, spelled)
    return backend, spelled, prefix and not gemma


def _add_tokens(backend: Tokenizer, vocab: _Vocab, spelled: Mapping[int, str]) -> None:
    """Control tokens become special added tokens, user-defined ones plain added tokens: both match whole.

    Respelled ones are left to the BPE (a control token outside the byte alphabet is a llama.cpp mislabel).
    """
    for kind, special in ((CONTROL, True), (USER_DEFINED, False)):
        added = [AddedToken(vocab.tokens[i], normalized=False, special=special)
                 for i in vocab.of_type(kind) if i not in spelled and vocab.tokens[i]]
        if special:
            backend.add_special_tokens(added)
        else:
            backend.add_tokens(added)
