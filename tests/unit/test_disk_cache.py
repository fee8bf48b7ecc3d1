"""The disk tier on real MLX caches and real files: a round trip restores the same KV (quantized ones packed),
bad files are removed and missed, the cap evicts oldest first, and a full queue drops rather than waits."""

from __future__ import annotations

import stat
from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_vlm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache

from gmlx_plan.pace import PrefillPace
from gmlx_server.engine.cache_tiers import CacheTiers
from gmlx_server.engine.disk_cache import DiskCache
from gmlx_server.engine.disk_files import clear, model_identity, usage
from gmlx_server.engine.kv_snapshot import restore, take
from gmlx_server.engine.prompt_cache import Entry, PromptCache


def _make() -> list[object]:
    return [KVCache(), RotatingKVCache(max_size=8), QuantizedKVCache(group_size=32, bits=8)]


def _entry(n: int = 6, seed: int = 0) -> Entry:
    cache = _make()
    for c in cache:
        kv = mx.random.normal((1, 1, n, 64), key=mx.random.key(seed))
        c.update_and_fetch(kv, kv + 1)  # type: ignore[attr-defined]
    entry = take(cache, list(range(seed, seed + n)))
    assert entry is not None
    return entry


def _disk(tmp_path: Path, cap: int = 1 << 24, identity: str = "m1", model: str = "m") -> DiskCache:
    return DiskCache(tmp_path / "pc", cap, model, identity, "q8g32")


def _load(disk: DiskCache, tokens: tuple[int, ...]) -> Entry | None:
    """The stored entry for exactly `tokens` (a prompt one token longer restores all of them)."""
    hit = disk.best([*tokens, -1])
    return disk.load(hit) if hit is not None and hit.tokens == len(tokens) else None


def test_a_round_trip_restores_the_same_kv_packed(tmp_path: Path) -> None:
    disk, entry = _disk(tmp_path), _entry()
    assert disk.put(entry)
    disk.flush()
    back = _load(disk, entry.tokens)
    assert back is not None and back.nbytes == entry.nbytes and back.trimmable == entry.trimmable
    assert back.layers[2][0] == "q" and back.layers[2][1][0].dtype == mx.uint32  # still packed
    for a, b in zip(restore(entry, 6, _make), restore(back, 6, _make), strict=True):
        pairs = zip(tree_flatten(a.state), tree_flatten(b.state), strict=True)  # type: ignore[attr-defined]
        assert all(mx.array_equal(x, y) for (_, x), (_, y) in pairs)
    assert stat.S_IMODE((tmp_path / "pc").stat().st_mode) == 0o700
    assert disk.stats()["entries"] == 1 and usage(tmp_path / "pc")["entries"] == 1


@pytest.mark.parametrize("damage", ["truncate", "garbage", "foreign"])
def test_a_bad_file_is_a_miss_and_removed(tmp_path: Path, damage: str) -> None:
    disk, entry = _disk(tmp_path), _entry()
    disk.put(entry)
    disk.flush()
    path = disk.path_for(entry.tokens)
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x00not a safetensors file" * 10)
    else:  # another model's file under this name
        other = DiskCache(tmp_path / "other", 1 << 24, "m", "m2", "q8g32")
        other.put(entry)
        other.flush()
        path.write_bytes(other.path_for(entry.tokens).read_bytes())
    assert _load(disk, entry.tokens) is None and not path.exists() and disk.removed_bad == 1


def test_a_changed_model_file_changes_the_identity(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\x01" * 100)
    first = model_identity(model)
    model.write_bytes(b"GGUF" + b"\x02" * 100)
    assert model_identity(model) != first
    disk = _disk(tmp_path, identity=first)
    disk.put(_entry())
    disk.flush()
    stale = disk.path_for(tuple(range(6)))
    assert _load(_disk(tmp_path, identity=model_identity(model)), tuple(range(6))) is None
    assert not stale.exists()  # the changed model's old entry is removed, not merely skipped


def test_a_tiny_cap_keeps_the_newest_within_it(tmp_path: Path) -> None:
    one = _entry(seed=0)
    disk = _disk(tmp_path, cap=one.nbytes * 2 + 4096)
    for seed in range(4):
        disk.put(_entry(seed=seed))
        disk.flush()
    assert usage(disk.root)["bytes"] <= disk.max_bytes and _load(disk, tuple(range(3, 9))) is not None
    assert _load(disk, tuple(range(0, 6))) is None  # the oldest went first


def test_a_full_queue_drops_and_counts(tmp_path: Path) -> None:
    disk, entry = _disk(tmp_path), _entry()
    disk.close()  # no writer: the queue only fills
    accepted = sum(disk.put(entry) for _ in range(20))
    assert accepted < 20 and disk.dropped == 20 - accepted


def test_two_caches_share_one_dir(tmp_path: Path) -> None:
    a, b, entry = _disk(tmp_path), _disk(tmp_path), _entry()
    a.put(entry)
    b.put(entry)
    a.flush()
    b.flush()
    assert _load(a, entry.tokens) is not None and _load(b, entry.tokens) is not None
    assert not list((tmp_path / "pc").glob(".*tmp*"))


def test_stored_entries_spill_and_the_longest_prefix_comes_back(tmp_path: Path) -> None:
    disk = _disk(tmp_path)
    tiers = CacheTiers(PromptCache(1 << 24, spill=disk.put), disk)
    short, long = _entry(n=4), _entry(n=6)
    short.kind, short.trimmable, long.kind, long.trimmable = "ckpt", False, "ckpt", False
    for e in (short, long, _entry(n=5, seed=1)):
        assert tiers.store(e)
    disk.flush()
    assert disk.stats()["entries"] == 3
    prompt = [*range(6), 99, 100]
    fresh = CacheTiers(PromptCache(1 << 24), _disk(tmp_path))  # a restarted server: RAM empty, disk kept
    hit = fresh.lookup(prompt)
    assert hit is not None and hit.tier == "disk" and hit.tokens == 6 and hit.entry.tokens == tuple(range(6))
    again = fresh.lookup(prompt)  # the restored entry went into RAM: the next turn finds it there
    assert again is not None and again.tier == "ckpt" and fresh.ram.stats()["hits"]["disk"] == 1
    assert fresh.peek([*range(5), 7, 8]) == ("disk", 4)  # whole entries only: the 6-token one does not fit


def test_a_longer_trimmable_entry_replaces_the_prefixes_it_covers(tmp_path: Path) -> None:
    disk = _disk(tmp_path)
    first, second = _entry(n=4), _entry(n=6)  # range(4) is a prefix of range(6); both trimmable
    disk.put(first)
    disk.flush()
    disk.put(second)
    disk.flush()
    assert not disk.path_for(first.tokens).exists() and disk.path_for(second.tokens).exists()
    hit = disk.best([0, 1, 2, 3, 50])
    assert hit is not None and hit.tokens == 4 and hit.stored.tokens == second.tokens


def test_reset_of_one_model_keeps_the_others(tmp_path: Path) -> None:
    mine, theirs = _disk(tmp_path, model="a"), _disk(tmp_path, model="b", identity="m2")
    mine.put(_entry())
    theirs.put(_entry(seed=3))
    mine.flush()
    theirs.flush()
    assert clear(tmp_path / "pc", "a") == 1 and usage(tmp_path / "pc")["entries"] == 1
    assert mine.best([*range(6), 9]) is None and theirs.best([*range(3, 9), 9]) is not None


def test_a_restore_slower_than_prefill_is_skipped(tmp_path: Path) -> None:
    disk = _disk(tmp_path)
    entry = _entry()
    disk.put(entry)
    disk.flush()
    hit = disk.best([*range(6), 9])
    assert hit is not None and disk.load(hit) is not None  # one read: the disk's pace is measured
    fast_prefill = CacheTiers(PromptCache(1 << 24), disk, lambda: PrefillPace(1e-12))
    assert fast_prefill.lookup([*range(6), 9]) is None and disk.skipped == 1
    slow_prefill = CacheTiers(PromptCache(1 << 24), disk, lambda: PrefillPace(10.0))
    back = slow_prefill.lookup([*range(6), 9])
    assert back is not None and back.tier == "disk"
