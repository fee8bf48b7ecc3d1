"""Textual widgets of `gmlx top`: the status bar, rate sparklines, tables and the confirmation dialog."""

from gmlx_top.widgets.confirm import ConfirmScreen
from gmlx_top.widgets.panels import CapacityPanel, RatePanel, StatusBar
from gmlx_top.widgets.tables import HostTable, ModelTable, RequestTable

__all__ = ["CapacityPanel", "ConfirmScreen", "HostTable", "ModelTable", "RatePanel", "RequestTable", "StatusBar"]
