"""`gmlx top URL URL URL`: one row per host above the selected host's details, each host polled and acted on
alone, driven by Textual's pilot over scripted clients (the live fleet is tests/fleet/test_fleet.py's)."""

from __future__ import annotations

import asyncio

from gmlx_top.app import TopApp
from gmlx_top.view import fleet_line, host_cells
from gmlx_top.widgets import ConfirmScreen
from tests.top.fakes import SIZE, FakeClient, recorded, refused


def _fleet() -> tuple[TopApp, list[FakeClient]]:
    clients = [FakeClient([recorded("busy")]), FakeClient([recorded("idle")]), FakeClient([refused()])]
    for i, c in enumerate(clients):
        c.base_url = f"http://10.0.0.{i + 1}:8080"
    return TopApp(clients, interval=1.0, auto_poll=False), clients


def _cells(app: TopApp) -> list[list[str]]:
    t = app.host_table
    return [[str(c) for c in t.get_row_at(i)] for i in range(t.row_count)]


def test_one_row_per_host_and_the_fleet_totals() -> None:
    async def run() -> None:
        app, _ = _fleet()
        async with app.run_test(size=SIZE):
            assert await app.poll_once() == 0.5  # the dead host's backoff sets the pace of a one-shot poll
            rows = _cells(app)
            assert [r[0] for r in rows] == ["10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"]
            assert [r[1] for r in rows] == ["connected", "connected", "disconnected"]
            assert rows[0][2:5] == [" yellow ", "3/8", "4/4"]  # band, queue, decoding of the busy host
            assert rows[2][2:] == [" - ", "-/-", "-/-", "-", "-", "-", "-"]  # nothing known of the dead one
            assert str(app.host_table.border_subtitle).startswith("fleet: 2/3 hosts up  decoding 4/")
            assert app.request_table.row_count == 7  # the selected (first) host's requests

    asyncio.run(run())


def test_n_and_p_pick_the_host_shown_and_the_keys_act_on_it() -> None:
    async def run() -> None:
        app, clients = _fleet()
        async with app.run_test(size=SIZE) as pilot:
            await app.poll_once()
            await pilot.press("n")
            await pilot.pause()
            assert app.selected == 1 and app.request_table.row_count == 0  # the idle host
            assert app.client is clients[1] and app.connection == "connected"
            await pilot.press("u")
            assert isinstance(app.screen, ConfirmScreen) and "on http://10.0.0.2:8080" in app.screen.question
            await pilot.press("y")
            await app.workers.wait_for_complete()
            assert clients[1].actions == [("unload", "smollm2")] and not clients[0].actions
            await pilot.press("n")
            await pilot.pause()
            assert app.selected == 2 and app.connection == "disconnected" and "10.0.0.3" in str(app.headline())
            await pilot.press("n")  # wraps around
            await pilot.pause()
            assert app.selected == 0 and app.request_table.row_count == 7

    asyncio.run(run())


def test_each_host_polls_on_its_own_clock() -> None:
    async def run() -> None:
        app, clients = _fleet()
        app.auto_poll, app.interval = True, 0.01
        async with app.run_test(size=SIZE) as pilot:
            for _ in range(300):
                if clients[0].fetches >= 5:
                    break
                await pilot.pause(0.01)
            assert clients[0].fetches >= 5 and clients[2].fetches < clients[0].fetches  # the dead one backs off
        assert all(c.closed for c in clients)

    asyncio.run(run())


def test_host_cells_and_fleet_line_take_loose_snapshots() -> None:
    assert host_cells("http://h:1", "connecting", {})[:3] == ("h:1", "connecting", "-")
    assert fleet_line([("disconnected", {}), ("connected", {"queue": {"waiting": None}})]).startswith(
        "fleet: 1/2 hosts up  decoding 0/0  waiting 0")
