"""Speculative decoding on the Qwen2.5-Coder pair: decode tok/s with and without the drafter, the accept rate
and the ratio, in one run, through the engine's public interface (MLXEngine.generate_sync, one stream).

    .venv/bin/python bench/speculative.py [--target 1.5b|PATH] [--draft 0.5b|PATH] [--k 4] [--gen 96]
                                          [--temperature 0] [--weights auto] [--rounds 2]

Two engines, built by the server's own factory from the same target entry, one with `draft:`: the plain one
and the speculative one decode the same prompts alternately (so the shared machine's noise hits both), at
width 1. Columns per prompt, medians over --rounds:

  plain, spec   decode tok/s (the tokens after the first, over decode time) without and with the drafter
  ratio         spec / plain: above 1 speculation pays on this machine
  accept        drafted tokens the target kept; tok/round: tokens each round emitted (kept drafts + 1)
  same          whether the two texts are identical (greedy decoding must give the target's own text)

An engine that does not run speculative rounds yet (its info says it drafts nothing) prints the baseline only.

--project adds what greedy speculation would give at each k, from measurements outside the engine: the pair's
greedy agreement on the target's own answers (the drafter reads the target's text once; a round keeps drafts
up to the first disagreement, then emits one target token) and the step times of a target decode step, a
drafter decode step and a target pass over k + 1 tokens:

  projected speedup(k) = tokens * t_step / (rounds(k) * (k * t_draft + t_verify(k + 1)))

(the drafter's passes are counted as k decode steps; a round's bookkeeping is left out, so it is a ceiling).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # the repository root instead of bench/: transformers probes a package `kernels`
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import bench.blas_first  # noqa: F401  (OpenBLAS before mlx is first imported)

# isort: split
import mlx.core as mx

from gmlx_plan.memory import LAYOUT_CHOICES
from gmlx_server.config import Draft, ModelEntry, RuntimeEnv
from gmlx_server.config.settings import DEFAULT_DRAFT_TOKENS
from gmlx_server.engine.cache_trim import trim
from gmlx_server.engine.factory import create_mlx_engine
from gmlx_server.engine.loader import LoadedModel, load_gguf_model
from gmlx_server.engine.mlx_engine import MLXEngine
from gmlx_server.engine.types import GenerationRequest, SamplingParams, SpeculativeStats, Timings, TokenEvent
from tests.conftest import qwen_coder_path

PROMPTS = (
    "Write a Python function that returns whether a string is a palindrome, ignoring case and spaces.",
    "Write a Python function that merges two sorted lists into one sorted list, with a docstring.",
    "Explain what a Python decorator is and show a small timing decorator.",
)


@dataclass(frozen=True)
class Run:
    text: str
    timings: Timings


def _path(name: str) -> str:
    return qwen_coder_path(name) if name in ("0.5b", "1.5b") else name


def _generate(engine: MLXEngine, question: str, gen: int, temperature: float, rid: str) -> Run:
    ids = engine.tokenizer.encode(engine.template.render([{"role": "user", "content": question}]),
                                  add_special_tokens=False)
    events: list[TokenEvent] = []
    req = GenerationRequest(rid, ids, gen, SamplingParams(temperature=temperature, seed=7))
    engine.generate_sync(req, events.append)
    final = events[-1]
    assert final.finish_reason in ("stop", "length") and final.timings is not None, final
    return Run("".join(e.text for e in events), final.timings)


def _engines(args: argparse.Namespace) -> tuple[MLXEngine, MLXEngine | None]:
    env = RuntimeEnv(decode_batch=1, prompt_cache_bytes=0)  # one stream, every prompt prefilled cold
    entry = ModelEntry(id="target", path=_path(args.target), weights=args.weights)
    t0 = time.perf_counter()
    plain = create_mlx_engine(entry, env)
    spec = create_mlx_engine(replace(entry, draft=Draft(_path(args.draft), "draft", args.k)), env)
    print(f"loaded both engines in {time.perf_counter() - t0:.1f} s: target {plain.info.weights_layout} "
          f"{plain.info.weights_bytes / 1e6:.0f} MB, speculative {spec.info.weights_bytes / 1e6:.0f} MB")
    if spec.info.drafts:
        return plain, spec
    spec.close()
    print("speculative: the engine does not run speculative rounds yet (its info drafts nothing): baseline only")
    return plain, None


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _pct(stats: SpeculativeStats) -> str:
    rate = stats.accept_rate
    return f"{rate:.0%}" if rate is not None else "-"


def _row(i: int, plain: list[Run], spec: list[Run]) -> tuple[str, SpeculativeStats]:
    p = _median([r.timings.decode_tok_s for r in plain])
    if not spec:
        return f"{i:>6}  {p:>7.2f}  {'-':>7}  {'-':>6}  {'-':>7}  {'-':>9}  {'-':>5}", SpeculativeStats()
    s = _median([r.timings.decode_tok_s for r in spec])
    stats = SpeculativeStats()
    for r in spec:
        stats = stats + (r.timings.speculative or SpeculativeStats())
    per_round = (stats.accepted + stats.rounds) / stats.rounds if stats.rounds else float("nan")
    same = all(a.text == b.text for a, b in zip(plain, spec, strict=True))
    return (f"{i:>6}  {p:>7.2f}  {s:>7.2f}  {s / p:>5.2f}x  {_pct(stats):>7}  {per_round:>9.2f}  "
            f"{'yes' if same else 'NO':>5}"), stats


def _step_s(fn: Callable[[], Any], repeat: int = 5) -> float:
    """The median wall time of fn() with its arrays evaluated."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _greedy(loaded: LoadedModel, ids: list[int], gen: int) -> list[int]:
    """The target's greedy answer, stopping at EOS."""
    cache = loaded.make_cache()
    out = [_argmax(loaded.model(mx.array([ids]), cache=cache).logits)]
    while len(out) < gen and out[-1] not in loaded.tokenizer.eos_ids:
        out.append(_argmax(loaded.model(mx.array([[out[-1]]]), cache=cache).logits))
    return out


def _argmax(logits: mx.array) -> int:
    token: int = mx.argmax(logits[0, -1]).item()  # type: ignore[assignment]
    return token


def _agreement(draft: LoadedModel, ids: list[int], answer: list[int]) -> list[bool]:
    """Whether the drafter's greedy token after each prefix of the answer is the target's next token."""
    logits = draft.model(mx.array([ids + answer[:-1]]), cache=draft.make_cache()).logits[0, len(ids) - 1:]
    drafted: list[int] = mx.argmax(logits, axis=-1).tolist()  # type: ignore[assignment]
    return [t == a for t, a in zip(drafted, answer, strict=True)]


def _rounds(agree: list[bool], k: int) -> int:
    """Greedy rounds to emit the answer: each keeps drafts up to the first disagreement, plus one token."""
    i = rounds = 0
    while i < len(agree):
        kept = 0
        while kept < k and i + kept < len(agree) and agree[i + kept]:
            kept += 1
        i, rounds = i + kept + 1, rounds + 1
    return rounds


def _pass_s(loaded: LoadedModel, ids: list[int], n: int) -> float:
    """One forward pass of n tokens after the prompt (a decode step at n = 1, a verify pass at k + 1)."""
    cache = loaded.make_cache()
    mx.eval(loaded.model(mx.array([ids]), cache=cache).logits)

    def one() -> Any:
        out = loaded.model(mx.array([[5] * n]), cache=cache).logits
        trim(cache, n)
        return out
    return _step_s(one)


def project(args: argparse.Namespace, ks: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8)) -> None:
    target = load_gguf_model(_path(args.target), layout=args.weights)
    draft = load_gguf_model(_path(args.draft), layout=args.weights)
    tokens, agree = 0, list[list[bool]]()
    for question in PROMPTS:
        ids = target.tokenizer.encode(target.template.render([{"role": "user", "content": question}]),
                                      add_special_tokens=False)
        answer = _greedy(target, ids, args.gen)
        tokens += len(answer)
        agree.append(_agreement(draft, ids, answer))
    print(f"\nprojection (greedy, outside the engine): the drafter agrees on {sum(map(sum, agree)) / tokens:.0%} "
          f"of the target's {tokens} tokens; step times measured side by side for each k")
    print(f"{'k':>3}  {'step ms':>7}  {'draft ms':>8}  {'verify ms':>9}  {'tok/round':>9}  {'speedup':>7}")
    for k in ks:  # each k's times measured together, so the shared machine's drift cancels in the ratio
        rounds = sum(_rounds(a, k) for a in agree)
        t1, t_draft, t_verify = _pass_s(target, ids, 1), _pass_s(draft, ids, 1), _pass_s(target, ids, k + 1)
        speedup = tokens * t1 / (rounds * (k * t_draft + t_verify))
        print(f"{k:>3}  {t1 * 1e3:>7.0f}  {t_draft * 1e3:>8.0f}  {t_verify * 1e3:>9.0f}  {tokens / rounds:>9.2f}  "
              f"{speedup:>6.2f}x")


def compare(args: argparse.Namespace) -> None:
    """The plain and the speculative engine on every prompt, alternately; a row per prompt, then the medians."""
    plain, spec = _engines(args)
    try:
        print(f"\ntarget {args.target}, draft {args.draft}, k {args.k}, {args.gen} tokens, temperature "
              f"{args.temperature:g}, width 1\n")
        print(f"{'prompt':>6}  {'plain':>7}  {'spec':>7}  {'ratio':>6}  {'accept':>7}  {'tok/round':>9}  {'same':>5}")
        ratios, total = [], SpeculativeStats()
        for i, question in enumerate(PROMPTS):
            runs: dict[str, list[Run]] = {"plain": [], "spec": []}
            for r in range(args.rounds):  # alternate: the shared machine's noise lands on both
                runs["plain"].append(_generate(plain, question, args.gen, args.temperature, f"p{i}.{r}"))
                if spec is not None:
                    runs["spec"].append(_generate(spec, question, args.gen, args.temperature, f"s{i}.{r}"))
            line, stats = _row(i, runs["plain"], runs["spec"])
            print(line)
            total = total + stats
            if spec is not None:
                ratios.append(_median([r.timings.decode_tok_s for r in runs["spec"]])
                              / _median([r.timings.decode_tok_s for r in runs["plain"]]))
        if ratios:
            print(f"\nmedian ratio {_median(ratios):.2f}x; accept rate {_pct(total)} over {total.rounds} rounds "
                  f"({total.drafted} drafted, {total.accepted} kept)")
    finally:
        plain.close()
        if spec is not None:
            spec.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="1.5b", help="1.5b, 0.5b or a GGUF path")
    ap.add_argument("--draft", default="0.5b", help="0.5b, 1.5b or a GGUF path")
    ap.add_argument("--k", type=int, default=DEFAULT_DRAFT_TOKENS, help="tokens drafted per round")
    ap.add_argument("--gen", type=int, default=96, help="max tokens per answer")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--weights", default="auto", choices=LAYOUT_CHOICES)
    ap.add_argument("--rounds", type=int, default=2, help="runs of every prompt on each engine (medians; 0: none)")
    ap.add_argument("--project", action="store_true", help="also project greedy speedups for k = 1..8")
    args = ap.parse_args()
    if args.rounds > 0:
        compare(args)
    if args.project:
        project(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
