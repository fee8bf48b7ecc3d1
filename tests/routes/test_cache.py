"""GET /v1/cache/stats and POST /v1/cache/reset on fake engines."""

from __future__ import annotations

from typing import Any

from tests.routes.conftest import Served


def _give_cache(engine: Any, resets: list[str]) -> None:
    stats = {"enabled": True, "bytes": 10, "entries": 1, "tokens_reused": 40, "evictions": 2, "misses": 1,
             "hits": {"exact": 1, "block": 0, "ckpt": 0, "anchor": 0}}
    engine.cache_stats = lambda: stats
    engine.reset_cache = lambda: resets.append(engine.info.model_id)


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
