"""The engine contract is explicit: every capability is a member of the Engine protocol, EngineBase gives the
optional ones honest defaults, and an engine lacking a member is refused when it is built, not on first use."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from gmlx_server.engine.types import ENGINE_MEMBERS, GenerationRequest, PromptCacheStats, check_engine
from gmlx_server.serving.model_host import ModelHost
from tests.fakes import FakeEngine, FakeFactory, fake_info
from tests.routes.conftest import make_config


def test_the_fake_engine_is_complete_and_shares_the_honest_defaults() -> None:
    engine = FakeEngine(fake_info("m"))
    check_engine(engine)
    assert engine.cache_stats() == PromptCacheStats() and not engine.cache_stats().enabled
    assert engine.cache_peek([1, 2, 3]) == ("miss", 0) and engine.expected_warm([1, 2, 3]) == 0
    assert engine.reset_cache() is False and engine.shed("r", "why") is False and engine.memory is None


def test_generate_sync_drives_submit_to_the_final_event() -> None:
    engine, events = FakeEngine(fake_info("m")), []
    engine.generate_sync(GenerationRequest("r", [1, 2], 3), events.append)
    assert events[-1].finish_reason is not None and sum(1 for e in events if e.finish_reason) == 1


@pytest.mark.parametrize("member", ENGINE_MEMBERS)
def test_an_engine_lacking_any_member_is_named_and_refused(member: str) -> None:
    @dataclass
    class Partial:
        closed: list[bool] = field(default_factory=list)

    partial = Partial()
    for name in ENGINE_MEMBERS:
        if name != member:
            setattr(partial, name, None)
    with pytest.raises(TypeError, match=f"lacks {member}$"):
        check_engine(partial)


def test_the_host_refuses_an_incomplete_engine_at_load_and_closes_it() -> None:
    closed: list[str] = []

    class NoShed(FakeEngine):
        def __getattribute__(self, name: str) -> object:
            if name == "shed":
                raise AttributeError(name)
            return super().__getattribute__(name)

        def close(self) -> None:
            closed.append(self.info.model_id)

    def factory(entry: object, env: object) -> NoShed:
        return NoShed(fake_info("m1"))

    host = ModelHost(make_config(), factory, check_headers=False)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="NoShed is not a complete engine: it lacks shed"):
        asyncio.run(host.engine("m1"))
    assert closed == ["m1"] and "m1" not in host.resident


def test_cache_reset_lives_in_the_host() -> None:
    factory = FakeFactory()
    host = ModelHost(make_config(("m1", "m2")), factory, check_headers=False)
    asyncio.run(host.engine("m1"))
    asyncio.run(host.engine("m2"))
    factory.engines["m2"].reset_cache = lambda: True  # type: ignore[method-assign]
    assert host.reset_cache().models == ["m2"] and host.reset_cache("m1").models == []
    assert host.reset_cache("m2").models == ["m2"]

