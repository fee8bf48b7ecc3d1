"""Quantized KV caches on the real models: the bytes MLX allocates against the planner's formula, and
what quantization does to the logits and to greedy text.

    .venv/bin/python bench/kv_quant.py [--model smollm2|gemma|both] [--tokens 1100] [--gen 48]

For each scheme, one model load serves every cache configuration (the caches come from the loader's
CacheFactory, rebuilt per scheme; "fp16" is kv_dtype float16: the unquantized layers' keys and values at 2
bytes, which the CPU kernels read as stored; "fp32" stays the reference whatever the default). Columns:

  measured/planned  MLX active bytes held by the caches after prefilling `tokens` and 3 decode steps,
                    over gmlx_plan.memory.kv_bytes at that depth
  max|dlogit|       the largest difference from fp32 KV over the prompt's last 64 positions' logits
  top1              how many of those positions keep the fp32 KV's top token
  same greedy       how many greedy tokens equal the fp32 KV's before the first difference (of --gen)
"""

from __future__ import annotations

import argparse
import gc
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # the repository root instead of bench/: transformers probes a package `kernels`
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import bench.blas_first  # noqa: F401  (OpenBLAS before mlx is first imported)

# isort: split
import mlx.core as mx
import numpy as np

from gmlx_plan.geometry import geometry_from_header
from gmlx_plan.memory import KV_DTYPE_BYTES, PREFILL_CHUNK, KVQuant, kv_bytes, model_from_header, quantized_layers
from gmlx_server.engine.arch import make_cache
from gmlx_server.engine.kv_quant import CacheFactory
from gmlx_server.engine.loader import LoadedModel, load_gguf_model
from tests.conftest import gemma_path, smollm2_path

SCHEMES: dict[str, tuple[KVQuant | None, bool]] = {  # label -> (kv_quant, float16 unquantized layers)
    "fp32": (None, False),
    "fp16": (None, True),
    "uniform 8": (KVQuant("uniform", 8, 64), False),
    "uniform 4": (KVQuant("uniform", 4, 64), False),
    "kvarn 4/2 tail 128": (KVQuant("kvarn", 4, 64, value_bits=2, tail_tokens=128), False),
    "kvarn 4/4 tail 64": (KVQuant("kvarn", 4, 64, value_bits=4, tail_tokens=64), False),
}
TEXT = " ".join(f"Line {i}: the pump at station {i % 11} read {i * 37 % 101} kPa at {i % 24}:00." for i in range(400))


def factory(loaded: LoadedModel, q: KVQuant | None, half: bool = False) -> CacheFactory:
    model = loaded.model
    return CacheFactory(lambda: make_cache(model), q, quantized_layers(geometry_from_header(loaded.header), q), half)


@dataclass(frozen=True)
class Run:
    measured: int  # active bytes the caches hold
    planned: int  # gmlx_plan.memory.kv_bytes at the same depth
    logits: np.ndarray  # the prompt's last 64 positions (numpy: MLX then holds nothing but the caches)
    greedy: list[int]


def run(loaded: LoadedModel, q: KVQuant | None, ids: list[int], gen: int, half: bool = False) -> Run:
    """Chunked prefill as the engine does it, then greedy decode; the caches' bytes after 3 steps."""
    gc.collect()
    mx.clear_cache()
    base = mx.get_active_memory()
    caches = factory(loaded, q, half)()
    rows = []
    for s in range(0, len(ids), PREFILL_CHUNK):
        rows.append(np.array(loaded.model(mx.array([ids[s: s + PREFILL_CHUNK]]), cache=caches).logits[0, -64:]))
    logits = np.concatenate(rows)[-64:]
    greedy, measured = [int(logits[-1].argmax())], 0
    for i in range(gen):
        nxt = loaded.model(mx.array([[greedy[-1]]]), cache=caches).logits[0, -1]
        greedy.append(int(mx.argmax(nxt).item()))
        if i == 2:
            mx.eval(_arrays(caches))
            del nxt
            gc.collect()
            measured = mx.get_active_memory() - base
    m = model_from_header(loaded.header, loaded.info.weights_layout, q,  # type: ignore[arg-type]
                          kv_dtype_bytes=KV_DTYPE_BYTES["float16" if half else "float32"])
    planned = kv_bytes(m, len(ids) + 3)
    return Run(measured, planned, logits, greedy)


def _arrays(caches: list[Any]) -> list[Any]:
    return [c.state for c in caches if not c.empty()]


def prompt(loaded: LoadedModel, tokens: int) -> list[int]:
    return loaded.tokenizer.encode(TEXT)[:tokens]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["smollm2", "gemma", "both"], default="both")
    ap.add_argument("--tokens", type=int, default=1100)
    ap.add_argument("--gen", type=int, default=48)
    args = ap.parse_args()
    for name in ("smollm2", "gemma") if args.model == "both" else (args.model,):
        loaded = load_gguf_model(smollm2_path() if name == "smollm2" else gemma_path())
        ids = prompt(loaded, args.tokens)
        print(f"\n{name} ({loaded.info.weights_layout} layout), {len(ids)} prompt tokens, {args.gen} greedy")
        print(f"{'scheme':<20} {'layers q/fp':>11} {'bytes/token':>11} {'measured/planned':>16} "
              f"{'max|dlogit|':>11} {'top1':>6} {'same greedy':>11}")
        ref = None
        for label, (q, half) in SCHEMES.items():
            r = run(loaded, q, ids, args.gen, half)
            ref = ref or r
            report = factory(loaded, q, half).report()
            layers = f"{report.layers_quantized}/{report.layers_fp16}" if report else "-"
            top1 = int((r.logits.argmax(-1) == ref.logits.argmax(-1)).sum())
            same = next((i for i, (a, b) in enumerate(zip(r.greedy, ref.greedy, strict=True)) if a != b), len(r.greedy))
            print(f"{label:<20} {layers:>11} {r.measured / (len(ids) + 3):>11.0f} {r.measured / r.planned:>16.3f} "
                  f"{float(np.abs(r.logits - ref.logits).max()):>11.3f} {top1:>3}/64 {same:>7}/{len(r.greedy)}")


if __name__ == "__main__":
    main()
