"""`gmlx top`: a Textual dashboard that polls /v1/metrics and acts on the selected resident model.

The poll loop never stops: a transport failure shows "disconnected" and retries with backoff, so
the dashboard rides through a server restart; the last snapshot stays on screen meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, ClassVar

import httpx
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.notifications import SeverityLevel
from textual.widgets import Footer

from gmlx_top.client import ActionKind, ApiError, TopClient
from gmlx_top.view import Backoff, History, request_summary, rows, services_line
from gmlx_top.widgets import CapacityPanel, ConfirmScreen, ModelTable, RatePanel, RequestTable, StatusBar

QUESTIONS: dict[ActionKind, str] = {
    "unload": "Unload model {model}? (The server refuses while it streams.)",
    "keep": "Keep model {model} resident past the idle timeout, and warm it?",
    "release": "Release the keep on model {model}?",
    "reset": "Reset the prompt cache of model {model}?",
}


class TopApp(App[None]):
    TITLE = "gmlx top"
    CSS = """
    #requests { height: 1fr; border-top: solid $primary; border-title-align: left; }
    #bottom { height: 10; border-top: solid $primary; border-title-align: left; }
    #models { width: 1fr; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("u", "ask('unload')", "unload"), Binding("k", "ask('keep')", "keep"),
        Binding("r", "ask('reset')", "reset cache"), Binding("q", "quit", "quit"),
    ]

    def __init__(self, client: TopClient, interval: float = 1.0, *, auto_poll: bool = True,
                 backoff: Backoff | None = None, history: History | None = None) -> None:
        super().__init__()
        self.client, self.interval, self.auto_poll = client, interval, auto_poll
        self.backoff = backoff or Backoff()
        self.history = history or History()
        self.server: Mapping[str, Any] = {}
        self.connection = "connecting"
        self.problem = ""
        self.last_message = ""
        # Kept as attributes: the dialog screen covers the main one, and polls still update these.
        self.status_bar, self.rate_panel = StatusBar(id="status"), RatePanel(id="rates")
        self.request_table, self.model_table = RequestTable(id="requests"), ModelTable(id="models")
        self.capacity_panel = CapacityPanel(id="capacity")

    def compose(self) -> ComposeResult:
        yield self.status_bar
        yield self.rate_panel
        yield self.request_table
        with Horizontal(id="bottom") as bottom:
            bottom.border_title = "resident models: u unload  k keep  r reset cache"
            yield self.model_table
            yield self.capacity_panel
        yield Footer()

    def on_mount(self) -> None:
        self.model_table.focus()
        self.refresh_view()
        if self.auto_poll:
            self.run_worker(self._poll_loop(), group="poll", exclusive=True)

    async def on_unmount(self) -> None:
        await self.client.aclose()

    # --- polling -------------------------------------------------------------------------------

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(await self.poll_once())

    async def poll_once(self) -> float:
        """Fetch one snapshot and show it; return the delay before the next poll."""
        try:
            body = await self.client.fetch()
        except httpx.TransportError as e:
            return self._failed("disconnected", type(e).__name__)
        except (ApiError, ValueError) as e:
            return self._failed("error", str(e))
        self.backoff.reset()
        self.server, self.connection, self.problem = body["server"], "connected", ""
        self.history.record(self.server)
        self.refresh_view()
        return self.interval

    def _failed(self, state: str, reason: str) -> float:
        delay = self.backoff.next()
        self.connection = state
        self.problem = f"{reason}; retrying in {delay:.1f}s (attempt {self.backoff.attempts})"
        self.refresh_view()
        return delay

    def headline(self) -> Text:
        style = {"connected": "bold green", "connecting": "bold yellow"}.get(self.connection, "bold red")
        mark = "●" if self.connection == "connected" else "✖"
        text = Text.assemble((f"{mark} {self.connection}", style), f"  {self.client.base_url}")
        if self.problem:
            text.append(f"  {self.problem}", style="red")
            if self.server:
                text.append("  (showing the last snapshot)", style="dim")
        elif self.connection == "connected":
            text.append(f"  every {self.interval:g}s", style="dim")
        return text

    def refresh_view(self) -> None:
        if not self.is_running:  # a poll that lands while the app shuts down
            return
        self.status_bar.show(self.headline(), self.server)
        self.rate_panel.show(self.history, self.server)
        requests = rows(self.server, "requests")
        self.request_table.show(requests)
        self.request_table.border_title = request_summary(requests)
        self.request_table.border_subtitle = services_line(self.server)
        self.model_table.show(rows(self.server, "resident_models"))
        self.capacity_panel.show(self.server.get("capacity"))

    # --- actions on the selected model --------------------------------------------------------

    def action_ask(self, kind: ActionKind) -> None:
        if isinstance(self.screen, ConfirmScreen):  # one question at a time
            return
        row = self.model_table.selected()
        if row is None:
            self.say("no resident model selected", "warning")
            return
        model = str(row["id"])
        if kind == "keep" and row.get("kept"):
            kind = "release"

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(self.act(kind, model), group="action")
            else:
                self.say(f"{kind} {model}: cancelled")

        self.push_screen(ConfirmScreen(QUESTIONS[kind].format(model=model)), answered)

    async def act(self, kind: ActionKind, model: str) -> None:
        result = await self.client.action(kind, model)
        self.say(result.message, "information" if result.ok else "error")
        await self.poll_once()

    def say(self, message: str, severity: SeverityLevel = "information") -> None:
        self.last_message = message
        self.notify(message, severity=severity)

