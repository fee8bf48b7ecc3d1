"""GET /v1/cache/stats and POST /v1/cache/reset on fake engines."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from gmlx_server.engine.types import PromptCacheStats
from tests.routes.conftest import Served, make_config, serve


def _give_cache(engine: Any, resets: list[str]) -> None:
    stats = PromptCacheStats(enabled=True, bytes=10, entries=1, tokens_reused=40, evictions=2, misses=1,
                             hits={"exact": 1, "block": 0, "ckpt": 0, "anchor": 0, "disk": 2},
                             disk={"hits": 2, "misses": 3, "restored_tokens": 70, "restore_seconds": 0.5,
                                   "writes": 4, "entries": 1, "bytes": 123})
    engine.cache_stats = lambda: stats
    engine.reset_cache = lambda: resets.append(engine.info.model_id) or True


def test_stats_are_disabled_without_a_cache(served: Served) -> None:
    assert served.client.get("/v1/cache/stats").json() == {"enabled": False}
    assert served.chat().status_code == 200  # a fake engine has no prompt cache
    assert served.client.get("/v1/cache/stats").json() == {"enabled": False}
    assert served.client.post("/v1/cache/reset", json={}).json() == {"status": "ok", "reset": []}


def test_stats_per_model_and_reset_of_one(served: Served) -> None:
    assert served.chat().status_code == 200
    resets: list[str] = []
    _give_cache(served.engine(), resets)
    body = served.client.get("/v1/cache/stats").json()
    assert body["enabled"] is True and body["models"]["m1"]["evictions"] == 2
    assert body["hits"]["exact"] == 1 and body["tokens_reused"] == 40
    assert served.client.post("/v1/cache/reset", json={"model": "m1"}).json()["reset"] == ["m1"]
    assert served.client.post("/v1/cache/reset").json()["reset"] == ["m1"]
    assert resets == ["m1", "m1"]


def test_a_chat_request_carries_its_anchor_to_the_engine(served: Served) -> None:
    system = {"role": "system", "content": "Be brief."}
    assert served.chat({"messages": [system, {"role": "user", "content": "hi"}]}).status_code == 200
    _give_cache(served.engine(), [])  # the first request, to an engine without a cache, got no hints
    assert served.chat({"messages": [system, {"role": "user", "content": "hi"}]}).status_code == 200
    assert served.chat().status_code == 200  # no system prompt, no tools: nothing to anchor
    cacheless, with_system, plain = served.engine().submitted
    assert cacheless.cache_anchor is None
    assert with_system.cache_anchor == len("<|system|>Be brief.\n<|user|>")  # the fake tokenizer: one id a char
    assert with_system.cache_boundaries == (with_system.cache_anchor,) and plain.cache_anchor is None


def test_prometheus_has_the_cache_counters_per_model(served: Served) -> None:
    assert served.chat().status_code == 200
    _give_cache(served.engine(), [])
    text = served.client.get("/v1/metrics", params={"format": "prometheus"}).text
    for line in ('gmlx_prompt_cache_hits_total{model="m1",tier="exact"} 1.0',
                 'gmlx_prompt_cache_hits_total{model="m1",tier="ckpt"} 0.0',
                 'gmlx_prompt_cache_evictions_total{model="m1"} 2.0',
                 'gmlx_prompt_cache_tokens_reused_total{model="m1"} 40.0',
                 'gmlx_prompt_cache_entries{model="m1"} 1.0', 'gmlx_prompt_cache_bytes{model="m1"} 10.0'):
        assert line in text.splitlines(), line


def test_estimate_reports_the_tier_a_repeated_body_would_hit(served: Served) -> None:
    assert served.chat().status_code == 200
    peeked: list[list[int]] = []

    def peek(ids: list[int]) -> tuple[str, int]:
        peeked.append(ids)
        return "exact", len(ids) - 1

    served.engine().cache_peek = peek
    e = served.client.post("/v1/estimate", json={"model": "m1", "messages": [{"role": "user", "content": "hi"}]})
    assert e.status_code == 200, e.text
    body = e.json()
    assert (body["cache_tier"], body["warm_tokens"]) == ("exact", body["prompt_tokens"] - 1)
    assert peeked == [served.engine().submitted[0].prompt_tokens]  # the same ids the chat request prefilled


def _disk_served(tmp_path: Path) -> Served:
    config = make_config()
    server = dataclasses.replace(config.server, prompt_cache_disk_bytes=1 << 20, prompt_cache_dir=str(tmp_path))
    return serve(dataclasses.replace(config, server=server))


def _file(root: Path, model: str, n: int) -> None:
    """An entry file as far as the directory-level routes read it: a header naming its model."""
    from gmlx_server.engine.disk_files import FORMAT, entry_name

    meta = {"format": FORMAT, "model": model, "identity": "i", "layout": "l", "tokens": [n], "trimmable": True,
            "pinned": False}
    head = json.dumps({"__metadata__": {"gmlx": json.dumps(meta)}}).encode()
    (root / entry_name("i", "l", [n])).write_bytes(len(head).to_bytes(8, "little") + head)


def test_the_disk_tier_in_stats_and_its_reset_by_model_and_tier(tmp_path: Path) -> None:
    s = _disk_served(tmp_path)
    for model, n in (("m1", 1), ("m1", 2), ("other", 3)):
        _file(tmp_path, model, n)
    body = s.client.get("/v1/cache/stats").json()
    assert body["enabled"] is False and body["disk"]["entries"] == 3 and body["disk"]["dir"] == str(tmp_path)
    assert s.chat().status_code == 200
    _give_cache(s.engine(), resets := [])
    disk = s.client.get("/v1/cache/stats").json()["disk"]
    assert disk["hits"] == 2 and disk["restored_tokens"] == 70 and disk["max_bytes"] == 1 << 20
    text = s.client.get("/v1/metrics", params={"format": "prometheus"}).text.splitlines()
    assert 'gmlx_prompt_cache_disk_hits_total{model="m1"} 2.0' in text
    assert 'gmlx_prompt_cache_hits_total{model="m1",tier="disk"} 2.0' in text
    done = s.client.post("/v1/cache/reset", json={"model": "m1", "tier": "disk"}).json()
    assert done == {"status": "ok", "reset": [], "disk_entries_removed": 2} and resets == []
    assert s.client.post("/v1/cache/reset", json={"tier": "ram"}).json() == {"status": "ok", "reset": ["m1"]}
    assert s.client.post("/v1/cache/reset").json() == {"status": "ok", "reset": ["m1"], "disk_entries_removed": 1}
    assert not list(tmp_path.iterdir())
    s.client.close()


def test_a_reset_of_an_unknown_tier_or_an_off_disk_tier_is_a_400(served: Served) -> None:
    for body in ({"tier": "exact"}, {"tier": 3}, {"tier": "disk"}):
        r = served.client.post("/v1/cache/reset", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "tier", body
