"""SVG snapshots of `gmlx top` on recorded /v1/metrics snapshots (pytest-textual-snapshot).

Update after an intended change with: pytest tests/top --snapshot-update (and review the SVGs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.pilot import Pilot

from gmlx_top.app import TopApp
from tests.top.fakes import SIZE, app_for, busy_minute, poll, recorded, refused

Compare = Callable[..., bool]


def _polled(times: int) -> Callable[[Pilot[Any]], Any]:
    async def run_before(pilot: Pilot[Any]) -> None:
        assert isinstance(pilot.app, TopApp)
        await poll(pilot.app, times)
        await pilot.pause()

    return run_before


def test_busy_with_queue(snap_compare: Compare) -> None:
    script = busy_minute()
    app, _ = app_for(script)
    assert snap_compare(app, terminal_size=SIZE, run_before=_polled(len(script)))


def test_idle(snap_compare: Compare) -> None:
    app, _ = app_for([recorded("idle")])
    assert snap_compare(app, terminal_size=SIZE, run_before=_polled(1))


def test_no_capacity_table(snap_compare: Compare) -> None:
    app, _ = app_for([recorded("no_capacity")])
    assert snap_compare(app, terminal_size=SIZE, run_before=_polled(1))


def test_disconnected_keeps_the_last_snapshot(snap_compare: Compare) -> None:
    app, _ = app_for([recorded("idle"), refused()])
    assert snap_compare(app, terminal_size=SIZE, run_before=_polled(3))


def test_confirmation_dialog(snap_compare: Compare) -> None:
    app, _ = app_for([recorded("busy")])
    assert snap_compare(app, terminal_size=SIZE, run_before=_polled(1), press=["u"])
