"""What a GGUF header holds, and the ggml type table: pure types, no file opened (gguf_header.py reads them).

The configuration and the capacity math import these without the reader, so the config layer provably reads
no GGUF file (an import-linter contract in pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_BASE_FINETUNES = frozenset({"base", "pt", "pretrained", "pretrain"})


class GGUFFormatError(ValueError):
    """The file is not GGUF, is truncated, or has a header we cannot read."""

    def __init__(self, path: str | Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order: fastest-varying dimension first
    ggml_type: int
    offset: int  # absolute byte offset of the tensor data in the file
    nbytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class GGUFHeader:
    path: str
    version: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    data_offset: int
    file_size: int

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_value(self, key: str, default: Any = None) -> Any:
        """`{arch}.{key}` from the metadata, e.g. arch_value('block_count')."""
        return self.metadata.get(f"{self.architecture}.{key}", default)


# ggml type id -> (name, block size in elements, bytes per block).
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4),
    27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}


def ggml_type_name(ggml_type: int) -> str:
    return GGML_TYPES.get(ggml_type, (f"type{ggml_type}", 0, 0))[0]


@dataclass(frozen=True)
class SkippedArray:
    """A string array that read_header(..., strings=False) stepped over: only its length is known."""

    count: int

    def __len__(self) -> int:
        return self.count


def tensor_nbytes(shape: tuple[int, ...], ggml_type: int, path: str = "") -> int:
    if ggml_type not in GGML_TYPES:
        raise GGUFFormatError(path, f"unknown ggml tensor type {ggml_type}")
    _, block, size = GGML_TYPES[ggml_type]
    n = 1
    for d in shape:
        n *= d
    return (n // block) * size


def is_base_model(metadata: Mapping[str, Any]) -> bool:
    """A GGUF without a chat template of its own, or one its converter marked a base (pretrained) model: it never
    learned to end a turn."""
    template = metadata.get("tokenizer.chat_template")
    finetune = str(metadata.get("general.finetune") or "").strip().lower()
    return not (isinstance(template, str) and template.strip()) or finetune in _BASE_FINETUNES
