"""Where a batched decode step's time goes, per op class and batch width, on the engine's own path.

    .venv/bin/python bench/step_profile.py [--models smollm2,gemma] [--widths 1,2,3,4] [--steps 24]
                                           [--prompt 200] [--sampling greedy,chat]

Each width runs BatchDecoder.step over RequestRuns prefilled as the engine prefills them (prompts of unequal
lengths, so the batch caches are left-padded as in serving). Per width, ms per step (medians):
  step        BatchDecoder.step as the scheduler times it (the decode_step_s the metrics report)
  forward     the model's forward pass, evaluated on its own; then sample (the rows' draws, evaluated) and
              accept (each row's detokenizing, stop strings and event), so step ~ forward + sample + accept
  sse         what the rows' token events then cost the HTTP thread as OpenAI chat SSE chunks (encoder and
              framing; off the engine thread, but on the same cores)
  matmul ...  the forward's kernel calls by class (projections with the residual adds and norms they carry,
              output head, norms with their fused residual adds, RoPE, the attention layers' heads with the
              q/k/v matmul where heads_of computes it, attention, gate, embedding), replayed alone on the inputs
              they had in one recorded step, one eval per class
  rest        forward minus those: KV-cache writes, the mask, the offsets, slices, dispatch
--clock cpu times the process's CPU instead of the wall, the kernels on one thread (decode_step.py's way of
reading a shared machine: the other jobs' time does not count; the ratios are of work, not of a quiet wall).
and the forward's graph nodes by op at the first and last width. `bench/engine.py --profile` runs this.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench.blas_first  # noqa: F401  (OpenBLAS before mlx is first imported)

# isort: split
import mlx.core as mx

from gmlx_server.engine.batch import BatchDecoder
from gmlx_server.engine.kernels import probe
from gmlx_server.engine.kernels.fast_ops import MLX_OPS
from gmlx_server.engine.loader import LoadedModel, load_gguf_model
from gmlx_server.engine.request_run import Progress, RequestRun
from gmlx_server.engine.types import GenerationRequest, SamplingParams, TokenEvent
from gmlx_server.protocol.openai_out import OpenAIEncoder, ResponseMeta
from gmlx_server.routes.event_driver import frame
from tests.conftest import gemma_path, qwen_coder_path, smollm2_path

PATHS = {"smollm2": smollm2_path, "gemma": gemma_path, "qwen0.5b": lambda: qwen_coder_path("0.5b"),
         "qwen1.5b": lambda: qwen_coder_path("1.5b")}
SAMPLING = {"greedy": SamplingParams(temperature=0.0), "chat": SamplingParams(temperature=0.7, top_p=0.9)}
KERNEL_CLASSES = {"matmul": "matmul", "matmul_add_norm": "matmul", "dequantize": "embed", "rms_norm": "norm",
                  "add_norm": "norm", "rope": "rope", "heads": "heads", "heads_of": "heads", "sdpa": "attention",
                  "gated": "gate"}
ROWS = ("step", "forward", "sample", "accept", "sse", "matmul", "head", "norm", "rope", "heads", "attention", "gate",
        "embed", "rest")
Call = tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]
CLOCK: Callable[[], float] = time.perf_counter  # --clock cpu: the process's CPU time, the kernels on one thread


class _Recorder:
    """The kernels extension as the model's modules see it, recording one step's kernel calls for replay."""

    def __init__(self, ext: Any, vocab: int) -> None:
        self.ext, self._vocab = ext, vocab
        self.calls: list[Call] | None = None  # None: not recording

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.ext, name)
        if name not in KERNEL_CLASSES:
            return fn

        def call(*a: Any, **k: Any) -> Any:
            if self.calls is not None:
                head = name == "matmul" and a[1].shape[0] == self._vocab
                self.calls.append(("head" if head else KERNEL_CLASSES[name], fn, a, k))
            return fn(*a, **k)

        return call


def _install(lm: LoadedModel, ext: Any) -> None:
    """Route every kernel call of `lm` (its linears, embedding, norms, RoPE, attention, gate) through `ext`."""
    for _, m in lm.model.named_modules():
        if "_ext" in vars(m):
            m._ext = ext
    assert lm.kernels is not None, "the native layout (gmlx's CPU kernels) is needed to split the step"
    lm.kernels.ext = ext


class _Forward:
    """The model as BatchDecoder calls it, with its forward evaluated and timed on its own."""

    def __init__(self, model: Any) -> None:
        self.model, self.seconds = model, 0.0

    def __call__(self, tokens: mx.array, cache: Any) -> Any:
        t = CLOCK()
        out = self.model(tokens, cache=cache)
        mx.eval(out.logits)
        self.seconds = CLOCK() - t
        return out


def _batch(lm: LoadedModel, width: int, prompt: int, params: SamplingParams,
           events: list[TokenEvent] | None = None) -> BatchDecoder:
    """`width` rows prefilled as the engine prefills them, joined into one batch (unequal prompt lengths)."""
    batch = BatchDecoder(lm.model, prims=lm.kernels or MLX_OPS)
    emit = events.append if events is not None else (lambda ev: None)
    text = " ".join(f"word{i % 97} of the long benchmark prompt" for i in range(prompt))
    ids = lm.tokenizer.encode(text)
    for i in range(width):
        req = GenerationRequest(f"r{i}", ids[: prompt - 9 * i], 100_000, params)
        run = RequestRun(lm.model, lm.tokenizer, req, emit, lambda: False, Progress(), caches=lm.make_cache)
        while not run.prefilled:
            assert not run.prefill_step(), "a row finished in prefill"
        batch.add(run)
    return batch


def _timed_accepts(batch: BatchDecoder, spent: list[float]) -> None:
    for run in batch.rows:
        def accept(draw: Any, forced: int | None = None, real: Any = run.accept_guarded) -> bool:
            t = CLOCK()
            done: bool = real(draw, forced)
            spent.append(CLOCK() - t)
            return done

        run.accept_guarded = accept  # type: ignore[method-assign]  # this bench's rows only


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3 if samples else float("nan")


def _replay(calls: list[Call], reps: int) -> dict[str, float]:
    """Each class's recorded calls rebuilt and evaluated in one eval: the median ms of `reps`."""
    out: dict[str, float] = {}
    for cls in dict.fromkeys(c[0] for c in calls):
        mine = [c for c in calls if c[0] == cls]
        mx.eval([fn(*a, **k) for _, fn, a, k in mine])  # warm
        times = []
        for _ in range(reps):
            t = CLOCK()
            mx.eval([fn(*a, **k) for _, fn, a, k in mine])
            times.append(CLOCK() - t)
        out[cls] = statistics.median(times) * 1e3
    return out


def _sse_ms(lm: LoadedModel, events: list[TokenEvent]) -> float:
    """ms a token event costs the HTTP side as an OpenAI chat SSE chunk (encoder and framing), the median of 3."""
    times = []
    for _ in range(3):
        enc = OpenAIEncoder(ResponseMeta("id", "m", 0, 10), lm.tokenizer)
        t = CLOCK()
        for ev in events:
            for event in enc.feed(ev):
                frame(event)
        times.append((CLOCK() - t) / len(events))
    return statistics.median(times) * 1e3


def profile_width(lm: LoadedModel, rec: _Recorder, width: int, prompt: int, steps: int,
                  params: SamplingParams) -> dict[str, float]:
    events: list[TokenEvent] = []
    batch = _batch(lm, width, prompt, params, events)
    plain, forward = batch.model, _Forward(lm.model)
    for _ in range(3):  # warm
        batch.step()
    step, fwd, rest, accepts = [], [], [], []
    _timed_accepts(batch, accepts)
    for i in range(2 * steps):  # plain and split steps alternate, so the machine's noise hits both alike
        split = i % 2 == 1
        batch.model = forward if split else plain
        before = len(accepts)
        t = CLOCK()
        batch.step()
        seconds = CLOCK() - t
        assert len(batch) == width, "a row finished: raise --prompt's variety or lower --steps"
        if split:
            fwd.append(forward.seconds)
            rest.append(seconds - forward.seconds - sum(accepts[before:]))
        else:
            step.append(seconds)
    accept_s = [sum(accepts[i: i + width]) for i in range(0, len(accepts), width)]
    row = {"step": _median_ms(step), "forward": _median_ms(fwd), "sample": _median_ms(rest),
           "accept": _median_ms(accept_s), "sse": width * _sse_ms(lm, events)}
    batch.model, rec.calls = forward, []
    _install(lm, rec)
    try:
        batch.step()  # one recorded step; its calls are replayed class by class, then dropped
    finally:
        _install(lm, rec.ext)
    calls, rec.calls = rec.calls, None
    row |= _replay(calls, max(5, steps // 2))
    row["rest"] = row["forward"] - sum(v for k, v in row.items() if k in KERNEL_CLASSES.values() or k == "head")
    return row


def nodes_by_op(lm: LoadedModel, width: int, prompt: int) -> Counter[str]:
    """The forward's graph nodes by op name, on a batch of `width` rows."""
    batch = _batch(lm, width, prompt, SAMPLING["greedy"])
    for _ in range(2):  # past the joins' lazy cache merges and the first step's buffer growth
        batch.step()
    tokens = mx.array([[r.next_input] for r in batch.rows], dtype=mx.int32)
    with tempfile.NamedTemporaryFile("r", suffix=".dot") as f:
        mx.export_to_dot(f.name, batch.model(tokens, cache=batch._cache).logits)
        return Counter(re.findall(r'label ="([A-Za-z]+)', f.read()))


def profile(path: str, layout: str, widths: list[int], steps: int = 24, prompt: int = 200,
            sampling: str = "greedy") -> None:
    lm = load_gguf_model(path, layout=layout)  # type: ignore[arg-type]
    ext = lm.kernels.ext if lm.kernels is not None else None
    if ext is None:
        sys.exit("the step's split needs the native layout (gmlx's CPU kernels)")
    rec = _Recorder(ext, int(lm.model.model.embed_tokens.weight.shape[0]))
    table = {w: profile_width(lm, rec, w, prompt, steps, SAMPLING[sampling]) for w in widths}
    counts = {w: nodes_by_op(lm, w, prompt) for w in (widths[0], widths[-1])}
    layers = len(lm.model.layers)
    print(f"{Path(path).name} ({lm.info.weights_layout}), {sampling} rows, ~{prompt}-token prompts, "
          f"{'cpu' if CLOCK is time.process_time else 'wall'} ms per decode step (median of {steps}); "
          f"last column: width {widths[-1]} / width {widths[0]}")
    print(f"  {'':10s}" + "".join(f"  width {w:<3d}" for w in widths) + "   ratio")
    for name in ROWS:
        vals = [table[w].get(name, 0.0) for w in widths]
        ratio = f"{vals[-1] / vals[0]:5.2f}x" if vals[0] > 0.05 else "    -"  # no ratio of noise-sized times
        print(f"  {name:10s}" + "".join(f"  {v:9.2f}" for v in vals) + f"   {ratio}")
    for w, c in counts.items():
        top = ", ".join(f"{op} {n}" for op, n in c.most_common(14))
        print(f"  graph nodes at width {w}: {sum(c.values())} ({sum(c.values()) / layers:.1f} a layer): {top}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2")
    ap.add_argument("--layout", default="auto")
    ap.add_argument("--widths", default="1,2,3,4")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--prompt", type=int, default=200)
    ap.add_argument("--sampling", default="greedy", help=f"comma-separated: {', '.join(SAMPLING)}")
    ap.add_argument("--clock", default="wall", choices=("wall", "cpu"),
                    help="cpu: process CPU time with the kernels on one thread (a busy machine's other jobs "
                         "do not count)")
    args = ap.parse_args()
    if args.clock == "cpu":
        global CLOCK
        CLOCK = time.process_time
        ext = probe().ext
        if ext is not None:
            ext.set_threads(1)
    widths = [int(w) for w in args.widths.split(",")]
    for name in args.models.split(","):
        for sampling in args.sampling.split(","):
            profile(PATHS[name](), args.layout, widths, args.steps, args.prompt, sampling)


if __name__ == "__main__":
    main()
