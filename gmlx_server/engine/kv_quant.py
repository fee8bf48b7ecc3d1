"""KV-cache quantization: the caches a model entry's kv_quant builds, per layer as the planner decides.

Which layers quantize is gmlx_plan.memory.quantized_layers (full-attention layers whose head sizes the
group divides; sliding-window layers keep mlx-vlm's RotatingKVCache), so the capacity table budgets
exactly what is built here.

uniform  mlx-vlm's QuantizedKVCache (keys and values at `bits`); BatchQuantizedKVCache when batched,
         read by mlx-vlm's quantized attention.
kvarn    KVarnCache: keys at `bits`, values at `value_bits`, the newest `tail_tokens` kept in the
         activation dtype; BatchKVarnCache when batched. Tokens quantize one by one (groups run along
         the head dimension), so the oldest tail token moves into the quantized store as each new one
         arrives. kvarn_attention reads both parts (attention.py routes these caches to it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_vlm.models.cache import BatchQuantizedKVCache, KVCache, QuantizedKVCache, create_causal_mask

from gmlx_plan.capacity import KVQuantReport
from gmlx_plan.memory import KV_STEP, KVQuant
from gmlx_server.engine.kv_half import as_half

Parts = tuple[mx.array, ...]  # mx.quantize's (packed, scales, biases)


class QStore:
    """Quantized tokens of shape (B, H, tokens, ...) per part, grown in KV_STEP steps as mlx-vlm's caches."""

    def __init__(self, bits: int, group_size: int, beside: int = 0) -> None:
        self.bits, self.group_size = bits, group_size
        self.beside = beside  # tokens held unquantized next to the store: growth keeps the sum on the steps
        self.parts: Parts | None = None
        self.used = 0

    def append(self, x: mx.array) -> None:
        q = mx.quantize(x, group_size=self.group_size, bits=self.bits)
        n = x.shape[2]
        if self.parts is None or self.used + n > self.parts[0].shape[2]:
            grow = -(-(self.used + n + self.beside) // KV_STEP) * KV_STEP - self.beside - self.used
            new = tuple(mx.zeros((*p.shape[:2], grow, p.shape[3]), p.dtype) for p in q)
            old = self.view()
            self.parts = new if old is None else tuple(mx.concatenate([o, z], axis=2)
                                                       for o, z in zip(old, new, strict=True))
        for part, src in zip(self.parts, q, strict=True):
            part[..., self.used: self.used + n, :] = src
        self.used += n

    def view(self, upto: int | None = None) -> Parts | None:
        n = self.used if upto is None else upto
        return None if self.parts is None or not n else tuple(p[..., :n, :] for p in self.parts)

    def set(self, parts: Parts | None, used: int) -> None:
        self.parts, self.used = parts, used if parts is not None else 0

    def join(self, other: QStore, width: int, rows: int, other_rows: int) -> None:
        """Rows of `other` appended below this store's, both right-justified to `width` tokens."""
        template = self.view() or other.view()
        if not width or template is None:
            self.set(None, 0)
            return
        mine, theirs = self.view(), other.view()
        self.set(tuple(mx.concatenate([_pad_left(mine[i] if mine else None, t, rows, width),
                                       _pad_left(theirs[i] if theirs else None, t, other_rows, width)])
                       for i, t in enumerate(template)), width)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts) if self.parts is not None else 0


def _append(old: mx.array | None, new: mx.array) -> mx.array:
    return new if old is None else mx.concatenate([old, new], axis=2)


class KVarnView(tuple[Any, Any]):
    """What a kvarn cache's update returns for keys or values: (quantized parts or None, unquantized tail or
    None). mlx-vlm's attention measures the keys by .shape[-2] (only the token count is meant) before
    slicing an array mask (Gemma 3)."""

    @property
    def shape(self) -> tuple[int, int, int, int]:
        q, f = self
        ref = q[0] if q is not None else f
        n = (q[0].shape[2] if q is not None else 0) + (f.shape[2] if f is not None else 0)
        return (ref.shape[0], ref.shape[1], n, ref.shape[3])


@dataclass
class _LastWrite:
    """A kvarn cache's latest update: how many tokens it wrote and the unquantized tokens it moved into the
    quantized store (views of the tail buffer, which is alive anyway)."""

    tokens: int
    moved: tuple[mx.array, mx.array] | None = None


class _KVarnBase:
    """Keys at `bits`, values at `value_bits`; the newest `tail` tokens stay unquantized in fk/fv."""

    offset: Any  # tokens seen: an int (one stream) or an array of per-row counts (the batch form)

    def __init__(self, bits: int, value_bits: int, group_size: int, tail: int) -> None:
        self.group_size, self.tail = group_size, tail
        self.ks, self.vs = QStore(bits, group_size, tail), QStore(value_bits, group_size, tail)
        self.fk: mx.array | None = None
        self.fv: mx.array | None = None
        self._last: _LastWrite | None = None  # what the latest update wrote, so trim can take it back

    @property
    def bits(self) -> int:
        return self.ks.bits

    @property
    def value_bits(self) -> int:
        return self.vs.bits

    @property
    def flen(self) -> int:
        return 0 if self.fk is None else self.fk.shape[2]

    @property
    def size_held(self) -> int:
        return self.ks.used + self.flen

    def _update(self, keys: mx.array, values: mx.array) -> tuple[Any, Any]:
        self._last = _LastWrite(keys.shape[2])
        self._settle(_append(self.fk, keys), _append(self.fv, values))
        return KVarnView((self.ks.view(), self.fk)), KVarnView((self.vs.view(), self.fv))

    def _settle(self, fk: mx.array, fv: mx.array) -> None:
        """fk/fv: the newest tokens unquantized; all but the last `tail` join the quantized store."""
        move = fk.shape[2] - self.tail
        if move > 0:
            self.ks.append(fk[..., :move, :])
            self.vs.append(fv[..., :move, :])
            if self._last is not None:  # views of fk's buffer, which the tail keeps alive anyway
                self._last.moved = (fk[..., :move, :], fv[..., :move, :])
            fk, fv = fk[..., move:, :], fv[..., move:, :]
        self.fk, self.fv = (fk, fv) if fk.shape[2] else (None, None)

    def can_trim(self, n: int) -> bool:
        """Only the latest update's tokens can be taken back exactly: the quantized store lost the exact
        values of anything older."""
        return n == 0 or (self._last is not None and n <= self._last.tokens)

    def trim(self, n: int) -> None:
        """Drop the newest n tokens (can_trim(n) must hold): the tokens the latest update moved into the
        quantized store come back unquantized, then the split is redone, so the cache is bit for bit one
        that never saw them (quantization is per token)."""
        last, self._last = self._last, None
        if not n:
            return
        assert last is not None and n <= last.tokens, "kvarn trims only the latest update's tokens"
        back = last.moved[0].shape[2] if last.moved is not None else 0
        for store in (self.ks, self.vs):
            store.used -= back
        held = [last.moved] if last.moved is not None else []
        if self.fk is not None and self.fv is not None:
            held.append((self.fk, self.fv))
        fk = mx.concatenate([k for k, _ in held], axis=2)
        fv = mx.concatenate([v for _, v in held], axis=2)
        keep = fk.shape[2] - n
        self._settle(fk[..., :keep, :], fv[..., :keep, :])
        self.offset = self.offset - n  # an int for one stream, per-row counts in the batch form

    def empty(self) -> bool:
        return self.ks.parts is None and self.fk is None

    @property
    def nbytes(self) -> int:
        fp = 0 if self.fk is None or self.fv is None else self.fk.nbytes + self.fv.nbytes
        return self.ks.nbytes + self.vs.nbytes + fp

    def arrays(self) -> list[mx.array]:
        return [*(self.ks.view() or ()), *(self.vs.view() or ()), *(a for a in (self.fk, self.fv) if a is not None)]


class KVarnCache(_KVarnBase):
    """One stream's kvarn cache (offset is an int, as mlx-vlm's single-row caches)."""

    def __init__(self, bits: int, value_bits: int, group_size: int, tail: int) -> None:
        super().__init__(bits, value_bits, group_size, tail)
        self.offset = 0

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Any, Any]:
        self.offset += keys.shape[2]
        return self._update(keys, values)

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None, **_: Any) -> Any:
        if N == 1:
            return None
        return create_causal_mask(N, self.offset, window_size=window_size) if return_array or window_size else "causal"

    def is_trimmable(self) -> bool:
        return True

    @property
    def state(self) -> list[mx.array]:
        return self.arrays()


class BatchKVarnCache(_KVarnBase):
    """Rows left-padded as mlx-vlm's BatchKVCache. Every row keeps its newest min(length, tail) tokens
    unquantized, so the fp columns are shared: a row with quantized tokens fills them all, and a shorter
    row's padding runs through the quantized columns into the fp ones, keeping each row contiguous."""

    def __init__(self, bits: int, value_bits: int, group_size: int, tail: int, left_padding: list[int]) -> None:
        super().__init__(bits, value_bits, group_size, tail)
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-p for p in left_padding])

    @classmethod
    def merge_one(cls, c: KVarnCache) -> BatchKVarnCache:
        out = cls(c.bits, c.value_bits, c.group_size, c.tail, [0])
        out.ks.set(c.ks.view(), c.ks.used)
        out.vs.set(c.vs.view(), c.vs.used)
        out.fk, out.fv, out.offset = c.fk, c.fv, mx.array([c.offset])
        return out

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Any, Any]:
        self.offset = self.offset + keys.shape[2]
        return self._update(keys, values)

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None, **_: Any) -> Any:
        return create_causal_mask(N, offset=self.size_held, left_padding=self.left_padding, window_size=window_size)

    def filter(self, batch_indices: mx.array) -> None:
        self._last = None  # the columns move: a later trim would not find the latest write where it was
        for store in (self.ks, self.vs):
            if store.parts is not None:
                store.parts = tuple(p[batch_indices] for p in store.parts)
        if self.fk is not None and self.fv is not None:
            self.fk, self.fv = self.fk[batch_indices], self.fv[batch_indices]
        self.offset, self.left_padding = self.offset[batch_indices], self.left_padding[batch_indices]
        self._drop_front(min(int(self.left_padding.min().item()), self.size_held))  # type: ignore[arg-type]

    def _drop_front(self, n: int) -> None:
        """Every row's first n columns are padding: cut them, from the quantized columns first."""
        if n <= 0:
            return
        q = min(n, self.ks.used)
        for store in (self.ks, self.vs):
            if store.parts is not None:
                store.set(tuple(p[..., q: store.used, :] for p in store.parts) if store.used > q else None,
                          store.used - q)
        f = n - q
        if f and self.fk is not None and self.fv is not None:
            self.fk, self.fv = (self.fk[..., f:, :], self.fv[..., f:, :]) if self.flen > f else (None, None)
        self.left_padding = self.left_padding - n

    def extend(self, other: BatchKVarnCache) -> None:
        """Append other's rows: each part right-justified to the wider of the two, padding on the left."""
        self._last = None
        q, f = max(self.ks.used, other.ks.used), max(self.flen, other.flen)
        self.left_padding = mx.concatenate([c.left_padding + (q - c.ks.used) + (f - c.flen) for c in (self, other)])
        rows, other_rows = _rows(self), _rows(other)
        self.ks.join(other.ks, q, rows, other_rows)
        self.vs.join(other.vs, q, rows, other_rows)
        self.fk = _join_fp(self.fk, other.fk, f, rows, other_rows)
        self.fv = _join_fp(self.fv, other.fv, f, rows, other_rows)
        self.offset = mx.concatenate([self.offset, other.offset])

    @property
    def state(self) -> list[mx.array]:
        return [*self.arrays(), self.offset, self.left_padding]


def _rows(c: BatchKVarnCache) -> int:
    return int(c.offset.shape[0])


def _pad_left(x: mx.array | None, ref: mx.array, rows: int, width: int) -> mx.array:
    """x (rows, H, n, d) padded on the left to `width` tokens; zeros shaped like ref when x is None."""
    if x is None:
        return mx.zeros((rows, ref.shape[1], width, ref.shape[3]), ref.dtype)
    n = x.shape[2]
    return x if n == width else mx.pad(x, [(0, 0), (0, 0), (width - n, 0), (0, 0)])


def _join_fp(a: mx.array | None, b: mx.array | None, width: int, rows: int, other_rows: int) -> mx.array | None:
    ref = a if a is not None else b
    if not width or ref is None:
        return None
    return mx.concatenate([_pad_left(a, ref, rows, width), _pad_left(b, ref, other_rows, width)])


def kvarn_attention(queries: mx.array, keys: Any, values: Any, cache: _KVarnBase, scale: float,
                    mask: Any) -> mx.array:
    """softmax(scale q k^T + mask) v over the quantized columns then the unquantized tail, GQA folded."""
    (qk, fk), (qv, fv) = keys, values
    B, H, L, D = queries.shape
    hk = (qk[0] if qk is not None else fk).shape[1]
    r = H // hk
    q = (queries * scale).reshape(B, hk, r, L, D)
    scores = []
    if qk is not None:
        w, sc, bi = (mx.expand_dims(p, 2) for p in qk)
        scores.append(mx.quantized_matmul(q, w, sc, bi, transpose=True, group_size=cache.group_size, bits=cache.bits))
    if fk is not None:
        scores.append(q @ mx.expand_dims(fk, 2).swapaxes(-1, -2))
    s = scores[0] if len(scores) == 1 else mx.concatenate(scores, axis=-1)
    s = _masked(s, mask, L)
    p = mx.softmax(s, axis=-1, precise=True)
    n_q = qk[0].shape[2] if qk is not None else 0
    out = None
    if qv is not None:
        w, sc, bi = (mx.expand_dims(x, 2) for x in qv)
        out = mx.quantized_matmul(p[..., :n_q], w, sc, bi, transpose=False, group_size=cache.group_size,
                                  bits=cache.value_bits)
    if fv is not None:
        tail = p[..., n_q:] @ mx.expand_dims(fv, 2)
        out = tail if out is None else out + tail
    assert out is not None
    return out.reshape(B, H, L, out.shape[-1])


def _masked(s: mx.array, mask: Any, L: int) -> mx.array:
    if mask is None:
        return s
    S = s.shape[-1]
    if isinstance(mask, str):
        mask = mx.arange(S - L, S)[:, None] >= mx.arange(S)[None]
    elif mask.ndim == 4:  # (B, 1, L, S) -> (B, 1, 1, L, S) against (B, Hk, r, L, S)
        mask = mask[:, :, None]
    if mask.dtype == mx.bool_:
        return mx.where(mask, s, mx.array(mx.finfo(s.dtype).min, s.dtype))
    return s + mask.astype(s.dtype)


def as_batch_quantized(c: Any) -> Any:
    """A single-row quantized cache -> the batch form that can extend and filter rows; None for other caches."""
    if isinstance(c, KVarnCache):
        return BatchKVarnCache.merge_one(c)
    if isinstance(c, QuantizedKVCache):
        out = BatchQuantizedKVCache([0], group_size=c.group_size, bits=c.bits)
        if c.keys is not None:
            out.keys = tuple(p[..., : c.offset, :] for p in c.keys)
            out.values = tuple(p[..., : c.offset, :] for p in c.values)
            out._idx, out.offset = c.offset, mx.array([c.offset])
        return out
    return None


def quantized_cache(q: KVQuant) -> Any:
    if q.scheme == "kvarn":
        return KVarnCache(q.key_bits, q.val_bits, q.group_size, q.tail)
    return QuantizedKVCache(group_size=q.group_size, bits=q.bits)


def is_kvarn(c: Any) -> bool:
    return isinstance(c, _KVarnBase)


def is_quantized(c: Any) -> bool:
    return isinstance(c, QuantizedKVCache | BatchQuantizedKVCache | _KVarnBase)


@dataclass(frozen=True)
class CacheFactory:
    """A request's fresh per-layer caches: the model's own, with the planner's layers quantized and, when `half`,
    the others float16 (kv_dtype)."""

    base: Callable[[], list[Any]]
    quant: KVQuant | None = None
    layers: tuple[bool, ...] = ()  # gmlx_plan.memory.quantized_layers: which layers the planner quantizes
    half: bool = False

    def __call__(self) -> list[Any]:
        caches = self.base()
        if self.quant is not None:
            # A layer quantizes only where the planner counted it and the model built a plain KVCache there.
            caches = [quantized_cache(self.quant) if i < len(self.layers) and self.layers[i] and type(c) is KVCache
                      else c for i, c in enumerate(caches)]
        return [as_half(c) for c in caches] if self.half else caches

    def report(self, batched_fp16: bool = False) -> KVQuantReport | None:
        """What was really built: the caches of one fresh request, counted by type."""
        q = self.quant
        if q is None:
            return None
        caches = self()
        done = sum(1 for c in caches if is_quantized(c))
        kvarn = q.scheme == "kvarn"
        return KVQuantReport(q.scheme, q.bits, q.group_size, q.val_bits if kvarn else None, q.tail if kvarn else None,
                             done, len(caches) - done, batched_fp16)
