"""Engine speed and memory on the real test models, beside llama.cpp's llama-bench when it is on PATH.

    .venv/bin/python bench/engine.py [--layout auto|dense|packed] [--prompt 512] [--gen 128] [--runs 3]

Prints, per model: load time, prefill tok/s (512-token prompt), decode tok/s (128 tokens, batch 1),
peak memory; then llama.cpp's figures for the same file and the ratio. Medians over --runs.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench.blas_first  # noqa: F401  (OpenBLAS before mlx is first imported)

# isort: split
import mlx.core as mx

from gmlx_server.engine.blas import current_blas
from gmlx_server.engine.loader import load_gguf_model
from gmlx_server.engine.mlx_engine import MLXEngine
from gmlx_server.engine.types import GenerationRequest, SamplingParams, TokenEvent
from tests.conftest import gemma_path, smollm2_path


def _prompt(engine: MLXEngine, n: int) -> list[int]:
    text = " ".join(f"word{i % 97} of the long benchmark prompt" for i in range(n))
    return engine.tokenizer.encode(text)[:n]


def _one(engine: MLXEngine, prompt: list[int], gen: int, rid: str) -> tuple[float, float]:
    final: list[TokenEvent] = []
    # Ban EOS so every run decodes exactly `gen` tokens.
    bias = {t: -1e9 for t in engine.tokenizer.eos_ids}
    req = GenerationRequest(rid, prompt, gen, SamplingParams(temperature=0.0, logit_bias=bias))
    engine.generate_sync(req, lambda ev: final.append(ev) if ev.finish_reason else None)
    t = final[0].timings
    assert t is not None and t.generated == gen, final[0]
    return t.prefill_tok_s, t.decode_tok_s


def bench_gmlx(path: str, layout: str, n_prompt: int, n_gen: int, runs: int) -> dict[str, float]:
    t0 = time.perf_counter()
    engine = MLXEngine(lambda: load_gguf_model(path, layout=layout))  # type: ignore[arg-type]
    load_s = time.perf_counter() - t0
    try:
        prompt = _prompt(engine, n_prompt)
        _one(engine, prompt[:32], 4, "warm")
        res = [_one(engine, prompt, n_gen, f"r{i}") for i in range(runs)]
    finally:
        engine.close()
    return {
        "load_s": load_s, "layout": engine.info.weights_layout,  # type: ignore[dict-item]
        "prefill_tok_s": statistics.median(r[0] for r in res),
        "decode_tok_s": statistics.median(r[1] for r in res),
        "peak_mlx_mb": mx.get_peak_memory() / 1e6,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3,
    }


def bench_llama_cpp(path: str, n_prompt: int, n_gen: int, runs: int) -> dict[str, float] | None:
    exe = shutil.which("llama-bench")
    if exe is None:
        return None
    out = subprocess.run([exe, "-m", path, "-p", str(n_prompt), "-n", str(n_gen), "-r", str(runs), "-o", "json"],
                         capture_output=True, text=True, check=True, timeout=900).stdout
    rows = json.loads(out)
    pp = next(r for r in rows if r["n_prompt"] > 0)
    tg = next(r for r in rows if r["n_gen"] > 0)
    return {"prefill_tok_s": pp["avg_ts"], "decode_tok_s": tg["avg_ts"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", default="auto", choices=["auto", "dense", "packed"])
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--models", default="smollm2,gemma")
    ap.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    paths = {"smollm2": smollm2_path, "gemma": gemma_path}
    names = args.models.split(",")
    if not args.quiet:
        print(f"BLAS: {current_blas().name} ({current_blas().note}); device {mx.default_device()}")
    if len(names) > 1:  # one process per model, so peak memory and max RSS are that model's own
        for name in names:
            subprocess.run([sys.executable, __file__, *sys.argv[1:], "--models", name, "--quiet"], check=True)
        return
    for name in names:
        path = paths[name]()
        g = bench_gmlx(path, args.layout, args.prompt, args.gen, args.runs)
        print(f"{name:8s} gmlx      layout {g['layout']:6s} load {g['load_s']:.2f} s  "
              f"prefill {g['prefill_tok_s']:7.1f} tok/s  decode {g['decode_tok_s']:6.1f} tok/s  "
              f"peak MLX {g['peak_mlx_mb']:.0f} MB  max RSS {g['max_rss_mb']:.0f} MB")
        ref = bench_llama_cpp(path, args.prompt, args.gen, args.runs)
        if ref is None:
            print(f"{name:8s} llama.cpp not on PATH (build llama-bench to compare)")
            continue
        print(f"{name:8s} llama.cpp prefill {ref['prefill_tok_s']:7.1f} tok/s  decode {ref['decode_tok_s']:6.1f} tok/s"
              f"  -> gmlx/llama.cpp prefill {g['prefill_tok_s'] / ref['prefill_tok_s']:.2f}x"
              f"  decode {g['decode_tok_s'] / ref['decode_tok_s']:.2f}x")


if __name__ == "__main__":
    main()
