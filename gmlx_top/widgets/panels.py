"""The status bar (connection, governor band, queue, memory), the rate sparklines and the capacity panel."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, Sparkline, Static

from gmlx_top.view import History, capacity_lines, governor_text, memory_line, queue_line, rates_line


class StatusBar(Static):
    DEFAULT_CSS = "StatusBar { height: 4; padding: 0 1; background: $boost; }"

    def show(self, connection: Text, server: Mapping[str, Any]) -> None:
        band, style, rest = governor_text(server)
        text = Text.assemble(connection, "\n", (band, style), rest, "\n", queue_line(server), "\n",
                             memory_line(server))
        self.update(text)


class RatePanel(Horizontal):
    DEFAULT_CSS = """
    RatePanel { height: 4; }
    RatePanel > Vertical { width: 1fr; padding: 0 1; }
    RatePanel Sparkline { height: 2; }
    """

    def compose(self) -> ComposeResult:
        for name in ("decode", "prefill"):
            with Vertical():
                yield Label(name, id=f"{name}-label")
                yield Sparkline([], id=f"{name}-spark")

    def show(self, history: History, server: Mapping[str, Any]) -> None:
        for name, series, line in zip(("decode", "prefill"), (history.decode, history.prefill),
                                      rates_line(server), strict=True):
            self.query_one(f"#{name}-label", Label).update(line)
            self.query_one(f"#{name}-spark", Sparkline).data = list(series)


class CapacityPanel(Static):
    DEFAULT_CSS = "CapacityPanel { width: 40; padding: 0 1; border-left: solid $primary; }"

    def show(self, capacity: Any) -> None:
        self.update("\n".join(["[b]capacity[/b]", *capacity_lines(capacity)]))
