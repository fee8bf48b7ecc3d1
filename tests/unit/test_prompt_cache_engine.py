"""The prompt cache behind real prefills: random request sequences on a tiny random sliding-window model.

Each request goes through the engine's RequestRun (warm start, checkpoints at its boundaries and anchor,
the prompt-end snapshot) against one byte-bounded cache. After every request the cache holds at most
its bound, pins at most their share, every entry that left is counted as an eviction, and the first
greedy token equals a cold prefill's (or parts from it only at a near-tie below NEAR_TIE).
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gmlx_plan.gguf_header import read_header
from gmlx_server.engine.arch import arch_spec, make_cache, vocab_size
from gmlx_server.engine.cache_tiers import CacheTiers
from gmlx_server.engine.disk_cache import DiskCache
from gmlx_server.engine.gguf_tensors import load_gguf_tensors
from gmlx_server.engine.prompt_cache import PIN_SHARE, PromptCache
from gmlx_server.engine.request_run import Progress, RequestRun
from gmlx_server.engine.types import GenerationRequest, SamplingParams, TokenEvent
from gmlx_server.engine.weights import install_weights, transpose_dense_linears
from tests.gguf_factory import write_gguf
from tests.unit.test_arch_mapping import VOCAB, _metadata, _tensors

NEAR_TIE = 1e-3  # logit gap under which restored-KV rounding may pick the other token
STEMS = ([3, 5, 7, 9, 11, 13, 15, 17, 19, 21], [3, 5, 7, 9, 40, 41], [60, 61, 62])  # shared prefixes


class _Tokenizer:
    special_ids: frozenset[int] = frozenset()
    eos_ids: frozenset[int] = frozenset()
    strip_leading_space = False

    def token_bytes(self, token_id: int) -> bytes:
        return b"a"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [1] * len(text)


@functools.cache
def _model() -> Any:
    """Tiny gemma3: 6 layers, 5 of them sliding with an 8-token window, written once per session."""
    path = Path(tempfile.mkdtemp()) / "gemma3.gguf"
    write_gguf(path, _tensors("gemma3", np.random.default_rng(0)), arch="gemma3", metadata=_metadata("gemma3"))
    header = read_header(str(path))
    spec = arch_spec(header)
    model = spec.model_class()(spec.make_config(spec.build_config(header, vocab_size(header))))
    install_weights(model, spec, load_gguf_tensors(str(path), header.tensors, "dense")[0])
    transpose_dense_linears(model)
    return model


def _warm(prompt: list[int], store: CacheTiers, boundaries: tuple[int, ...] = (),
          anchor: int | None = None) -> tuple[int, int, str]:
    """The first greedy token, warm tokens and tier, prefilled in 5-token chunks through the cache."""
    events: list[TokenEvent] = []
    progress = Progress()
    req = GenerationRequest("r", prompt, 1, SamplingParams(temperature=0.0), cache_boundaries=boundaries,
                            cache_anchor=anchor)
    seq = RequestRun(_model(), _Tokenizer(), req, events.append, lambda: False, progress, chunk=5, prompt_cache=store)
    while not seq.prefill_step():
        pass
    token = events[-1].token_id
    assert token is not None and events[-1].error is None
    return token, progress.warm_tokens, progress.cache_tier


def _cold_logits(prompt: list[int]) -> mx.array:
    model = _model()
    return model(mx.array([prompt]), cache=make_cache(model)).logits[0, -1]


def test_every_tier_on_the_tiny_window_model_gives_the_cold_token() -> None:
    store, stem = CacheTiers(PromptCache(1 << 20, block=4)), STEMS[0]
    short = [90, 91, 92, 93, 94, 95]  # inside the 8-token window: its snapshot can be cut back
    steps = [([*stem, 50, 51], (4,), 2, "miss", 0), ([*stem, 50, 51], (), None, "exact", 11),
             ([*stem[:4], 70, 71, 72, 73, 74, 75], (), None, "ckpt", 4),
             ([*stem[:2], 80, 81, 82, 83, 84, 85, 86], (), None, "anchor", 2),
             (short, (), None, "miss", 0), ([*short[:4], 99, 98], (), None, "block", 4)]
    for prompt, boundaries, anchor, tier, warm in steps:
        token, got_warm, got_tier = _warm(prompt, store, boundaries, anchor)
        assert (got_tier, got_warm) == (tier, warm)
        assert token == int(mx.argmax(_cold_logits(prompt)).item())


request = st.tuples(st.sampled_from(range(len(STEMS))), st.lists(st.integers(2, VOCAB - 1), min_size=1, max_size=12),
                    st.lists(st.integers(1, 20), max_size=3), st.one_of(st.none(), st.integers(1, 12)),
                    st.booleans())


@settings(max_examples=40, deadline=None)
@given(st.lists(request, min_size=1, max_size=8), st.integers(4_000, 60_000), st.integers(0, 40_000))
def test_random_requests_stay_within_the_bound_and_match_cold(reqs: list[Any], bound: int, disk_cap: int) -> None:
    """Also through the disk tier, with a restart (a new RAM cache over the same directory) before some requests."""
    with tempfile.TemporaryDirectory() as root:
        disk = (lambda: DiskCache(root, disk_cap, "m", "i", "l")) if disk_cap else (lambda: None)
        tiers = _tiers(bound, disk())
        for stem, tail, boundaries, anchor, restart in reqs:
            if restart:
                tiers = _restart(tiers, bound, disk)
            _check_one(STEMS[stem] + tail, tiers, tuple(boundaries), anchor)
        store = tiers.ram
        stats = store.stats()
        assert stats["stores"] - stats["evictions"] == stats["entries"]
        _restart(tiers, bound, lambda: None)


def _tiers(bound: int, disk: DiskCache | None) -> CacheTiers:
    return CacheTiers(PromptCache(bound, block=4, spill=disk.put if disk else None), disk)


def _restart(tiers: CacheTiers, bound: int, disk: Callable[[], DiskCache | None]) -> CacheTiers:
    if tiers.disk is not None:
        tiers.disk.close()  # what an engine's close does: the queued writes land first
    return _tiers(bound, disk())


def _check_one(prompt: list[int], tiers: CacheTiers, boundaries: tuple[int, ...], anchor: int | None) -> None:
    """One request matches cold, and the RAM tier stays within its bound whatever the disk tier restored."""
    store = tiers.ram
    stored, evicted, held = store.stores, store.evictions, len(store)
    token, warm, _ = _warm(prompt, tiers, boundaries, anchor)
    logits = _cold_logits(prompt)
    gap = float((logits.max() - logits[token]).item())
    assert gap <= NEAR_TIE and 0 <= warm < len(prompt)
    entries = store._entries.values()
    assert store.bytes == sum(e.nbytes for e in entries) <= store.max_bytes
    assert sum(e.nbytes for e in entries if e.pinned) <= store.max_bytes * PIN_SHARE
    # Entries leave only by eviction (a request may evict its own earlier checkpoints).
    assert store.evictions - evicted == store.stores - stored - (len(store) - held)


def test_a_restarted_cache_restores_from_disk_and_gives_the_cold_token(tmp_path: Path) -> None:
    """The tiny window model's checkpoint, anchor and exact snapshots come back from disk after a restart."""
    stem = STEMS[0]
    tiers = _tiers(1 << 20, DiskCache(tmp_path, 1 << 24, "m", "i", "l"))
    _warm([*stem, 50, 51], tiers, (4,), 2)
    tiers = _restart(tiers, 1 << 20, lambda: DiskCache(tmp_path, 1 << 24, "m", "i", "l"))
    for prompt, warm in (([*stem, 50, 51], 11), ([*stem[:4], 70, 71], 4), ([*stem[:2], 80, 81, 82], 2)):
        tiers = _restart(tiers, 1 << 20, lambda: DiskCache(tmp_path, 1 << 24, "m", "i", "l"))
        token, got_warm, tier = _warm(prompt, tiers)
        assert (tier, got_warm) == ("disk", warm)
        assert token == int(mx.argmax(_cold_logits(prompt)).item())
    assert tiers.disk is not None and tiers.disk.stats()["hits"] == 1
