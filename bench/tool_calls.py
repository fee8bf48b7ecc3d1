"""What tool_choice auto's grammar costs on a model without a call syntax of its own (gmlx's JSON convention).

    .venv/bin/python bench/tool_calls.py [--models smollm2,gemma] [--gen 48] [--runs 3]

Per model: the same prompt (a question, the tools in gmlx's system block), greedy, EOS banned so every run
decodes `--gen` tokens, with and without the auto grammar (free text, or text that opens one valid call),
interleaved; prints decode tok/s (medians), whether the two texts are identical, and what masking one token's
logits costs alone (llguidance's mask and its MLX application) beside one softmax of the same logits. Then how
long the grammar takes to build for Claude Code's 24 tools (the schema compile, once per request).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench.blas_first  # noqa: F401  (OpenBLAS before mlx is first imported)

# isort: split
import mlx.core as mx

from gmlx_server.engine.loader import load_gguf_model
from gmlx_server.engine.mlx_engine import MLXEngine
from gmlx_server.engine.structured import CompiledGrammar, GrammarConstraint
from gmlx_server.engine.tool_grammar import compile_tool_grammar
from gmlx_server.engine.tool_syntax import GMLX_JSON
from gmlx_server.engine.types import GenerationRequest, SamplingParams, TokenEvent
from gmlx_server.neutral import GenerationParams
from gmlx_server.service.addressing import Settings
from gmlx_server.service.generate import render_chat
from gmlx_server.service.tool_prompt import ToolPlan
from tests.conftest import gemma_path, smollm2_path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather now in a city",
                                           "parameters": {"type": "object", "required": ["city"],
                                                          "properties": {"city": {"type": "string"}}}}}]
QUESTION = "Write a short poem about the sea."


def _run(engine: MLXEngine, prompt: list[int], gen: int, grammar: CompiledGrammar | None) -> tuple[str, float]:
    events: list[TokenEvent] = []
    bias = {t: -1e9 for t in engine.tokenizer.eos_ids}
    req = GenerationRequest("bench", prompt, gen, SamplingParams(temperature=0.0, logit_bias=bias), grammar=grammar)
    engine.generate_sync(req, events.append)
    t = events[-1].timings
    assert t is not None, events[-1]
    return "".join(e.text for e in events), t.decode_tok_s


def bench_model(path: str, gen: int, runs: int) -> None:
    engine = MLXEngine(lambda: load_gguf_model(path))
    try:
        inp = GenerationParams(messages=({"role": "user", "content": QUESTION},), tools=tuple(TOOLS))
        text = render_chat(inp, Settings({}), engine.template, ToolPlan(GMLX_JSON, "json"))
        prompt = engine.tokenizer.encode(text, False)
        grammar = compile_tool_grammar(GMLX_JSON, TOOLS, "auto")
        _run(engine, prompt, 4, grammar)  # the llguidance tokenizer is built once per model
        free, held = [], []
        for _ in range(runs):
            free.append(_run(engine, prompt, gen, None))
            held.append(_run(engine, prompt, gen, grammar))
        same = all(f[0] == h[0] for f, h in zip(free, held, strict=True))
        f_tok, h_tok = statistics.median(f[1] for f in free), statistics.median(h[1] for h in held)
        print(f"{Path(path).name:40s} decode tok/s free {f_tok:6.1f}  auto grammar {h_tok:6.1f}  "
              f"ratio {h_tok / f_tok:.3f}  same text: {'yes' if same else 'no'}")
        mask_ms, softmax_ms = _mask_cost(engine, grammar, free[0][0])
        print(f"{'':40s} mask one token {mask_ms:.2f} ms, one softmax of the same logits {softmax_ms:.2f} ms")
    finally:
        engine.close()


def _mask_cost(engine: MLXEngine, grammar: CompiledGrammar, text: str) -> tuple[float, float]:
    """Milliseconds per token: the grammar's mask over the model's logits width, and a softmax beside it."""
    width = engine.tokenizer.vocab_size
    constraint = GrammarConstraint(grammar, engine.grammar_tokenizers.get(engine.tokenizer, width))
    logits = mx.random.normal((1, width))
    mx.eval(logits)
    ids = engine.tokenizer.encode(text, False)
    t0 = time.perf_counter()
    for token in ids:
        mx.eval(constraint.mask(logits))
        constraint.consume(token)
    t1 = time.perf_counter()
    for _ in ids:
        mx.eval(mx.softmax(logits, axis=-1))
    t2 = time.perf_counter()
    return (t1 - t0) / len(ids) * 1e3, (t2 - t1) / len(ids) * 1e3


def compile_claude_tools() -> None:
    body = json.loads((ROOT / "tests/data/agents/claude-session.json").read_text())["requests"][0]["body"]
    tools = [{"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}}
             for t in body["tools"]]
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        compile_tool_grammar(GMLX_JSON, tools, "required")
        times.append(time.perf_counter() - t0)
    print(f"grammar for Claude Code's {len(tools)} tools: {statistics.median(times) * 1e3:.1f} ms (median of 5)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2,gemma")
    ap.add_argument("--gen", type=int, default=48)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    paths = {"smollm2": smollm2_path, "gemma": gemma_path}
    for name in args.models.split(","):
        bench_model(paths[name](), args.gen, args.runs)
    compile_claude_tools()


if __name__ == "__main__":
    main()
