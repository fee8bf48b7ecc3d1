"""The disk tier on real MLX caches and real files: a round trip restores the same KV (quantized ones packed),
bad files are removed and missed, the cap evicts oldest first, and a full queue drops rather than waits."""

from __future__ import annotations

import stat
from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_vlm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache

from gmlx_server.engine.disk_cache import DiskCache, model_identity
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


def _disk(tmp_path: Path, cap: int = 1 << 24, identity: str = "m1") -> DiskCache:
    return DiskCache(tmp_path / "pc", cap, identity, "q8g32")


def test_a_round_trip_restores_the_same_kv_packed(tmp_path: Path) -> None:
    disk, entry = _disk(tmp_path), _entry()
    assert disk.put(entry)
    disk.flush()
    back = disk.load(entry.tokens)
    assert back is not None and back.nbytes == entry.nbytes and back.trimmable == entry.trimmable
    assert back.layers[2][0] == "q" and back.layers[2][1][0].dtype == mx.uint32  # still packed
    for a, b in zip(restore(entry, 6, _make), restore(back, 6, _make), strict=True):
        pairs = zip(tree_flatten(a.state), tree_flatten(b.state), strict=True)  # type: ignore[attr-defined]
        assert all(mx.array_equal(x, y) for (_, x), (_, y) in pairs)
    assert stat.S_IMODE((tmp_path / "pc").stat().st_mode) == 0o700
    assert disk.stats()["hits"] == 1 and disk.stats()["entries"] == 1


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
        other = DiskCache(tmp_path / "other", 1 << 24, "m2", "q8g32")
        other.put(entry)
        other.flush()
        path.write_bytes(other.path_for(entry.tokens).read_bytes())
    assert disk.load(entry.tokens) is None and not path.exists() and disk.removed_bad == 1


def test_a_changed_model_file_changes_the_identity(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\x01" * 100)
    first = model_identity(model)
    model.write_bytes(b"GGUF" + b"\x02" * 100)
    assert model_identity(model) != first
    disk = _disk(tmp_path, identity=first)
    disk.put(_entry())
    disk.flush()
    assert _disk(tmp_path, identity=model_identity(model)).load(tuple(range(6))) is None


def test_a_tiny_cap_keeps_the_newest_within_it(tmp_path: Path) -> None:
    one = _entry(seed=0)
    disk = _disk(tmp_path, cap=one.nbytes * 2 + 4096)
    for seed in range(4):
        disk.put(_entry(seed=seed))
        disk.flush()
    assert disk.stats()["bytes"] <= disk.max_bytes and disk.load(tuple(range(3, 9))) is not None
    assert disk.load(tuple(range(0, 6))) is None  # the oldest went first


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
    assert a.load(entry.tokens) is not None and b.load(entry.tokens) is not None
    assert not list((tmp_path / "pc").glob(".*tmp*"))


def test_checkpoints_spill_to_disk_and_the_longest_comes_back(tmp_path: Path) -> None:
    disk = _disk(tmp_path)
    pc = PromptCache(1 << 24, spill=disk.put)
    short, long = _entry(n=4), _entry(n=6)
    short.kind, long.kind = "ckpt", "ckpt"
    plain = _entry(n=5, seed=1)  # a "prompt" entry stays in RAM only
    for e in (short, long, plain):
        assert pc.store(e)
    disk.flush()
    assert disk.stats()["entries"] == 2
    prompt = [*range(6), 99, 100]
    back = disk.load_longest(prompt, [4, 6, 7])
    assert back is not None and back.tokens == tuple(range(6)) and back.kind == "ckpt"
    assert disk.load_longest(prompt, [5]) is None
