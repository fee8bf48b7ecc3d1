"""Every panel query of the committed Grafana dashboards, and the metric names each one reads.

Shared by the fast dashboard checks (tests/top/test_dashboards.py) and the real-Prometheus test
(tests/e2e/test_prometheus.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
# What Grafana would put in: every server, every model, a rate window of a few scrapes.
VARIABLES = {"$__rate_interval": "30s", "${instance}": ".*", "$instance": ".*", "${model}": ".*", "$model": ".*"}
SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")
_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset",
          "inf", "nan"}


def load(path: Path) -> dict[str, Any]:
    board: dict[str, Any] = json.loads(path.read_text())
    return board


def panels(board: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for panel in board.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # collapsed rows hold their panels


def queries(paths: Iterable[Path] = DASHBOARDS) -> list[tuple[str, str]]:
    """(`dashboard / panel / refId`, expr with the template variables substituted) for every target."""
    out = []
    for path in paths:
        board = load(path)
        for panel in panels(board):
            for target in panel.get("targets", []):
                where = f"{path.stem} / {panel['title']} / {target['refId']}"
                out.append((where, substitute(target["expr"])))
    return out


def substitute(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (not functions, keywords, labels or strings)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for match in re.finditer(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        word = match.group(0)
        if word.lower() in _WORDS or e[match.end():].lstrip().startswith("("):
            continue
        names.add(word)
    return names


def exported(families: Iterable[Any]) -> set[str]:
    """Family and sample names from prometheus_client's parser of a /v1/metrics?format=prometheus text."""
    names = set()
    for family in families:
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names


def unknown(name: str, names: set[str]) -> bool:
    return name not in names and not any(name == n + s for n in names for s in SUFFIXES)
