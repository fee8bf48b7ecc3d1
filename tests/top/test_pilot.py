"""`gmlx top` driven by Textual's pilot: keys ask before acting, then call the client; reconnects."""

from __future__ import annotations

import asyncio

import httpx

from gmlx_top.app import TopApp
from gmlx_top.client import ActionResult, ApiError
from gmlx_top.view import Backoff
from gmlx_top.widgets import ConfirmScreen, ModelTable, RequestTable, StatusBar
from tests.top.fakes import SIZE, app_for, poll, recorded, refused


def status_text(app: TopApp) -> str:
    return str(app.query_one(StatusBar).render())


def test_unload_asks_then_calls_the_client_with_the_selected_model() -> None:
    async def run() -> None:
        app, client = app_for([recorded("busy")])
        async with app.run_test(size=SIZE) as pilot:
            await poll(app, 1)
            await pilot.press("u", "k")  # a second key while asked is ignored
            assert isinstance(app.screen, ConfirmScreen) and "Unload model smollm2" in app.screen.question
            assert len(app.screen_stack) == 2 and client.actions == []  # nothing happens before the answer
            await pilot.press("y")
            await app.workers.wait_for_complete()
            assert client.actions == [("unload", "smollm2")]
            assert app.last_message == "unload smollm2: done (200)"
            assert client.fetches == 2  # the action refreshes the view at once

    asyncio.run(run())


def test_no_cancels_and_escape_cancels() -> None:
    async def run() -> None:
        app, client = app_for([recorded("busy")])
        async with app.run_test(size=SIZE) as pilot:
            await poll(app, 1)
            for answer in ("n", "escape"):
                await pilot.press("r", answer)
                assert not isinstance(app.screen, ConfirmScreen)
            assert client.actions == [] and app.last_message == "reset smollm2: cancelled"

    asyncio.run(run())


def test_keys_act_on_the_row_under_the_cursor_and_keep_toggles_to_release() -> None:
    async def run() -> None:
        app, client = app_for([recorded("busy")])
        async with app.run_test(size=SIZE) as pilot:
            await poll(app, 1)
            await pilot.press("down")
            assert app.query_one(ModelTable).selected_id() == "gemma3-270m"
            await poll(app, 1)  # a refresh keeps the cursor on the same model
            assert app.query_one(ModelTable).selected_id() == "gemma3-270m"
            await pilot.press("k", "y", "up", "k", "y", "r", "y")
            await app.workers.wait_for_complete()
            assert client.actions == [("release", "gemma3-270m"), ("keep", "smollm2"), ("reset", "smollm2")]

    asyncio.run(run())


def test_a_missing_route_shows_the_servers_typed_error() -> None:
    missing = ActionResult(False, 404, "keep smollm2: 404 not_found_error: POST /v1/keep: 404 Not Found")

    async def run() -> None:
        app, client = app_for([recorded("idle")], results={"keep": missing})
        async with app.run_test(size=SIZE) as pilot:
            await poll(app, 1)
            await pilot.press("k", "y")
            await app.workers.wait_for_complete()
            assert client.actions == [("keep", "smollm2")]
            assert "404 not_found_error" in app.last_message
            assert app.connection == "connected"

    asyncio.run(run())


def test_keys_without_a_model_say_so() -> None:
    async def run() -> None:
        app, client = app_for([refused()])
        async with app.run_test(size=SIZE) as pilot:
            await poll(app, 1)
            await pilot.press("u")
            assert not isinstance(app.screen, ConfirmScreen)
            assert app.last_message == "no resident model selected" and client.actions == []

    asyncio.run(run())


def test_disconnect_backs_off_then_recovers() -> None:
    async def run() -> None:
        app, _ = app_for([recorded("busy"), refused(), refused(), httpx.ReadTimeout("slow"), recorded("idle")],
                         backoff=Backoff(initial=0.5, maximum=1.0))
        async with app.run_test(size=SIZE):
            assert await app.poll_once() == 1.0
            assert [await app.poll_once() for _ in range(3)] == [0.5, 1.0, 1.0]
            assert app.connection == "disconnected" and "ReadTimeout" in status_text(app)
            assert app.query_one(RequestTable).row_count == 7  # the last snapshot stays on screen
            assert await app.poll_once() == 1.0
            assert app.connection == "connected" and "disconnected" not in status_text(app)
            assert app.query_one(RequestTable).row_count == 0 and app.backoff.attempts == 0

    asyncio.run(run())


def test_the_poll_loop_reconnects_by_itself_after_a_restart() -> None:
    async def run() -> None:
        script = [recorded("idle"), refused(), refused(), refused(), recorded("busy")]
        app, client = app_for(script, auto_poll=True, backoff=Backoff(initial=0.01, maximum=0.02))
        app.interval = 0.01
        async with app.run_test(size=SIZE) as pilot:
            for _ in range(500):
                if client.fetches >= len(script):
                    break
                await pilot.pause(0.01)
            await pilot.pause(0.05)
            assert app.connection == "connected" and app.query_one(RequestTable).row_count == 7
        assert client.closed

    asyncio.run(run())


def test_a_server_error_is_shown_and_retried() -> None:
    async def run() -> None:
        app, _ = app_for([ApiError(401, "authentication_error", "invalid API key"), recorded("idle")])
        async with app.run_test(size=SIZE):
            await app.poll_once()
            assert app.connection == "error" and "invalid API key" in status_text(app)
            await app.poll_once()
            assert app.connection == "connected"

    asyncio.run(run())
