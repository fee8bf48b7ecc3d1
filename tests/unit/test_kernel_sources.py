"""The kernels' instruction-set story is told once (issue 31 item 6): no target_clones or target attributes
(cpuid dispatch is the one mechanism), and only simd.h includes intrinsics headers or reads the compiler's
ISA macros; the platform calls are guarded for arm64/macOS builds."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "gmlx_server" / "engine" / "kernels" / "src"
ISA_MACRO = re.compile(r"__(AVX\w*|FMA|F16C|SSE\w*|ARM_\w+|aarch64|x86_64)__|_M_X64|_M_ARM64")
INTRINSICS = re.compile(r"#include <(immintrin|x86intrin|arm_neon)\.h>")


def sources() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(SRC.glob("*.[ch]*"))}


def test_one_way_of_choosing_the_isa() -> None:
    assert [n for n, t in sources().items() if "target_clones" in t or "__attribute__((target(" in t] == []


def test_only_simd_h_reads_isa_macros_or_includes_intrinsics() -> None:
    strays = {n: sorted({m.group(0) for m in ISA_MACRO.finditer(t)} | set(INTRINSICS.findall(t)))
              for n, t in sources().items() if n != "simd.h"}
    assert {n: s for n, s in strays.items() if s} == {}


def test_platform_calls_are_guarded() -> None:
    text = (SRC / "dispatch.cpp").read_text()
    for call, guard in (("sched_getaffinity", "#if defined(__linux__)"), ("dlsym(", "#if defined(GK_DLSYM)"),
                        ("__get_cpuid", "#if defined(GK_X86_KERNELS)"), ("xgetbv", "#if defined(GK_X86_KERNELS)")):
        at = text.index(call)
        assert text.rfind(guard, 0, at) > text.rfind("#endif", 0, at), f"{call} outside {guard}"


def test_the_planners_short_chunk_bound_is_the_kernels_sgemm_threshold() -> None:
    """gmlx_plan prices a chunk under FEW_ROWS tokens apart because the kernels run fewer rows than kSgemmRows
    on their per-row path; the planner reads no gmlx_server code, so this test keeps the two numbers one."""
    from gmlx_plan.pace import FEW_ROWS

    found = re.search(r"constexpr int64_t kSgemmRows = (\d+);", (SRC / "dispatch.cpp").read_text())
    assert found is not None and int(found.group(1)) == FEW_ROWS
