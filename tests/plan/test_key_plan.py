"""Plans per key: `gmlx plan --config C --key NAME` and `/v1/capacity/plan?key=NAME` split a fan-out by the key's
fair share (runs, waits for a slot, gets 429) and plan the width that runs, with the rule admission uses."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from gmlx_plan.cli import main
from gmlx_plan.key_share import split
from gmlx_server.app import create_app
from gmlx_server.config import ApiKey, FairShare
from gmlx_server.serving.model_host import ModelHost
from tests.conftest import smollm2_path
from tests.fakes import FakeFactory
from tests.routes.conftest import Served, SyncClient, make_config

ADMIN = "ops-key"


def test_the_split() -> None:
    assert split("a", 8, 2, 3).as_json() == {"name": "a", "max_concurrent": 2, "max_queued": 3, "runs": 2,
                                             "waits": 3, "refused": 3}
    assert (split("a", 8, None, None).runs, split("a", 3, 2, None).waits, split("a", 1, 2, 0).refused) == (8, 1, 0)


def config(tmp_path: Path) -> Path:
    cfg = tmp_path / "gmlx.yaml"
    cfg.write_text(f"server:\n  fair_share: {{max_concurrent: 4}}\n  api_keys:\n"
                   f"    - {{name: alice, key: a1, max_concurrent: 2, max_queued: 1}}\n    - {{name: bob, key: b2}}\n"
                   f"models:\n  smol:\n    path: {smollm2_path()}\n")
    return cfg


def test_gmlx_plan_answers_per_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "--config", str(config(tmp_path)), "--model", "smol", "--width", "8", "--depth", "1024",
            "--memory", "4GiB"]
    assert main([*base, "--key", "alice", "--json"]) == 1  # 5 of alice's 8 would be refused
    out = json.loads(capsys.readouterr().out)
    assert out["key"] == {"name": "alice", "max_concurrent": 2, "max_queued": 1, "runs": 2, "waits": 1,
                          "refused": 5}
    assert out["plan"]["width_read"] == 2
    main([*base, "--key", "bob"])
    assert "key bob (max_concurrent 4, max_queued no limit): 4 run at once, 4 wait" in capsys.readouterr().out
    assert main([*base, "--key", "carol"]) == 2 and "no such key" in capsys.readouterr().err


@pytest.fixture(scope="module")
def keyed() -> Served:
    cfg = make_config()
    cfg = replace(cfg, models={m: replace(e, path=smollm2_path()) for m, e in cfg.models.items()},
                  server=replace(cfg.server, fair_share=FairShare(3, 2), api_keys=(
                      ApiKey("alice", "a1", share=FairShare(1, 1)), ApiKey("ops", ADMIN, "admin"))))
    factory = FakeFactory()
    app = create_app(cfg, host=ModelHost(cfg, factory, check_headers=False))
    return Served(app, SyncClient(app), factory, cfg)


def test_capacity_plan_answers_per_key(keyed: Served) -> None:
    get = keyed.client.get
    plain = get("/v1/capacity/plan", params={"width": 4, "depth": 512}, headers={"x-api-key": ADMIN}).json()
    assert "key" not in plain and plain["admit_now"] is True
    alice = get("/v1/capacity/plan", params={"width": 4, "depth": 512, "key": "alice"},
                headers={"x-api-key": ADMIN}).json()
    assert alice["key"] == {"name": "alice", "max_concurrent": 1, "max_queued": 1, "runs": 1, "waits": 1,
                            "refused": 2}
    assert alice["width"] == 4 and alice["admit_now"] is False and "2 get 429 rate_limited" in alice["reason"]
    ops = get("/v1/capacity/plan", params={"width": 4, "depth": 512, "key": "ops"}, headers={"x-api-key": ADMIN})
    assert ops.json()["key"]["runs"] == 3 and ops.json()["key"]["refused"] == 0  # server.fair_share
    bad = get("/v1/capacity/plan", params={"width": 4, "depth": 512, "key": "carol"}, headers={"x-api-key": ADMIN})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "key" and "alice, ops" in bad.text
