"""gmlx against an independent reference: transformers loading the same GGUF files (dequantized to torch).

For each real test model, a few prompts are fed as the SAME token ids to both implementations:

- greedy, 32 new tokens each (transformers `generate`, KV cache, fp32; gmlx prefill + one token at a time
  with its KV cache). The ids must be equal, or part only where the reference's top two logits are a
  near-tie (within NEAR_TIE[layout]).
- teacher-forced over prompt + the shared tokens: the largest absolute logit difference over every row,
  printed (`pytest -s`) and recorded as a junit property, and bounded by MAX_LOGIT_DIFF[layout].
- transformers' GGUF tokenizer and gmlx's give the same ids for varied strings.
- the headline answers: SmolLM2 says "Paris" for the capital of France; Gemma 3 continues the Eiffel
  Tower sentence with " Paris".

Needs torch and accelerate (`pip install torch==2.13.0 accelerate`); skipped without them. The reference's
results are kept on disk once computed (tests/e2e/transformers_ref.py says where, and how to recompute);
gmlx's side is computed by every run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx  # tests/conftest.py has put OpenBLAS in front before this first import
import numpy as np
import pytest

from gmlx_server.engine.loader import LoadedModel, load_gguf_model
from tests.conftest import gemma_path, native_kernels, smollm2_path
from tests.e2e.transformers_ref import Greedy, Transformers, timed

pytestmark = [pytest.mark.slow, pytest.mark.reference]

NEW_TOKENS = 32
# Largest |logit difference| allowed on any teacher-forced row (logits here span about +-30). Measured
# (2 cores, torch 2.13 CPU, transformers 5.24, mlx 0.32.4, mlx-vlm 0.7.10):
# - dense, both sides dequantize the same GGUF blocks to fp32: SmolLM2 1.1e-4 (summation order only);
#   Gemma 3 0.064, all of it mlx-vlm's gemma3 embedding scale, which rounds sqrt(640) to bf16 (25.25 for
#   25.298; with the exact scale the difference drops to 3e-5);
# - packed (MLX affine group 32; Gemma's Q6_K re-quantized to 8 bits): SmolLM2 0.069, Gemma 3 0.17.
# - native (GGUF blocks read by gmlx's CPU kernels; decode rows round activations to int16 per 32, or per
#   256 for the K-quants, for integer dot products; prefill runs dequantized panels through sgemm):
#   SmolLM2 0.004, Gemma 3 0.066 (the same bf16 scale as dense). int8 activations, llama.cpp's choice,
#   moved SmolLM2's logits by 2.8.
MAX_LOGIT_DIFF = {"dense": 0.25, "packed": 0.5, "native": 0.25}
# Where the greedy sequences part, the reference's top-1 minus top-2 logit there must be below this: with
# every logit within d of the reference, the argmax can only flip where the top two are within 2d.
NEAR_TIE = {layout: 2 * bound for layout, bound in MAX_LOGIT_DIFF.items()}

SMOLLM2_CHATS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the ocean."}],
    [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Hi! What does a CPU do?"},
        {"role": "assistant", "content": "It runs the instructions of programs."},
        {"role": "user", "content": "And a GPU?"},
    ],
]
GEMMA_PROMPTS = [
    "The Eiffel Tower is in the city of",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village,",
]
TOKENIZER_STRINGS = [
    "Hello, world! This is plain ASCII text.",
    "  leading, trailing   and   runs of spaces  ",
    "tabs\tand\nnewlines\n\n\nand\r\nCRLF",
    "naïve café in Zürich — “quotes” … ß Ωμέγα",
    "日本語のテキストと中文，한국어",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷🤗",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n\tif x != 0: pass",
    "numbers 1234567890 3.14159 -42 1,000,000",
]
SPECIAL_STRINGS = {
    "smollm2": ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>x"],
    "gemma3": ["<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", "<bos>text<eos>"],
}
PACKED_PROMPT = 0  # one prompt per model also runs on the packed layout


@dataclass
class Run:
    """gmlx's greedy run: its tokens and every logit row, (len(prompt) + NEW_TOKENS - 1, V)."""

    ids: list[int]
    rows: np.ndarray


@dataclass
class Pair:
    name: str
    path: Path
    ref: Transformers
    gmlx: dict[str, LoadedModel]
    prompts: list[list[int]]
    _ref_greedy: dict[int, Greedy] = field(default_factory=dict)
    _gmlx_greedy: dict[tuple[int, str], Run] = field(default_factory=dict)

    def loaded(self, layout: str) -> LoadedModel:
        if layout not in self.gmlx:
            with timed(f"{self.name}: gmlx {layout} load"):
                self.gmlx[layout] = load_gguf_model(self.path, layout=layout,  # type: ignore[arg-type]
                                                    native_kernels=native_kernels())
        return self.gmlx[layout]

    def ref_greedy(self, k: int) -> Greedy:
        if k not in self._ref_greedy:
            self._ref_greedy[k] = self.ref.greedy(self.prompts[k])
        return self._ref_greedy[k]

    def gmlx_greedy(self, k: int, layout: str) -> Run:
        """Prefill, argmax, then one token at a time through the KV cache; keeps every logit row."""
        if (k, layout) not in self._gmlx_greedy:
            model = self.loaded(layout).model
            out: list[int] = []
            with timed(f"{self.name} p{k}: gmlx {layout} greedy"):
                cache = model.make_cache()
                logits = model(mx.array([self.prompts[k]]), cache=cache).logits
                rows = [logits[0]]
                for _ in range(NEW_TOKENS):
                    token = int(mx.argmax(logits[0, -1]).item())
                    out.append(token)
                    if len(out) < NEW_TOKENS:
                        logits = model(mx.array([[token]]), cache=cache).logits
                        rows.append(logits[0])
                table = np.array(mx.concatenate(rows).astype(mx.float32))
            self._gmlx_greedy[k, layout] = Run(out, table)
        return self._gmlx_greedy[k, layout]


def _load_pair(name: str, path: Path, prompts: Callable[[LoadedModel], list[list[int]]]) -> Pair:
    pair = Pair(name, path, Transformers(name, path, NEW_TOKENS), {}, [])
    pair.prompts = prompts(pair.loaded("dense"))
    return pair


def _smollm2_prompts(lm: LoadedModel) -> list[list[int]]:
    return [
        lm.tokenizer.encode(lm.template.render(chat, add_generation_prompt=True), add_special_tokens=True)
        for chat in SMOLLM2_CHATS
    ]


def _gemma3_prompts(lm: LoadedModel) -> list[list[int]]:
    prompts = [lm.tokenizer.encode(text, add_special_tokens=True) for text in GEMMA_PROMPTS]
    assert all(p[0] == lm.tokenizer.bos_id for p in prompts)
    return prompts


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    if request.param == "smollm2":
        p = _load_pair("smollm2", Path(smollm2_path()), _smollm2_prompts)
    else:
        p = _load_pair("gemma3", Path(gemma_path()), _gemma3_prompts)
    yield p
    p.gmlx.clear()  # let the next model's weights replace these
    p._ref_greedy.clear()
    p.ref.unload()


def _shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# the native layout is the kernels': the GMLX_NATIVE_KERNELS=0 rerun (scripts/test.sh) covers the others
CASES = ([(k, "dense") for k in range(3)] + [(PACKED_PROMPT, "packed")]
         + [(k, "native") for k in range(3) if native_kernels()])


# The GMLX_NATIVE_KERNELS=0 rerun: the first prompt on each layout (the others differ only in their tokens).
PARAMS = [pytest.param(k, layout, id=f"p{k}-{layout}", marks=[pytest.mark.kernels_off] if k == 0 else [])
          for k, layout in CASES]


@pytest.mark.parametrize(("k", "layout"), PARAMS)
def test_greedy_matches_reference(
    pair: Pair, k: int, layout: str, record_property: Callable[[str, object], None]
) -> None:
    ref = pair.ref_greedy(k)
    run = pair.gmlx_greedy(k, layout)
    ours = run.ids
    assert len(ref.ids) == NEW_TOKENS and len(ours) == NEW_TOKENS
    shared = _shared_prefix(ref.ids, ours)

    # Teacher-forced over prompt + shared tokens; the last row predicts the parting step (if any). gmlx's
    # rows for exactly these inputs are those of its greedy run (prefill rows, then one per decoded token),
    # so they are taken from there: the same numbers as a separate forward pass up to float noise, they
    # also cover the KV-cache path, and a packed prefill on MLX's CPU would cost ~10 s more per case. The
    # reference's are the first rows of its pass over prompt + all its tokens (causal: the same rows).
    prompt = pair.prompts[k]
    ids = prompt + ref.ids[: min(shared, NEW_TOKENS - 1)]
    ref_rows = ref.rows[: len(ids)]
    our_rows = run.rows[: len(ids)]
    assert ref_rows.shape == our_rows.shape, (ref_rows.shape, our_rows.shape)
    diff = np.abs(ref_rows - our_rows)
    max_diff = float(diff.max())
    gen_diff = float(diff[len(prompt) - 1 :].max())
    tok = pair.loaded(layout).tokenizer
    report = (
        f"[{pair.name} p{k} {layout}] shared {shared}/{NEW_TOKENS} tokens; max |logit diff| "
        f"{max_diff:.4g} over {diff.shape[0]} rows ({gen_diff:.4g} on generated rows); "
        f"min reference top-2 gap on shared steps {min(ref.top2_gaps[: max(shared, 1)]):.4g}"
    )
    print("\n" + report)
    record_property(f"{pair.name}_p{k}_{layout}_max_logit_diff", max_diff)
    record_property(f"{pair.name}_p{k}_{layout}_shared_tokens", shared)
    if shared < NEW_TOKENS:
        gap = ref.top2_gaps[shared]
        print(
            f"  parted at step {shared}: reference {ref.ids[shared]} {tok.decode([ref.ids[shared]])!r} vs "
            f"gmlx {ours[shared]} {tok.decode([ours[shared]])!r}; reference top-2 gap {gap:.4g} "
            f"(near-tie epsilon {NEAR_TIE[layout]})"
        )
        record_property(f"{pair.name}_p{k}_{layout}_parted_top2_gap", gap)
        assert gap <= NEAR_TIE[layout], (
            f"{report}: greedy tokens part at step {shared} where the reference is not near a tie "
            f"(top-2 gap {gap:.4g} > {NEAR_TIE[layout]})\n ref  {ref.ids}\n gmlx {ours}"
        )
    print(f"  reference: {tok.decode(ref.ids)!r}\n  gmlx:      {tok.decode(ours)!r}")
    assert max_diff <= MAX_LOGIT_DIFF[layout], report


@pytest.mark.kernels_off
def test_headline_answers(pair: Pair) -> None:
    tok = pair.loaded("dense").tokenizer
    ref = tok.decode(pair.ref_greedy(0).ids, skip_special_tokens=True)
    ours = tok.decode(pair.gmlx_greedy(0, "dense").ids, skip_special_tokens=True)
    if pair.name == "smollm2":
        assert "Paris" in ref and "Paris" in ours, (ref, ours)
    else:
        assert ref.startswith(" Paris") and ours.startswith(" Paris"), (ref, ours)


def test_tokenizers_agree(pair: Pair) -> None:
    ours = pair.loaded("dense").tokenizer
    texts = [*TOKENIZER_STRINGS, *SPECIAL_STRINGS[pair.name]]
    reference = pair.ref.encode(texts)
    mismatches = []
    for text in texts:
        for special, expected in zip((False, True), reference[text], strict=True):
            got = ours.encode(text, add_special_tokens=special)
            if expected != got:
                mismatches.append(
                    f"{text!r} add_special_tokens={special}:\n  transformers {expected}\n  gmlx         {got}"
                )
    assert not mismatches, f"{pair.name} tokenizers differ:\n" + "\n".join(mismatches)
