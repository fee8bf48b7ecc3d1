"""The live request table and the resident model table (whose selected row the keys act on)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from gmlx_top.view import (
    BAND_STYLE,
    HOST_COLUMNS,
    MODEL_COLUMNS,
    REQUEST_COLUMNS,
    STATE_STYLE,
    host_cells,
    model_cells,
    request_cells,
)

CONNECTION_STYLE = {"connected": "green", "connecting": "yellow"}


class RequestTable(DataTable[Any]):
    def on_mount(self) -> None:
        self.cursor_type = "none"  # read-only: the keys act on the model table
        self.add_columns(*REQUEST_COLUMNS)

    def show(self, rows: Sequence[Mapping[str, Any]]) -> None:
        self.clear()
        for row in rows:
            cells: list[Any] = list(request_cells(row))
            cells[2] = Text(cells[2], style=STATE_STYLE.get(cells[2], ""))
            self.add_row(*cells, key=str(row.get("id")))


class ModelTable(DataTable[Any]):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rows_by_id: dict[str, Mapping[str, Any]] = {}

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.add_columns(*MODEL_COLUMNS)

    def show(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Refill, keeping the cursor on the model it was on."""
        keep = self.selected_id()
        self.clear()
        self.rows_by_id = {str(r.get("id")): r for r in rows if r.get("id")}
        for model_id, row in self.rows_by_id.items():
            self.add_row(*model_cells(row), key=model_id)
        if keep in self.rows_by_id:
            self.move_cursor(row=list(self.rows_by_id).index(keep))

    def selected_id(self) -> str | None:
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        return str(key.value) if key.value is not None else None

    def selected(self) -> Mapping[str, Any] | None:
        model_id = self.selected_id()
        return self.rows_by_id.get(model_id) if model_id else None


class HostTable(DataTable[Any]):
    """`gmlx top URL URL...`: one row per host; the row under the cursor is the host shown below."""

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.columns_keys = self.add_columns(*HOST_COLUMNS)

    def show(self, hosts: Sequence[tuple[str, str, Mapping[str, Any]]]) -> None:
        """(url, connection, snapshot) per host. Cells are updated in place, so a poll never moves the cursor
        (moving it is the user's way of picking a host)."""
        for i, (url, connection, server) in enumerate(hosts):
            cells: list[Any] = list(host_cells(url, connection, server))
            cells[1] = Text(cells[1], style=CONNECTION_STYLE.get(connection, "red"))
            cells[2] = Text(f" {cells[2]} ", style=BAND_STYLE.get(cells[2], ""))
            if i < self.row_count:
                for column, value in zip(self.columns_keys, cells, strict=True):
                    self.update_cell(str(i), column, value)
            else:
                self.add_row(*cells, key=str(i))
