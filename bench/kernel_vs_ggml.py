"""gmlx's one-row integer kernels against llama.cpp's own dot products, per format, one thread.

    .venv/bin/python bench/kernel_vs_ggml.py --llama-build <llama.cpp>/build [--formats Q4_K,Q6_K] [--runs 3]

Builds bench/kernel_vs_ggml.cpp with g++ against gmlx's kernel sources (the AVX2 kernels, as the extension
compiles them) and llama.cpp's static libraries (`libggml-cpu.a` and `libggml-base.a` of a build with
BUILD_SHARED_LIBS=OFF), then prints nanoseconds per 256 weights for each side and their ratio (above 1: gmlx
faster). Both sides quantize the activation row and take 128 weight rows of 2048 warm in L2: what the kernels
compute, not what memory feeds them (bench/kernel_speed.py and bench/engine.py time that). gmlx's K-quants are
repacked as the loader repacks them; llama.cpp's rows are its plain blocks (its own load-time repacking,
where its build has it, is not in ggml_vec_dot). x86-64 with AVX2 only.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "gmlx_server" / "engine" / "kernels" / "src"
FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


def build(llama_build: Path, out: Path) -> None:
    libs = [next(llama_build.rglob(name), None) for name in ("libggml-cpu.a", "libggml-base.a")]
    if None in libs:
        sys.exit(f"no libggml-cpu.a / libggml-base.a under {llama_build} (build llama.cpp with BUILD_SHARED_LIBS=OFF)")
    cmd = ["g++", "-std=c++20", "-O3", "-fno-math-errno", "-mavx2", "-mfma", "-mf16c", f"-I{SRC}",
           str(ROOT / "bench" / "kernel_vs_ggml.cpp"), str(SRC / "repack.cpp"), *map(str, libs),
           "-fopenmp", "-lpthread", "-ldl", "-lm", "-o", str(out)]
    subprocess.run(cmd, check=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-build", type=Path, required=True, help="llama.cpp's build directory")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--runs", type=int, default=3, help="runs of the harness; the best of each side is kept")
    args = ap.parse_args()
    if platform.machine() not in ("x86_64", "AMD64"):
        sys.exit("the harness times the AVX2 kernels: x86-64 only")
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "kernel_vs_ggml"
        build(args.llama_build, exe)
        best: dict[str, list[float]] = {}
        for _ in range(args.runs):
            out = subprocess.run([str(exe), args.formats], check=True, capture_output=True, text=True).stdout
            for line in out.splitlines():
                name, gmlx_ns, ggml_ns = line.split()
                prev = best.get(name, [float("inf"), float("inf")])
                best[name] = [min(prev[0], float(gmlx_ns)), min(prev[1], float(ggml_ns))]
    print("one row, one thread, 128 x 2048 weights warm in L2; ns per 256 weights (best of the runs)")
    for name, (ours, theirs) in best.items():
        print(f"{name:5s} gmlx {ours:7.1f}  llama.cpp {theirs:7.1f}  gmlx/llama.cpp speed {theirs / ours:5.2f}x")


if __name__ == "__main__":
    main()
