"""mlx.nn modules whose weights stay GGUF blocks as stored ("native" layout), run by the kernels."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import mlx.core as mx
import mlx.nn as nn

from gmlx_server.engine.mlx_adapter import child, set_child


class GGUFLinear(nn.Module):
    """y = x @ W^T (+ bias) with W (out, row_bytes) uint8 GGUF blocks of ggml type `qtype`."""

    def __init__(self, ext: ModuleType, qtype: int, in_dims: int, out_dims: int, bias: bool) -> None:
        super().__init__()
        self._ext, self.qtype, self.in_dims = ext, qtype, in_dims
        self.weight = mx.zeros((out_dims, ext.row_bytes(qtype, in_dims)), dtype=mx.uint8)  # replaced at load
        if bias:
            self.bias = mx.zeros((out_dims,))

    def __call__(self, x: mx.array) -> mx.array:
        return _biased_matmul(self, x)

    def gated(self, x: mx.array, kind: int, up: mx.array | None = None) -> mx.array:
        """(act(x) * up) @ W^T for float32 rows, or without `up` act(x's first half) * its second half (a fused
        gate/up output): the MLP's gate computed by this projection's matmul, not an op of its own."""
        out: mx.array = self._ext.matmul(x, self["weight"], self.qtype, self.in_dims, gate=kind, up=up)
        return out

    def add_norm(self, x: mx.array, residual: mx.array, weight: mx.array, eps: float, r_weight: mx.array | None = None,
                 r_eps: float = 0.0, gate: int = -1, up: mx.array | None = None) -> tuple[mx.array, mx.array]:
        """(residual + y, rms_norm(residual + y) * weight) for this projection's y of float32 rows (gated first when
        gate >= 0, as gated), y first normed by r_weight when given: GKAddNorm's work in the matmul's op."""
        h, normed = self._ext.matmul_add_norm(x, self["weight"], self.qtype, self.in_dims, residual, weight, eps,
                                              r_weight=r_weight, r_eps=r_eps, bias=self.get("bias"), gate=gate, up=up)
        return h, normed


@dataclass(frozen=True)
class Projected:
    """A sublayer's output before its last projection: that projection's float32 input rows (gated first when
    gate >= 0), so that the residual add and the norm after the sublayer ride its matmul (add_norm) instead of
    running as an op of their own. Calling it runs the projection alone."""

    linear: GGUFLinear
    rows: mx.array
    gate: int = -1
    up: mx.array | None = None

    def __call__(self) -> mx.array:
        return self.linear(self.rows) if self.gate < 0 else self.linear.gated(self.rows, self.gate, self.up)

    def add_norm(self, residual: mx.array, weight: mx.array, eps: float, r_weight: mx.array | None = None,
                 r_eps: float = 0.0) -> tuple[mx.array, mx.array]:
        return self.linear.add_norm(self.rows, residual, weight, eps, r_weight, r_eps, self.gate, self.up)


def float_bias(m: GGUFLinear | FusedGGUFLinear) -> bool:
    """The projection's bias, if any, is float32: an op computing its product in place of its matmul (an add_norm
    epilogue, GKHeads) adds it as the matmul does."""
    return "bias" not in m or m["bias"].dtype == mx.float32


def _biased_matmul(m: GGUFLinear | FusedGGUFLinear, x: mx.array) -> mx.array:
    """x @ W^T (+ bias): the matmul adds a float32 bias to float32 rows itself (an add and a broadcast fewer)."""
    if "bias" not in m:
        out: mx.array = m._ext.matmul(x, m["weight"], m.qtype, m.in_dims)
        return out
    bias = m["bias"]
    if x.dtype == mx.float32 and bias.dtype == mx.float32:
        out = m._ext.matmul(x, m["weight"], m.qtype, m.in_dims, bias=bias)
        return out
    out = m._ext.matmul(x, m["weight"], m.qtype, m.in_dims) + bias
    return out


class GGUFEmbedding(nn.Module):
    """Token rows gathered as blocks and dequantized; a tied head reads the same blocks as a linear."""

    def __init__(self, ext: ModuleType, qtype: int, vocab: int, dims: int) -> None:
        super().__init__()
        self._ext, self.qtype, self.dims = ext, qtype, dims
        self.weight = mx.zeros((vocab, ext.row_bytes(qtype, dims)), dtype=mx.uint8)

    def __call__(self, ids: mx.array) -> mx.array:
        return self._ext.dequantize(mx.take(self.weight, ids, axis=0), self.qtype, self.dims)

    def as_linear(self, x: mx.array) -> mx.array:
        return self._ext.matmul(x, self.weight, self.qtype, self.dims)


class _Memo:
    """Untracked state of a fused projection (an nn.Module would take lists and tuples for parameters)."""

    def __init__(self, bounds: list[tuple[int, int]]) -> None:
        self.bounds = bounds
        self.x: mx.array | None = None
        self.y: mx.array | None = None


class FusedGGUFLinear(nn.Module):
    """Several projections of one input (q/k/v, gate/up) as one matmul over their row-concatenated blocks.

    The model calls each projection with the same input array in turn; the first call computes all outputs
    and the others take their columns, so a layer dispatches one matmul where it dispatched three."""

    def __init__(self, parts: list[GGUFLinear]) -> None:
        super().__init__()
        first = parts[0]
        self._ext, self.qtype, self.in_dims = first._ext, first.qtype, first.in_dims
        self.weight = mx.concatenate([p.weight for p in parts], axis=0)
        if all("bias" in p for p in parts):
            self.bias = mx.concatenate([p.bias for p in parts], axis=0)
        ends = [int(p.weight.shape[0]) for p in parts]
        self._memo = _Memo([(sum(ends[:i]), sum(ends[: i + 1])) for i in range(len(parts))])

    def bounds(self, index: int) -> tuple[int, int]:
        return self._memo.bounds[index]

    @property
    def parts(self) -> int:
        return len(self._memo.bounds)

    def output(self, x: mx.array) -> mx.array:
        memo = self._memo
        if memo.x is not x or memo.y is None:
            memo.x, memo.y = x, _biased_matmul(self, x)
        return memo.y

    def forget(self) -> None:
        self._memo.x = self._memo.y = None


class FusedPart(nn.Module):
    """Projection `index` of a FusedGGUFLinear; the first part owns it (so its weights are counted once)."""

    def __init__(self, fused: FusedGGUFLinear, index: int) -> None:
        super().__init__()
        if index == 0:
            self.fused = fused
        self._fused = lambda: fused  # not a child module: the others only refer to it
        self._start, self._end = fused.bounds(index)
        self._last = index == fused.parts - 1

    def __call__(self, x: mx.array) -> mx.array:
        y, start = self.source(x)
        return y[..., start: self._end]

    @property
    def width(self) -> int:
        """This part's output columns."""
        return self._end - self._start

    @property
    def start(self) -> int:
        """The column this part starts at in the fused projection's output."""
        return self._start

    def projection(self) -> FusedGGUFLinear:
        """The fused projection this is a part of."""
        return self._fused()

    def halves_with(self, other: FusedPart) -> bool:
        """This part and `other` are the two equal halves of one fused projection, in that order (gate, up)."""
        fused = self._fused()
        return (fused is other._fused() and fused.parts == 2 and self._start == 0 and other._last
                and self._end == other._start and other._end - other._start == self._end)

    def source(self, x: mx.array) -> tuple[mx.array, int]:
        """The fused output and the column this part starts at, for a consumer that reads its columns in place."""
        fused = self._fused()
        y = fused.output(x)
        if self._last:
            fused.forget()  # the layer has taken every part: do not hold its activations
        return y, self._start


GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def fuse_projections(model: nn.Module) -> int:
    """Fuse each layer's q/k/v and gate/up GGUFLinears that share a block type, input width and bias; returns
    how many groups were fused (mixed types, e.g. Q4_K q/k beside a Q6_K v, fuse the matching ones)."""
    fused = 0
    # parents only: a list of every module would keep the replaced parts' blocks alive to the end (load peak)
    parents = [m for _, m in model.named_modules() if any(isinstance(m.get(n), GGUFLinear) for g in GROUPS for n in g)]
    for m in parents:
        for names in GROUPS:
            mods = [(n, p) for n in names if isinstance(p := child(m, n), GGUFLinear)]
            for key in {(p.qtype, p.in_dims, "bias" in p) for _, p in mods}:
                same = [(n, p) for n, p in mods if (p.qtype, p.in_dims, "bias" in p) == key]
                if len(same) < 2:
                    continue
                group = FusedGGUFLinear([p for _, p in same])
                mx.eval(group.parameters())  # now, while only this group's parts are live twice
                for i, (n, _) in enumerate(same):
                    set_child(m, n, FusedPart(group, i))
                fused += 1
    return fused
