"""`gmlx top`: a Textual dashboard that polls /v1/metrics and acts on the selected resident model.

The poll loop never stops: a transport failure shows "disconnected" and retries with backoff, so
the dashboard rides through a server restart; the last snapshot stays on screen meanwhile. With several
servers (`gmlx top URL URL...`, a fleet behind a balancer) each is polled on its own, a table shows one
row per host above the selected host's details, and the keys act on that host.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.notifications import SeverityLevel
from textual.widgets import DataTable, Footer

from gmlx_top.client import ActionKind, TopClient
from gmlx_top.hosts import HostState, host_states
from gmlx_top.view import Backoff, History, fleet_line, request_summary, rows, services_line
from gmlx_top.widgets import CapacityPanel, ConfirmScreen, HostTable, ModelTable, RatePanel, RequestTable, StatusBar

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
    #hosts { height: auto; max-height: 12; border-bottom: solid $primary; border-title-align: left; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("u", "ask('unload')", "unload"), Binding("k", "ask('keep')", "keep"),
        Binding("r", "ask('reset')", "reset cache"), Binding("q", "quit", "quit"),
        Binding("n", "host(1)", "next host", show=False), Binding("p", "host(-1)", "previous host", show=False),
    ]

    def __init__(self, client: TopClient | Sequence[TopClient], interval: float = 1.0, *, auto_poll: bool = True,
                 backoff: Backoff | None = None, history: History | None = None) -> None:
        super().__init__()
        clients = [client] if not isinstance(client, Sequence) else list(client)
        self.hosts: list[HostState] = host_states(clients, backoff, history)
        self.selected = 0
        self.interval, self.auto_poll = interval, auto_poll
        self.last_message = ""
        # Kept as attributes: the dialog screen covers the main one, and polls still update these.
        self.status_bar, self.rate_panel = StatusBar(id="status"), RatePanel(id="rates")
        self.request_table, self.model_table = RequestTable(id="requests"), ModelTable(id="models")
        self.capacity_panel = CapacityPanel(id="capacity")
        self.host_table = HostTable(id="hosts")

    # The selected host's state, under the names a one-server dashboard always had.
    @property
    def host(self) -> HostState:
        return self.hosts[self.selected]

    @property
    def client(self) -> TopClient:
        return self.host.client

    @property
    def server(self) -> Mapping[str, Any]:
        return self.host.server

    @property
    def connection(self) -> str:
        return self.host.connection

    @property
    def problem(self) -> str:
        return self.host.problem

    @property
    def backoff(self) -> Backoff:
        return self.host.backoff

    @property
    def history(self) -> History:
        return self.host.history

    def compose(self) -> ComposeResult:
        if len(self.hosts) > 1:
            self.host_table.border_title = "hosts: n / p or the cursor pick the one shown below"
            yield self.host_table
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
            for i, host in enumerate(self.hosts):  # each host on its own clock: a dead one backs off alone
                self.run_worker(self._poll_loop(host), group=f"poll-{i}", exclusive=True)

    async def on_unmount(self) -> None:
        for host in self.hosts:
            await host.client.aclose()

    # --- polling -------------------------------------------------------------------------------

    async def _poll_loop(self, host: HostState) -> None:
        while True:
            delay = await host.poll(self.interval)
            self.refresh_view()
            await asyncio.sleep(delay)

    async def poll_once(self) -> float:
        """Fetch one snapshot of every host and show them; return the delay before the next poll."""
        delays = await asyncio.gather(*(host.poll(self.interval) for host in self.hosts))
        self.refresh_view()
        return min(delays)

    # --- the host shown ------------------------------------------------------------------------

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table is self.host_table and event.cursor_row != self.selected:
            self.selected = event.cursor_row
            self.refresh_view()

    def action_host(self, step: int) -> None:
        if len(self.hosts) > 1:
            self.host_table.move_cursor(row=(self.selected + step) % len(self.hosts))

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
        if len(self.hosts) > 1:
            states = [(h.client.base_url, h.connection, h.server) for h in self.hosts]
            self.host_table.show(states)
            self.host_table.border_subtitle = fleet_line([(c, s) for _, c, s in states])
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
        model, host = str(row["id"]), self.host  # the host shown when asked, even if the user moves on
        if kind == "keep" and row.get("kept"):
            kind = "release"

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(self.act(kind, model, host), group="action")
            else:
                self.say(f"{kind} {model}: cancelled")

        where = f" on {host.client.base_url}" if len(self.hosts) > 1 else ""
        self.push_screen(ConfirmScreen(QUESTIONS[kind].format(model=model) + where), answered)

    async def act(self, kind: ActionKind, model: str, host: HostState | None = None) -> None:
        result = await (host or self.host).client.action(kind, model)
        self.say(result.message, "information" if result.ok else "error")
        await self.poll_once()

    def say(self, message: str, severity: SeverityLevel = "information") -> None:
        self.last_message = message
        self.notify(message, severity=severity)

