"""RMSNorm, RoPE and the MLPs' gated activations as gmlx modules that call the kernels' CPU primitives.

On MLX's CPU backend mx.fast.rms_norm and mx.fast.rope expand into 10-20 graph ops per call (a decode step of a
30-layer model holds ~120 of them), and every op costs ~20 us of dispatch; the activations run on one thread with
a scalar exp (~15 ns an element, a sixth of a 512-token SmolLM2 prefill). The loader swaps one model's norm, RoPE
and MLP instances for the modules below (use_kernel_modules): each call its primitives cover (float32, the CPU
default device, a plain offset) goes to the extension, any other to MLX's own op. Nothing in mlx or mlx-vlm is
reassigned, so a model loaded with the kernels off (or on Metal) in the same process keeps MLX's path.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from gmlx_server.engine import vlm_adapter
from gmlx_server.engine.kernels.modules import FusedPart, GGUFLinear, Projected
from gmlx_server.engine.mlx_adapter import replace_module

SILU, GELU_TANH = 0, 1  # the extension's gated activations: swiglu's silu(gate) * up, gelu_approx(gate) * up


@dataclass(eq=False)
class Primitives:
    """One model's route to the extension, shared by its modules; ext None runs MLX's own ops (the kernels off,
    or a bench's A/B switch)."""

    ext: ModuleType | None

    def covering(self, x: mx.array) -> ModuleType | None:
        """The extension when it takes `x`: float32 on the CPU default device."""
        on_cpu = x.dtype == mx.float32 and mx.default_device() == mx.cpu
        return self.ext if on_cpu else None

    def rms_norm(self, x: mx.array, weight: mx.array | None, eps: float) -> mx.array:
        ext = self.covering(x)
        if ext is not None and x.ndim >= 1 and (weight is None or weight.shape == (x.shape[-1],)):
            out: mx.array = ext.rms_norm(x, weight, eps)
            return out
        return mx.fast.rms_norm(x, weight, eps)

    def argmax(self, x: mx.array) -> mx.array:
        """mx.argmax(x, axis=-1), the same indices (the first of each row's maximum, or of its first NaN)."""
        ext = self.covering(x)
        if ext is not None and x.ndim >= 1 and x.shape[-1] > 0:
            out: mx.array = ext.argmax(x)
            return out
        return mx.argmax(x, axis=-1)

    def rope(self, x: mx.array, a: RopeArgs, offset: Any) -> mx.array:
        ext = self.covering(x)
        if ext is not None and _rope_covered(x, a, offset):
            if isinstance(offset, mx.array) and offset.ndim > 1:
                offset = offset.reshape(-1)
            out: mx.array = ext.rope(x, a.dims, traditional=a.traditional, base=a.base, scale=a.scale,
                                     offset=offset, freqs=a.freqs)
            return out
        return mx.fast.rope(x, a.dims, traditional=a.traditional, base=a.base, scale=a.scale, offset=offset,
                            freqs=a.freqs)

    def covering_gate(self, gate: mx.array, up: mx.array) -> ModuleType | None:
        """The extension when it gates `gate` with `up`: both float32 on the CPU, of one shape."""
        ext = self.covering(gate)
        return ext if ext is not None and up.dtype == mx.float32 and up.shape == gate.shape else None

    def gated(self, gate: mx.array, up: mx.array, kind: int) -> mx.array:
        ext = self.covering_gate(gate, up)
        if ext is not None:
            out: mx.array = ext.gated(gate, up, kind)
            return out
        if kind == SILU:
            mlx_vlm_own: mx.array = vlm_adapter.swiglu()(gate, up)
            return mlx_vlm_own
        return nn.gelu_approx(gate) * up


    def gated_halves(self, y: mx.array, kind: int) -> mx.array:
        """act(gate) * up where each row of `y` holds its gate and then its up (a fused gate/up projection)."""
        ext = self.covering(y)
        if ext is not None:
            out: mx.array = ext.gated(y, None, kind, halves=True)
            return out
        half = y.shape[-1] // 2
        return self.gated(y[..., :half], y[..., half:], kind)


@dataclass(frozen=True)
class RopeArgs:
    """mx.fast.rope's arguments as a RoPE module passes them; mscale pre-scales the rotated part (YaRN)."""

    dims: int
    traditional: bool
    base: float | None
    scale: float
    freqs: mx.array | None = None
    mscale: float = 1.0


def _rope_covered(x: mx.array, a: RopeArgs, offset: Any) -> bool:
    if x.ndim < 3 or a.dims % 2 or not 0 < a.dims <= x.shape[-1] or (a.base is None) == (a.freqs is None):
        return False
    if a.freqs is not None and a.freqs.shape != (a.dims // 2,):
        return False
    return isinstance(offset, int) or (isinstance(offset, mx.array) and (
        offset.size == 1 or offset.shape == (x.shape[0],)))


MLX_OPS = Primitives(None)


class _Ahead:
    """A norm's output computed by the op before it (a fused residual add), for the one input it was computed
    of; untracked state (an nn.Module would take a tuple for parameters)."""

    def __init__(self) -> None:
        self.x: mx.array | None = None
        self.y: mx.array | None = None

    def take(self, x: mx.array) -> mx.array | None:
        """The output if it was computed of `x` (this very array); any call clears it, so none is held longer."""
        y = self.y if self.x is x else None
        self.x = self.y = None
        return y


class RMSNorm(nn.Module):
    """rms_norm(x) * weight (a Gemma norm's `1 + w` already folded into weight)."""

    def __init__(self, weight: mx.array, eps: float, prims: Primitives = MLX_OPS) -> None:
        super().__init__()
        self.weight, self.eps, self._prims = weight, eps, prims
        self._ahead = _Ahead()

    def expect(self, x: mx.array, y: mx.array) -> None:
        """The next call, if it is of `x`, returns `y` (this norm of x, already computed by a fused op)."""
        self._ahead.x, self._ahead.y = x, y

    def __call__(self, x: mx.array) -> mx.array:
        ahead = self._ahead.take(x)
        return ahead if ahead is not None else self._prims.rms_norm(x, self["weight"], self.eps)


class RoPE(nn.Module):
    def __init__(self, args: RopeArgs, prims: Primitives = MLX_OPS) -> None:
        super().__init__()
        self._args, self._prims = args, prims

    @property
    def args(self) -> RopeArgs:
        return self._args

    def plain(self) -> bool:
        """mx.fast.rope's own arguments with no pre-scale (YaRN's): what the fused heads primitive rotates by."""
        a = self._args
        freqs_ok = a.freqs is None or a.freqs.shape == (a.dims // 2,)
        return a.mscale == 1.0 and a.dims > 0 and a.dims % 2 == 0 and (a.base is None) != (a.freqs is None) and freqs_ok

    def __call__(self, x: mx.array, offset: Any = 0) -> mx.array:
        a = self._args
        if a.mscale != 1.0:  # as mlx-vlm's YarnRoPE: scale a copy's rotated part
            x = x[...]
            x[..., : a.dims] = a.mscale * x[..., : a.dims]
        return self._prims.rope(x, a, offset)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with the activation and the product one primitive, or none of its own where the
    down projection is GGUF blocks without a bias (its matmul gates its rows). The gate is called first, as
    mlx-vlm's MLPs do (a fused gate/up projection computes both on that call)."""

    def __init__(self, mlp: nn.Module, kind: int, prims: Primitives) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = mlp["gate_proj"], mlp["up_proj"], mlp["down_proj"]
        self._kind, self._prims = kind, prims
        down = self.down_proj  # a flag, not the module: a module attribute would be a second child (named_modules)
        self._down_gates = isinstance(down, GGUFLinear) and "bias" not in down

    def __call__(self, x: mx.array) -> mx.array:
        out = self.projected(x)
        return out() if isinstance(out, Projected) else out

    def projected(self, x: mx.array) -> Projected | mx.array:
        """The output, or where the down projection gates, its rows still to be projected (Projected)."""
        gate, up = self["gate_proj"], self["up_proj"]
        down = self["down_proj"] if self._down_gates else None
        if isinstance(gate, FusedPart) and isinstance(up, FusedPart) and gate.halves_with(up):
            y, _ = up.source(x)  # one fused output, gate then up in each row: no slices
            if down is not None and self._prims.covering(y) is not None:
                return Projected(down, y, self._kind)
            return self["down_proj"](self._prims.gated_halves(y, self._kind))
        g = gate(x)
        u = up(x)
        if down is not None and self._prims.covering_gate(g, u) is not None:
            return Projected(down, g, self._kind, u)
        return self["down_proj"](self._prims.gated(g, u, self._kind))


def _kernel_module(m: nn.Module, prims: Primitives) -> nn.Module | None:
    """`m` rebuilt to call `prims`, or None for a module that calls none of them itself."""
    if isinstance(m, RMSNorm | nn.RMSNorm):
        return RMSNorm(m.weight, m.eps, prims)
    offset = vlm_adapter.norm_offset(m)
    if offset is not None:  # folded once here, as the GGUF loader folds Gemma's norms
        return RMSNorm(offset + m["weight"], m.eps, prims)
    if isinstance(m, RoPE):
        return RoPE(m._args, prims)
    rope = vlm_adapter.rope_args(m)
    if rope is not None:
        return RoPE(RopeArgs(**rope), prims)
    kind = vlm_adapter.gated_mlp_kind(m)
    return GatedMLP(m, kind, prims) if kind is not None else None


def use_kernel_modules(model: nn.Module, prims: Primitives) -> int:
    """Swap `model`'s norms, RoPEs and gated MLPs for modules calling `prims`; returns how many."""
    swaps = [(path, new) for path, m in model.named_modules() if path and (new := _kernel_module(m, prims)) is not None]
    for path, new in swaps:
        replace_module(model, path, new)
    return len(swaps)
