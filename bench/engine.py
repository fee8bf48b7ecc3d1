"""Engine speed and memory on the real test models, beside llama.cpp's llama-bench when it is on PATH.

    .venv/bin/python bench/engine.py [--layout auto|dense|packed] [--prompt 512] [--gen 128] [--runs 3]
                                     [--models smollm2,gemma,qwen0.5b,qwen1.5b] [--activations f32,auto]
                                     [--kv-dtype float32,float16]

Prints, per model: load time, prefill tok/s (512-token prompt), decode tok/s (128 tokens, batch 1), the
GB/s a decode step reads (the weights a step multiplies: every matrix, the output head, not the embedding
table's lookup) beside a read ceiling measured just after (numpy OR-reducing 1 GB on the kernels' threads,
bench/kernel_speed.py's; a plain C reader gets somewhat more), graph nodes per step, peak memory, the
process's resident growth from loading; then llama.cpp's figures for the same file (its decode at a depth
of the prompt's length, as gmlx's follows its prompt) and the ratio. Medians over --runs. --activations
runs gmlx once per CPU-kernel activation mode (f32: fp32 activations, the kernels before integer dot
products; auto: the default), in one process. --kv-dtype loads one engine per KV cache dtype (the config's
kv_dtype) and alternates them run by run, printing each decode beside the first's (e.g. float16 KV against
float32 after a long --prompt). Every figure line ends with the load average it was taken under.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench.blas_first  # noqa: F401  (OpenBLAS before mlx is first imported)

# isort: split
import mlx.core as mx

from bench import step_profile
from bench.kernel_speed import read_ceiling
from gmlx_plan.gguf_header import read_header
from gmlx_plan.memory import LAYOUT_CHOICES
from gmlx_server.engine.blas import current_blas
from gmlx_server.engine.kernels import probe
from gmlx_server.engine.loader import LoadedModel, load_gguf_model
from gmlx_server.engine.mlx_engine import MLXEngine
from gmlx_server.engine.types import GenerationRequest, SamplingParams, TokenEvent
from gmlx_server.serving.residency import release_memory
from tests.conftest import gemma_path, qwen_coder_path, smollm2_path

PATHS = {"smollm2": smollm2_path, "gemma": gemma_path, "qwen0.5b": lambda: qwen_coder_path("0.5b"),
         "qwen1.5b": lambda: qwen_coder_path("1.5b")}


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


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def step_bytes(path: str) -> int:
    """Bytes one decode step reads: every tensor but the embedding table, which it reads one row of,
    unless the output head is that table (tied)."""
    tensors = read_header(path, strings=False).tensors
    tied = not any(t.name == "output.weight" for t in tensors)
    return sum(t.nbytes for t in tensors if tied or t.name != "token_embd.weight")


def load_avg() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def bench_gmlx(path: str, layout: str, n_prompt: int, n_gen: int, runs: int,
               modes: list[str], kv_dtypes: list[str]) -> dict[str, Any]:
    rss0, t0 = _rss(), time.perf_counter()
    loaded: list[LoadedModel] = []  # the engines' models, for counting each graph's nodes

    def load(kv_dtype: str) -> LoadedModel:
        loaded.append(load_gguf_model(path, layout=layout, kv_dtype=kv_dtype))  # type: ignore[arg-type]
        return loaded[-1]

    made = [MLXEngine(functools.partial(load, dt)) for dt in kv_dtypes]
    engines = {e.info.kv_dtype: e for e in made}  # by what each really built (auto resolved)
    load_s = (time.perf_counter() - t0) / len(engines)
    release_memory()  # as the server does after a load
    resident = (_rss() - rss0) / 1e6 / len(engines)
    ext = probe().ext
    decode: dict[tuple[str, str], float] = {}
    prefill: list[float] = []
    try:
        first = next(iter(engines.values()))
        prompt = _prompt(first, n_prompt)
        for engine in engines.values():
            _one(engine, prompt[:32], 4, "warm")
        for mode in modes:
            if ext is not None:
                ext.set_activations(mode)
            res: dict[str, list[tuple[float, float]]] = {dt: [] for dt in engines}
            for i in range(runs):  # the KV dtypes alternate run by run: the box's drift lands on both
                for dt, engine in engines.items():
                    res[dt].append(_one(engine, prompt, n_gen, f"{mode}{dt}{i}"))
            for dt, rs in res.items():
                decode[(dt, mode)] = statistics.median(r[1] for r in rs)
                prefill = [r[0] for r in rs]
        nodes = {lm.info.kv_dtype: _ops_per_step(lm) for lm in loaded}  # a float16 cache adds its casts
    finally:
        for engine in engines.values():
            engine.close()
        if ext is not None:
            ext.set_activations("auto")
    return {
        "load_s": load_s, "resident_mb": resident, "file_mb": Path(path).stat().st_size / 1e6,
        "layout": first.info.weights_layout, "step_gb": step_bytes(path) / 1e9, "nodes": nodes,
        "prefill_tok_s": statistics.median(prefill), "decode": decode,
        "decode_tok_s": decode[(list(engines)[-1], modes[-1])], "load_avg": load_avg(), "kv_dtypes": list(engines),
        "peak_mlx_mb": mx.get_peak_memory() / 1e6,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3,
    }


def bench_llama_cpp(path: str, n_prompt: int, n_gen: int, runs: int) -> dict[str, float] | None:
    """llama-bench's prefill and decode, measured separately: a crash in one leaves the other's figure."""
    exe = shutil.which("llama-bench")
    if exe is None:
        return None
    out: dict[str, float] = {}
    # decode at a depth of the prompt's length, as gmlx's decode follows its prompt (llama-bench's default
    # decodes at an empty context, which flatters it more the longer the prompt)
    for key, p, n, depth in (("prefill_tok_s", n_prompt, 0, 0), ("decode_tok_s", 0, n_gen, n_prompt)):
        done = subprocess.run([exe, "-m", path, "-p", str(p), "-n", str(n), "-d", str(depth), "-r", str(runs),
                               "-o", "json"], capture_output=True, text=True, timeout=900)
        if done.returncode == 0:
            out[key] = json.loads(done.stdout)[0]["avg_ts"]
        else:
            print(f"llama-bench -p {p} -n {n} failed (exit {done.returncode}): {done.stderr.strip()[-200:]}")
    return out


def _ratio(ours: float, ref: float | None) -> str:
    return f"{ours / ref:.2f}x" if ref else "n/a"


def profile(path: str, layout: str, width: int) -> None:
    """One decode step per op class at widths 1..width (bench/step_profile.py), and its graph's nodes."""
    lm = load_gguf_model(path, layout=layout)  # type: ignore[arg-type]
    print(f"  graph ops in one width-1 decode step: {_ops_per_step(lm)} with gmlx's CPU norm/RoPE/attention "
          f"primitives, {_ops_per_step(lm, fast=False)} with MLX's own")
    del lm
    step_profile.profile(path, layout, list(range(1, width + 1)))


def _ops_per_step(lm: Any, fast: bool = True) -> int:
    """Nodes in one decode step's graph (each is one dispatch on MLX's CPU backend); fast=False: with this
    model's primitives switched to MLX's own ops for the count."""
    kernels, model = lm.kernels, lm.model
    ext = kernels.ext if kernels is not None else None
    if kernels is not None and not fast:
        kernels.ext = None
    try:
        cache = lm.make_cache()  # the loader's caches: float16 ones add their casts to the graph
        mx.eval(model(mx.array([[1, 2, 3, 4]]), cache=cache).logits)
        with tempfile.NamedTemporaryFile("r", suffix=".dot") as f:
            mx.export_to_dot(f.name, model(mx.array([[5]]), cache=cache).logits)
            return len(re.findall(r'label ="', f.read()))
    finally:
        if kernels is not None:
            kernels.ext = ext


def _print_decode(name: str, g: dict[str, Any], modes: list[str], kv_dtypes: list[str]) -> None:
    ext = probe().ext
    threads = ext.threads() if ext is not None else 2
    ceiling = read_ceiling(threads)  # what a reader gets now, beside the step's own GB/s
    base = g["decode"][(kv_dtypes[0], modes[0])]
    for (dt, mode), tok_s in g["decode"].items():
        print(f"{name:8s} gmlx      activations {mode:5s} KV {dt:7s} decode {tok_s:6.1f} tok/s = "
              f"{tok_s * g['step_gb']:5.1f} GB/s ({g['step_gb'] * 1e3:.0f} MB of weights a step, "
              f"{tok_s * g['step_gb'] / ceiling:.2f}x the read ceiling of {ceiling:.1f} GB/s: numpy, {threads} "
              f"threads); {g['nodes'][dt]} graph nodes a step; x{tok_s / base:.2f} of {modes[0]}, KV {kv_dtypes[0]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", default="auto", choices=LAYOUT_CHOICES)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--models", default="smollm2,gemma", help=f"comma-separated: {', '.join(PATHS)}")
    ap.add_argument("--activations", default="auto", help="CPU-kernel activation modes, each timed (f32,auto)")
    ap.add_argument("--kv-dtype", default="auto", help="KV cache dtypes, one engine each, alternated "
                                                       "(float32,float16; auto: the server's default)")
    ap.add_argument("--profile", action="store_true", help="time one decode step per op class and width instead")
    ap.add_argument("--width", type=int, default=4, help="--profile: widths 1 to this many rows per step")
    ap.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.profile:
        for name in args.models.split(","):
            profile(PATHS[name](), args.layout, args.width)
        return
    paths = PATHS
    names = args.models.split(",")
    if not args.quiet:
        print(f"BLAS: {current_blas().name} ({current_blas().note}); device {mx.default_device()}")
    if len(names) > 1:  # one process per model, so peak memory and max RSS are that model's own
        for name in names:
            subprocess.run([sys.executable, __file__, *sys.argv[1:], "--models", name, "--quiet"], check=True)
        return
    for name in names:
        path = paths[name]()
        modes = list(dict.fromkeys(args.activations.split(",")))  # each mode once
        kv_dtypes = list(dict.fromkeys(args.kv_dtype.split(",")))
        g = bench_gmlx(path, args.layout, args.prompt, args.gen, args.runs, modes, kv_dtypes)
        print(f"{name:8s} gmlx      layout {g['layout']:6s} load {g['load_s']:.2f} s  "
              f"prefill {g['prefill_tok_s']:7.1f} tok/s  decode {g['decode_tok_s']:6.1f} tok/s  "
              f"peak MLX {g['peak_mlx_mb']:.0f} MB  max RSS {g['max_rss_mb']:.0f} MB; {g['load_avg']}")
        _print_decode(name, g, modes, g["kv_dtypes"])
        print(f"{name:8s} gmlx      resident after load +{g['resident_mb']:.0f} MB for a {g['file_mb']:.0f} MB file "
              f"({g['resident_mb'] / g['file_mb']:.2f}x, weights, tokenizer and the rest)")
        ref = bench_llama_cpp(path, args.prompt, args.gen, args.runs)
        if ref is None:
            print(f"{name:8s} llama.cpp not on PATH (build llama-bench to compare)")
            continue
        pp, tg = ref.get("prefill_tok_s"), ref.get("decode_tok_s")
        print(f"{name:8s} llama.cpp prefill {pp or float('nan'):7.1f} tok/s  decode {tg or float('nan'):6.1f} tok/s"
              f"  -> gmlx/llama.cpp prefill {_ratio(g['prefill_tok_s'], pp)}  decode {_ratio(g['decode_tok_s'], tg)}")


if __name__ == "__main__":
    main()
