"""What tool_choice auto's grammar costs on a model without a call syntax of its own (gmlx's JSON convention),
and how often a tool request's reply is read as a call, before and after reading calls written without markers.

    .venv/bin/python bench/tool_calls.py [--models smollm2,gemma] [--gen 48] [--runs 3] [--depth N]
    .venv/bin/python bench/tool_calls.py --rate [--models smollm2,gemma,qwen0.5,qwen1.5]

The rate: each model answers a fixed set of weather questions (one get_weather tool, in its template's syntax or
gmlx's JSON convention, greedy, `--gen` tokens at most), and each reply is read twice, by the syntax's own parser
(before: the template's markers only) and by the lenient reader (after: bare JSON, fenced json, marker slips).

Per model: the same prompt (a question, the tools in gmlx's system block), greedy, EOS banned so every run
decodes `--gen` tokens, with and without the auto grammar (free text, or text that opens one valid call),
interleaved; prints decode tok/s (medians), whether the two texts are identical, and what masking one token's
logits costs alone (llguidance's mask and its MLX application) beside one softmax of the same logits. Then the
same for a call held by the grammar from its first token (`required`, one write_file tool whose content the
model writes: the mask inside a JSON string) against the same prompt free. `--depth N` puts a filler system
message ahead so both decode after N prompt tokens, as an agent's turn does. Then how long the grammar takes
to build for Claude Code's 24 tools (the schema compile, once per request).
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
from gmlx_server.engine.structured import CompiledGrammar, GrammarConstraint, GrammarViolation
from gmlx_server.engine.tool_grammar import compile_tool_grammar
from gmlx_server.engine.tool_syntax import GMLX_JSON
from gmlx_server.engine.types import GenerationRequest, SamplingParams, TokenEvent
from gmlx_server.generation_params import GenerationParams
from gmlx_server.protocol.tools import FORMATS, CallParser, LenientCalls, ToolCallEnd, new_call_id
from gmlx_server.serving.addressing import Settings
from gmlx_server.serving.generation import render_chat
from gmlx_server.serving.tool_prompt import ToolPlan, plan_tools
from tests.conftest import gemma_path, qwen_coder_path, smollm2_path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather now in a city",
                                           "parameters": {"type": "object", "required": ["city"],
                                                          "properties": {"city": {"type": "string"}}}}}]
QUESTION = "Write a short poem about the sea."
WRITE = [{"type": "function", "function": {"name": "write_file", "description": "Write a text file",
                                           "parameters": {"type": "object", "required": ["path", "content"],
                                                          "properties": {"path": {"type": "string"},
                                                                         "content": {"type": "string"}}}}}]
WRITE_QUESTION = "Write a long poem about the sea into sea.txt."
FILLER = "The harbour log records tides, winds and the ships that came and went that day. "
WEATHER = ("Weather in Paris?", "What's the temperature in Tokyo right now?", "Is it raining in London?",
           "Get me the weather for Berlin.", "How hot is it in Cairo today?", "Weather in New York, please.",
           "Tell me the weather in Sydney.", "Should I bring an umbrella in Seattle today?")


def _run(engine: MLXEngine, prompt: list[int], gen: int, grammar: CompiledGrammar | None) -> tuple[str, float]:
    events: list[TokenEvent] = []
    bias = {t: -1e9 for t in engine.tokenizer.eos_ids}
    req = GenerationRequest("bench", prompt, gen, SamplingParams(temperature=0.0, logit_bias=bias), grammar=grammar)
    engine.generate_sync(req, events.append)
    t = events[-1].timings
    assert t is not None, events[-1]
    return "".join(e.text for e in events), t.decode_tok_s


def _prompt(engine: MLXEngine, question: str, tools: list[dict[str, object]], depth: int) -> list[int]:
    """The question with `tools` in gmlx's system block, after a filler system message of about `depth` tokens."""
    system = FILLER * (depth // max(1, len(engine.tokenizer.encode(FILLER, False))))
    msgs = ({"role": "system", "content": system},) if depth else ()
    inp = GenerationParams(messages=(*msgs, {"role": "user", "content": question}), tools=tuple(tools))
    return engine.tokenizer.encode(render_chat(inp, Settings({}), engine.template, ToolPlan(GMLX_JSON, "json")),
                                   False)


def _compare(engine: MLXEngine, label: str, prompt: list[int], grammar: CompiledGrammar, gen: int,
             runs: int) -> list[tuple[str, float]]:
    _run(engine, prompt, 4, grammar)  # the llguidance tokenizer is built once per model
    free, held = [], []
    for _ in range(runs):
        free.append(_run(engine, prompt, gen, None))
        held.append(_run(engine, prompt, gen, grammar))
    same = all(f[0] == h[0] for f, h in zip(free, held, strict=True))
    f_tok, h_tok = statistics.median(f[1] for f in free), statistics.median(h[1] for h in held)
    print(f"{label:40s} decode tok/s free {f_tok:6.1f}  {grammar.kind:>7s} grammar {h_tok:6.1f}  "
          f"ratio {h_tok / f_tok:.3f}  same text: {'yes' if same else 'no'}  ({len(prompt)} prompt tokens)")
    return held


def bench_model(path: str, gen: int, runs: int, depth: int) -> None:
    engine = MLXEngine(lambda: load_gguf_model(path))
    try:
        prompt = _prompt(engine, QUESTION, TOOLS, depth)
        auto = compile_tool_grammar(GMLX_JSON, TOOLS, "auto")
        free = _compare(engine, Path(path).name, prompt, auto, gen, runs)
        mask_ms, softmax_ms = _mask_cost(engine, auto, free[0][0])
        print(f"{'':40s} mask one token {mask_ms:.2f} ms, one softmax of the same logits {softmax_ms:.2f} ms")
        required = compile_tool_grammar(GMLX_JSON, WRITE, "required")
        held = _compare(engine, "  a write_file call", _prompt(engine, WRITE_QUESTION, WRITE, depth), required,
                        gen, runs)
        mask_ms, _ = _mask_cost(engine, required, held[0][0])
        print(f"{'':40s} mask one token inside the call {mask_ms:.2f} ms")
    finally:
        engine.close()


def _mask_cost(engine: MLXEngine, grammar: CompiledGrammar, text: str) -> tuple[float, float]:
    """Milliseconds per token: the grammar's mask over the model's logits width, and a softmax beside it.
    `text` is re-encoded, which may split differently from the run: the walk stops at the first token refused."""
    width = engine.tokenizer.vocab_size
    constraint = GrammarConstraint(grammar, engine.grammar_tokenizers.get(engine.tokenizer, width))
    logits = mx.random.normal((1, width))
    mx.eval(logits)
    ids, masked = engine.tokenizer.encode(text, False), 0
    t0 = time.perf_counter()
    for token in ids:
        mx.eval(constraint.mask(logits))
        masked += 1
        try:
            constraint.consume(token)
        except GrammarViolation:
            break
    t1 = time.perf_counter()
    for _ in range(masked):
        mx.eval(mx.softmax(logits, axis=-1))
    t2 = time.perf_counter()
    return (t1 - t0) / masked * 1e3, (t2 - t1) / masked * 1e3


def _reads_a_call(parser: CallParser, text: str) -> bool:
    events = parser.feed(text) + parser.finish()
    return any(isinstance(e, ToolCallEnd) for e in events)


def call_rate(path: str, gen: int) -> None:
    """Replies read as calls, by the syntax's own parser and by the lenient reader, over the same texts."""
    engine = MLXEngine(lambda: load_gguf_model(path))
    try:
        before = after = 0
        for question in WEATHER:
            inp = GenerationParams(messages=({"role": "user", "content": question},), tools=tuple(TOOLS))
            plan = plan_tools(inp, engine.template, "auto")
            assert plan is not None
            prompt = engine.tokenizer.encode(render_chat(inp, Settings({}), engine.template, plan), False)
            events: list[TokenEvent] = []
            engine.generate_sync(GenerationRequest("rate", prompt, gen, SamplingParams(temperature=0.0)), events.append)
            text = "".join(e.text for e in events)
            fmt = FORMATS[plan.syntax.name]
            before += _reads_a_call(fmt.streaming(TOOLS), text)
            after += _reads_a_call(LenientCalls(fmt, TOOLS, new_call_id), text)
        n = len(WEATHER)
        print(f"{Path(path).name:40s} {plan.syntax.name:6s} tool-call rate before {before}/{n}  after {after}/{n}")
    finally:
        engine.close()


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
    ap.add_argument("--depth", type=int, default=0, help="prompt tokens ahead of the question (a filler system)")
    ap.add_argument("--rate", action="store_true", help="the tool-call rate before/after, instead of the speed")
    args = ap.parse_args()
    paths = {"smollm2": smollm2_path, "gemma": gemma_path, "qwen0.5": lambda: qwen_coder_path("0.5b"),
             "qwen1.5": lambda: qwen_coder_path("1.5b")}
    for name in args.models.split(","):
        if args.rate:
            call_rate(paths[name](), args.gen)
        else:
            bench_model(paths[name](), args.gen, args.runs, args.depth)
    if not args.rate:
        compile_claude_tools()


if __name__ == "__main__":
    main()
