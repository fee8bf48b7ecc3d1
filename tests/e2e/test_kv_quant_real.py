"""Quantized KV caches on the real models: MLX's bytes equal the planner's, 8-bit keeps the logits, batched
and prompt-cached quantized streams equal the same requests alone and cold, and a real server reports each
verdict in /v1/models and the same capacity section as `gmlx plan --kv-quant`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from bench.kv_quant import run
from gmlx_plan.gguf_header import read_header
from gmlx_plan.memory import KVQuant
from gmlx_server.engine.loader import LoadedModel, load_gguf_model
from gmlx_server.engine.mlx_engine import MLXEngine
from tests.conftest import gemma_path, qwen_coder_path, smollm2_path
from tests.e2e.server import gmlx_serve
from tests.e2e.test_batching import _check
from tests.e2e.test_prompt_cache import _hits, _run

pytestmark = pytest.mark.slow
TEXT = "In a quiet village by the river, the baker rose before dawn to light the ovens. " * 12


@pytest.fixture(scope="module", params=["smollm2", "gemma"])
def loaded(request: pytest.FixtureRequest) -> LoadedModel:
    return load_gguf_model(smollm2_path() if request.param == "smollm2" else gemma_path())


def test_kv_bytes_equal_the_planner_and_8_bit_keeps_the_logits(loaded: LoadedModel) -> None:
    """MLX's active bytes after an 800-token chunked prefill and 3 steps, over gmlx_plan's kv_bytes: within 5%
    for fp32, uniform 8 and 4 and kvarn; uniform 8-bit keeps every top token of the prompt's last 64."""
    ids = loaded.tokenizer.encode(TEXT * 3)[:800]
    runs = {q: run(loaded, q, ids, 3) for q in (None, KVQuant("uniform", 8, 64), KVQuant("uniform", 4, 64),
                                                KVQuant("kvarn", 4, 64, value_bits=2, tail_tokens=128))}
    for q, r in runs.items():
        assert 0.95 <= r.measured / r.planned <= 1.05, (q, r.measured, r.planned)
    fp, q8 = runs[None], runs[KVQuant("uniform", 8, 64)]
    assert (fp.logits.argmax(-1) == q8.logits.argmax(-1)).all()
    assert float(np.abs(fp.logits - q8.logits).max()) < 1.5  # measured 0.4 (SmolLM2), 0.5 (Gemma 3)
    assert runs[KVQuant("uniform", 4, 64)].measured < q8.measured < fp.measured


def test_float16_kv_bytes_equal_the_planner_and_keep_the_logits(loaded: LoadedModel) -> None:
    """kv_dtype float16: MLX holds the planner's bytes (half of fp32's on every unquantized layer, Gemma 3's
    sliding ones included), and the logits stay within float16 rounding of fp32 KV's: every top token kept."""
    ids = loaded.tokenizer.encode(TEXT * 3)[:800]
    fp, half = run(loaded, None, ids, 3), run(loaded, None, ids, 3, half=True)
    assert 0.95 <= half.measured / half.planned <= 1.05, (half.measured, half.planned)
    assert 0.45 <= half.measured / fp.measured <= 0.55
    assert (fp.logits.argmax(-1) == half.logits.argmax(-1)).all()
    assert float(np.abs(fp.logits - half.logits).max()) < 0.5
    mixed = run(loaded, KVQuant("uniform", 8, 64), ids, 3, half=True)  # quantized layers, the rest float16
    assert 0.95 <= mixed.measured / mixed.planned <= 1.05, (mixed.measured, mixed.planned)


@pytest.mark.parametrize("q", [KVQuant("uniform", 8, 64), KVQuant("kvarn", 8, 64, value_bits=4, tail_tokens=16)])
def test_quantized_streams_batch_as_they_run_alone(q: KVQuant) -> None:
    engine = MLXEngine(lambda: load_gguf_model(smollm2_path(), kv_quant=q), decode_batch=3)
    try:
        assert engine.info.kv_quant is not None and engine.info.kv_quant.verdict == "full"
        qs = ["What is the capital of France?", "Name three colors.", "Write a haiku about the sea. " * 4]
        prompts = [engine.tokenizer.encode(engine.template.render([{"role": "user", "content": t}]),
                                           add_special_tokens=False) for t in qs]
        _check(engine, prompts, 12)
    finally:
        engine.close()


@pytest.mark.parametrize("q", [KVQuant("uniform", 4, 64), KVQuant("kvarn", 4, 64, value_bits=2, tail_tokens=32)])
def test_a_prompt_cache_hit_on_quantized_kv_matches_the_cold_run(q: KVQuant) -> None:
    engine = MLXEngine(lambda: load_gguf_model(smollm2_path(), kv_quant=q), prompt_cache_bytes=64 << 20)
    try:
        base = engine.tokenizer.encode(TEXT)
        cold, _ = _run(engine, base)
        assert _run(engine, base) == (cold, len(base) - 1)  # restored packed, never re-quantized
        assert _hits(engine)["exact"] == 1 and engine.cache_stats().bytes > 0
        if q.scheme == "uniform":  # every token quantizes alone: a cut-back prefix is exact too
            other = base[:200] + engine.tokenizer.encode(" Meanwhile a ship sailed north.", add_special_tokens=False)
            fresh = MLXEngine(lambda: load_gguf_model(smollm2_path(), kv_quant=q))
            try:
                ref, _ = _run(fresh, other)
            finally:
                fresh.close()
            toks, warm = _run(engine, other)
            assert toks == ref and warm >= 192 and _hits(engine)["block"] == 1
    finally:
        engine.close()


def _config(tmp_path: Path) -> Path:
    cfg = tmp_path / "gmlx.yaml"
    cfg.write_text(
        "server:\n  memory_budget: 3GiB\n  decode_batch: 2\n  default_model: full\nmodels:\n"
        f"  full:\n    path: {smollm2_path()}\n"
        "    kv_quant: {scheme: kvarn, bits: 4, value_bits: 2, tail_tokens: 64}\n"
        f"  dropped:\n    path: {smollm2_path()}\n    kv_quant: {{scheme: uniform, bits: 8, group_size: 128}}\n"
        f"  partial:\n    path: {gemma_path()}\n    kv_quant: {{scheme: uniform, bits: 8}}\n"
        f"  plain:\n    path: {smollm2_path()}\n"
        f"  plain32:\n    path: {smollm2_path()}\n    kv_dtype: float32\n")
    return cfg


def test_a_server_reports_each_verdict_and_plans_as_gmlx_plan(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    plan = subprocess.run([sys.executable, "-m", "gmlx_server.cli", "plan", "--config", str(cfg), "--model", "full",
                           "--kv-quant", "kvarn:4:2:64", "--width", "2", "--depth", "4096", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert plan.returncode in (0, 1), plan.stderr
    with gmlx_serve(["--config", str(cfg)], tmp_path) as s:
        client = openai.OpenAI(base_url=s.v1, api_key="unused", max_retries=0, timeout=120)
        for model in ("full", "dropped", "partial", "plain", "plain32"):
            out = client.chat.completions.create(model=model, max_tokens=3, temperature=0,
                                                 messages=[{"role": "user", "content": "Hi"}])
            assert out.choices[0].message.content
        rows = {m["id"]: m for m in httpx.get(s.v1 + "/models", timeout=10).json()["data"]}
        server_cap = httpx.get(s.v1 + "/metrics", timeout=10).json()["server"]["capacity"]
    kv = {mid: rows[mid].get("kv_quant") for mid in rows}
    assert kv["full"] == {"scheme": "kvarn", "bits": 4, "group_size": 64, "value_bits": 2, "tail_tokens": 64,
                          "layers_quantized": 30, "layers_fp16": 0, "verdict": "full", "verdict_batched": "full"}
    assert kv["dropped"] is not None and kv["dropped"]["verdict"] == "dropped"  # head size 64: no group of 128
    assert "value_bits" not in kv["dropped"] and kv["dropped"]["layers_fp16"] == 30
    partial = kv["partial"]  # Gemma 3: the sliding-window layers keep their rotating fp32 caches
    assert partial is not None and (partial["verdict"], partial["layers_quantized"], partial["layers_fp16"]) == (
        "partial", 3, 15)
    assert kv["plain"] is None
    dtypes = {mid: rows[mid]["kv_dtype"] for mid in rows}  # the kernels attend here: auto is float16 (even
    # where kv_quant leaves no layer unquantized, as the capacity table's kv_dtype_bytes says)
    assert dtypes == {"full": "float16", "dropped": "float16", "partial": "float16", "plain": "float16",
                      "plain32": "float32"}
    assert server_cap["kv_dtype_bytes"] == 2
    assert json.loads(plan.stdout)["capacity"] == server_cap  # field for field, the kv_quant object included
    assert server_cap["kv_quant"] == {k: v for k, v in kv["full"].items()}


def test_the_qwen_coder_pair_shares_a_tokenizer_and_quantizes_fully() -> None:
    """The speculative pair (0.5B drafts for 1.5B): one token list; the 0.5B's 24 layers quantize at 8 bits
    and its greedy code answer keeps fp32 KV's first tokens."""
    small, big = read_header(qwen_coder_path("0.5b")), read_header(qwen_coder_path("1.5b"))
    assert small.architecture == big.architecture == "qwen2"
    assert small.metadata["tokenizer.ggml.tokens"] == big.metadata["tokenizer.ggml.tokens"]
    loaded = load_gguf_model(qwen_coder_path("0.5b"))
    ids = loaded.tokenizer.encode(loaded.template.render([{"role": "user", "content": "Add two numbers in Python."}]),
                                  add_special_tokens=False)
    fp, q8 = run(loaded, None, ids, 8), run(loaded, KVQuant("uniform", 8, 64), ids, 8)
    report = load_gguf_model(qwen_coder_path("0.5b"), kv_quant=KVQuant("uniform", 8, 64)).info.kv_quant
    assert report is not None and (report.verdict, report.layers_quantized) == ("full", 24)
    assert q8.greedy == fp.greedy and 0.95 <= q8.measured / q8.planned <= 1.05
