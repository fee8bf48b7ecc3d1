"""The transformers side of tests/e2e/test_reference.py: the same GGUF loaded by transformers (dequantized to
torch, fp32), its greedy tokens, teacher-forced logits and tokenizer ids, each kept on disk once computed.

Kept under ~/.cache/gmlx-test-models/reference (GMLX_TEST_MODELS moves it), named by a digest of everything
that decides the result: the GGUF's bytes, torch/transformers/accelerate/gguf versions, the input ids or
strings and FORMAT. So scripts/test.sh's kernels-off rerun, and every later run on the machine, read the
reference instead of loading transformers again (~50 s of CPU per run on two cores). Only the reference is
kept: gmlx's side is computed by every run. To recompute: delete the directory, or bump FORMAT when the
computation below changes."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

FORMAT = 1  # bump when what a stored reference holds, or how it is computed, changes
CACHE = Path(os.environ.get("GMLX_TEST_MODELS", Path.home() / ".cache" / "gmlx-test-models")) / "reference"
LIBS = ("torch", "transformers", "accelerate", "gguf")


@contextlib.contextmanager
def timed(label: str) -> Iterator[None]:
    wall, cpu = time.perf_counter(), time.process_time()
    yield
    print(f"\n  [{label}: {time.perf_counter() - wall:.1f} s wall, {time.process_time() - cpu:.1f} s CPU]", end="")


def reference_libs() -> tuple[Any, Any]:
    """torch and transformers, imported only when a reference is computed (not at collection), or skip."""
    torch = pytest.importorskip("torch", reason="the transformers reference needs torch: pip install torch==2.13.0")
    pytest.importorskip("accelerate", reason="transformers' GGUF loading needs accelerate: pip install accelerate")
    transformers = pytest.importorskip("transformers", reason="the reference is transformers: pip install transformers")
    return torch, transformers


@contextlib.contextmanager
def parse_gguf_once() -> Iterator[None]:
    """Speed only, no change to what transformers computes: it builds a gguf.GGUFReader three times per
    file (config, weights, tokenizer; parsing Gemma's 262k-token metadata takes most of a minute on
    2 cores) and a fresh gguf.TensorNameMap for each of its ~400 modules. Share them meanwhile; both are
    read-only. transformers does `from gguf import ...` at call time, so patching the module works."""
    real_reader, real_name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[str, Any] = {}

    def shared_reader(path: str | os.PathLike[str], mode: str = "r") -> Any:
        key = os.fspath(path)
        if key not in readers:
            readers[key] = real_reader(path, mode)
        return readers[key]

    gguf.GGUFReader = shared_reader
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(real_name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_name_map


@dataclass
class Greedy:
    ids: list[int]
    top2_gaps: list[float]  # top-1 minus top-2 logit at each step
    rows: np.ndarray  # (len(prompt) + len(ids) - 1, V): teacher-forced logits over the prompt and ids[:-1]


@functools.cache
def _file_digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class Transformers:
    """One GGUF's reference, loaded only when something asked for is not stored yet."""

    def __init__(self, name: str, path: Path, new_tokens: int) -> None:
        self.name, self.path, self.new_tokens = name, path, new_tokens
        self._loaded: tuple[Any, Any, Any] | None = None  # torch, model, tokenizer

    def _key(self, what: object) -> str:
        try:
            versions = [importlib.metadata.version(lib) for lib in LIBS]
        except importlib.metadata.PackageNotFoundError:
            reference_libs()  # skips, naming what is missing
            raise
        blob = json.dumps([FORMAT, _file_digest(self.path), versions, what])
        return f"{self.name}-{hashlib.sha256(blob.encode()).hexdigest()[:20]}"

    def _load(self) -> tuple[Any, Any, Any]:
        if self._loaded is None:
            torch, transformers = reference_libs()
            # One thread: on 2 shared cores torch's OpenMP workers spin-wait; measured 3x the CPU for the same
            # 32-token generate with 2 threads.
            torch.set_num_threads(1)
            d, f = os.fspath(self.path.parent), self.path.name
            with parse_gguf_once():
                with timed(f"{self.name}: transformers model load"):
                    model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
                with timed(f"{self.name}: transformers tokenizer load"):
                    tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=f)
            self._loaded = torch, model.eval(), tok
        return self._loaded

    def unload(self) -> None:
        self._loaded = None

    def greedy(self, prompt: list[int]) -> Greedy:
        """Greedy new_tokens after `prompt` (generate, KV cache), and the logits over it teacher-forced."""
        path = CACHE / f"{self._key(['greedy', self.new_tokens, prompt])}.npz"
        if path.exists():
            print(f"\n  [{self.name}: transformers greedy read from {path.name}]", end="")
            with np.load(path) as z:
                return Greedy(z["ids"].tolist(), z["gaps"].tolist(), z["rows"])
        got = self._greedy(prompt)
        _store(path, lambda tmp: np.savez(tmp, ids=np.array(got.ids), gaps=np.array(got.top2_gaps), rows=got.rows))
        return got

    def _greedy(self, ids: list[int]) -> Greedy:
        torch, model, _ = self._load()
        with timed(f"{self.name}: transformers greedy, {len(ids)}-token prompt"), torch.no_grad():
            out = model.generate(
                torch.tensor([ids]), max_new_tokens=self.new_tokens, min_new_tokens=0, do_sample=False,
                use_cache=True, output_logits=True, return_dict_in_generate=True, eos_token_id=None,
                pad_token_id=0, attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            )
        new = out.sequences[0, len(ids):].tolist()
        gaps = []
        for row in out.logits:
            top = torch.topk(row[0].float(), 2).values
            gaps.append(float(top[0] - top[1]))
        forced = ids + new[:-1]
        with timed(f"{self.name}: transformers teacher-forced, {len(forced)} tokens"), torch.no_grad():
            rows = np.asarray(model(torch.tensor([forced])).logits[0].float().numpy())
        return Greedy(new, gaps, rows)

    def encode(self, texts: list[str]) -> dict[str, list[list[int]]]:
        """transformers' GGUF tokenizer on each text: its ids without, then with, special tokens."""
        path = CACHE / f"{self._key(['encode', texts])}.json"
        if path.exists():
            stored: dict[str, list[list[int]]] = json.loads(path.read_text())
            return stored
        tok = self._load()[2]
        got = {t: [tok(t, add_special_tokens=special)["input_ids"] for special in (False, True)] for t in texts}
        _store(path, lambda tmp: tmp.write_text(json.dumps(got)))
        return got


def _store(path: Path, write: Callable[[Path], object]) -> None:
    """Write through a temporary name, then rename: a concurrent or interrupted run never reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.partial{path.suffix}")
    write(tmp)
    tmp.replace(path)
