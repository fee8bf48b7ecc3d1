"""mlx.nn modules whose weights stay GGUF blocks as stored ("native" layout), run by the kernels."""

from __future__ import annotations

from types import ModuleType

import mlx.core as mx
import mlx.nn as nn


class GGUFLinear(nn.Module):
    """y = x @ W^T (+ bias) with W (out, row_bytes) uint8 GGUF blocks of ggml type `qtype`."""

    def __init__(self, ext: ModuleType, qtype: int, in_dims: int, out_dims: int, bias: bool) -> None:
        super().__init__()
        self._ext, self.qtype, self.in_dims = ext, qtype, in_dims
        self.weight = mx.zeros((out_dims, ext.row_bytes(qtype, in_dims)), dtype=mx.uint8)  # replaced at load
        if bias:
            self.bias = mx.zeros((out_dims,))

    def __call__(self, x: mx.array) -> mx.array:
        y = self._ext.matmul(x, self.weight, self.qtype, self.in_dims)
        return y + self.bias if "bias" in self else y


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
