"""Build step for the optional CPU kernels (gmlx_server/engine/kernels); everything else is in pyproject.toml.

The extension is compiled with CMake against the MLX the build sees. Without a C++ compiler, CMake or
nanobind the install still succeeds: the engine then logs once that it runs without the kernels.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
NAME = "gmlx_server.engine.kernels._gguf_kernels"


def _kernels_build():  # loaded by path: nothing of gmlx is importable while pip builds it
    spec = importlib.util.spec_from_file_location("gmlx_kernels_build", HERE / "gmlx_server/engine/kernels/build.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class BuildKernels(build_ext):
    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # an optional extension: never fail the install
            print(f"gmlx: CPU kernels not built ({e}); the engine will use its fallback layouts")

    def build_extension(self, ext: Extension) -> None:
        target = Path(self.get_ext_fullpath(ext.name))
        built = _kernels_build().build(out_dir=target.parent)
        if built != target:
            built.replace(target)


setup(ext_modules=[Extension(NAME, sources=[])], cmdclass={"build_ext": BuildKernels})
