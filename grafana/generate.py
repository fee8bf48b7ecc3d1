"""Generate the Grafana dashboards in grafana/dashboards/ from one description of their panels.

    .venv/bin/python grafana/generate.py          # rewrite the JSON files
    .venv/bin/python grafana/generate.py --check  # exit 1 when the committed JSON is stale

Plain Python and JSON (no dashboards-as-code dependency). Every query filters on the `instance`
variable (one Prometheus, several gmlx servers) and per-model queries on `model`. The panels'
PromQL is run against a real Prometheus scraping a real `gmlx serve` by tests/e2e/test_prometheus.py.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards"
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "[$__rate_interval]"
BANDS = ("green", "yellow", "orange", "red")
BAND_COLORS = {"green": "green", "yellow": "yellow", "orange": "orange", "red": "red"}


def m(name: str, model: bool = False, **labels: str) -> str:
    """A selector: `name{instance=~"$instance"[,model=~"$model"][,k="v"...]}`."""
    matchers = ['instance=~"$instance"'] + (['model=~"$model"'] if model else [])
    matchers += [f'{k}="{v}"' for k, v in labels.items()]
    return f"{name}{{{','.join(matchers)}}}"


def rate(name: str, by: str = "", model: bool = False) -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({m(name, model)}{RATE}))"


def quantile(q: float, histogram: str) -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({m(histogram + '_bucket')}{RATE})))"


def band_index() -> str:
    """0 green, 1 yellow, 2 orange, 3 red: one series per server for a state timeline."""
    parts = [f"{i} * {m('gmlx_governor_band', band=b)}" for i, b in enumerate(BANDS)]
    return " + ignoring(band) ".join(parts)


@dataclass
class Target:
    expr: str
    legend: str = ""
    instant: bool = False

    def json(self, ref: str) -> dict[str, Any]:
        out: dict[str, Any] = {"datasource": DS, "refId": ref, "expr": self.expr, "legendFormat": self.legend,
                               "range": not self.instant, "instant": self.instant}
        if self.instant:
            out["format"] = "table"
        return out


@dataclass
class Panel:
    kind: str  # timeseries, stat, table, state-timeline
    title: str
    targets: list[Target]
    width: int = 8
    height: int = 8
    unit: str = "short"
    description: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    overrides: list[dict[str, Any]] = field(default_factory=list)
    transformations: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Row:
    title: str
    panels: list[Panel]
    repeat: str | None = None


def series(title: str, *targets: Target, unit: str = "short", width: int = 8, stack: bool = False,
           description: str = "") -> Panel:
    custom = {"stacking": {"mode": "normal" if stack else "none"}, "fillOpacity": 20 if stack else 8}
    return Panel("timeseries", title, list(targets), width, unit=unit, description=description,
                 defaults={"custom": custom})


def stat(title: str, target: Target, unit: str = "short", width: int = 4, **options: Any) -> Panel:
    opts = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}, "colorMode": "value",
            "graphMode": "none", "textMode": "auto", **options}
    return Panel("stat", title, [target], width, 4, unit, options=opts)


def table(title: str, target: Target, columns: dict[str, str], width: int = 8) -> Panel:
    """An instant table; `columns` renames the kept fields, every other field is hidden."""
    organize = {"id": "organize", "options": {"renameByName": columns, "includeByName": dict.fromkeys(columns, True)}}
    return Panel("table", title, [target], width, 8, transformations=[organize])


def band_overrides() -> list[dict[str, Any]]:
    return [{"matcher": {"id": "byName", "options": b},
             "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": BAND_COLORS[b]}}]}
            for b in BANDS]


def band_mappings() -> list[dict[str, Any]]:
    return [{"type": "value", "options": {str(i): {"text": b, "color": BAND_COLORS[b], "index": i}
                                          for i, b in enumerate(BANDS)}}]


def overview_rows() -> list[Row]:
    now = Row("Now", [
        Panel("stat", "Governor band", [Target(f"{m('gmlx_governor_band')} == 1", "{{band}}")], 4, 4,
              options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                       "textMode": "name", "colorMode": "background", "graphMode": "none"},
              overrides=band_overrides(), description="The memory governor's band on each server."),
        stat("Decode tok/s", Target(f"sum({m('gmlx_rates_decode_tok_s')})")),
        stat("Decoding", Target(f"sum({m('gmlx_concurrency_in_flight')})")),
        stat("Waiting", Target(f"sum({m('gmlx_queue_waiting')})")),
        stat("Drain estimate", Target(f"max({m('gmlx_queue_eta_s')})"), unit="s"),
        stat("Memory headroom", Target(f"min({m('gmlx_memory_headroom_bytes')})"), unit="bytes"),
    ])
    throughput = Row("Throughput", [
        series("Decode tok/s now and recent means",
               Target(m("gmlx_rates_decode_tok_s"), "now {{instance}}"),
               Target(m("gmlx_rates_decode_tok_s_recent"), "recent mean {{instance}}"),
               Target(m("gmlx_rates_decode_tok_s_lifetime"), "lifetime mean {{instance}}")),
        series("Tokens/s by model",
               Target(rate("gmlx_generated_tokens_total", "model", model=True), "{{model}} generated"),
               Target(rate("gmlx_prompt_tokens_total", "model", model=True), "{{model}} prompt")),
        series("Prefill tok/s (mean of the last 8 requests)",
               Target(m("gmlx_rates_prefill_tok_s_recent"), "{{instance}}")),
        series("Requests finished/s by reason",
               Target(rate("gmlx_requests_finished_total", "finish_reason", model=True), "{{finish_reason}}"),
               unit="reqps", width=12),
        series("Decode streams", Target(m("gmlx_rates_decode_streams"), "{{instance}}"), width=12),
    ])
    latency = Row("Latency", [
        series("Time to first token", *[Target(quantile(q, "gmlx_time_to_first_token_seconds"), f"p{int(q * 100)}")
                                         for q in (0.5, 0.9, 0.99)],
               Target(f"sum(rate({m('gmlx_time_to_first_token_seconds_sum')}{RATE})) / "
                      f"sum(rate({m('gmlx_time_to_first_token_seconds_count')}{RATE}))", "mean"),
               unit="s", width=12),
        series("Request duration", *[Target(quantile(q, "gmlx_request_duration_seconds"), f"p{int(q * 100)}")
                                      for q in (0.5, 0.9, 0.99)],
               Target(f"sum(rate({m('gmlx_request_duration_seconds_count')}{RATE}))", "finished/s"),
               unit="s", width=12),
    ])
    queue = Row("Queue and admission", [
        series("Queue and decode slots",
               Target(m("gmlx_queue_waiting"), "waiting"), Target(m("gmlx_queue_cap"), "queue cap"),
               Target(m("gmlx_concurrency_in_flight"), "decoding"),
               Target(m("gmlx_concurrency_decode_batch"), "decode width")),
        series("Live requests by state", Target(f"sum by (state) ({m('gmlx_requests')})", "{{state}}"), stack=True),
        series("Rejections/s", Target(rate("gmlx_admission_rejections_total", "reason"), "{{reason}}"),
               Target(rate("gmlx_queue_rejections_total"), "queue cap (all)"), unit="reqps",
               description="503 server_overloaded answers, by admission reason."),
        series("Drain estimate (Retry-After now)", Target(m("gmlx_queue_eta_s"), "{{instance}}"), unit="s",
               width=24),
    ])
    governor = Row("Governor and memory", [
        Panel("state-timeline", "Governor band", [Target(band_index(), "{{instance}}")], 12,
              defaults={"mappings": band_mappings(), "color": {"mode": "thresholds"}}),
        series("Sheds and band changes",
               Target(f"sum(increase({m('gmlx_governor_sheds_total')}{RATE}))", "sheds"),
               Target(f"sum by (band) (increase({m('gmlx_governor_band_changes_total')}{RATE}))", "entered {{band}}"),
               width=12),
        series("Memory", *[Target(m(f"gmlx_memory_{f}_bytes"), f) for f in
                           ("active", "cache", "headroom", "rss", "budget")], unit="bytes", width=24),
    ])
    capacity = Row("Capacity (boot table)", [
        table("Max context per stream by width", Target(m("gmlx_capacity_max_ctx"), instant=True),
              {"model": "model", "width": "streams", "Value": "max ctx"}),
        table("Max streams at a depth", Target(m("gmlx_capacity_max_width_at_depth"), instant=True),
              {"model": "model", "depth": "tokens each", "Value": "max streams"}),
        series("Capacity budget", Target(m("gmlx_capacity_budget_bytes"), "budget"),
               Target(m("gmlx_capacity_weights_bytes"), "weights"),
               Target(m("gmlx_capacity_prefill_transient_bytes"), "prefill transient"), unit="bytes"),
    ])
    return [now, throughput, latency, queue, governor, capacity, prompt_cache_row()]


def prompt_cache_row() -> Row:
    return Row("Prompt cache", [
        series("Prompt cache lookups/s by tier",
               Target(rate("gmlx_prompt_cache_hits_total", "tier", model=True), "{{tier}}"),
               Target(rate("gmlx_prompt_cache_misses_total", model=True), "miss"), unit="reqps", stack=True,
               description="Requests whose prompt prefix the cache served, by tier (exact, block, ckpt, anchor)."),
        series("Prompt tokens reused vs prefilled",
               Target(rate("gmlx_prompt_cache_tokens_reused_total", "model", model=True), "{{model}} reused"),
               Target(rate("gmlx_prompt_tokens_total", "model", model=True), "{{model}} prompt")),
        series("Prompt cache memory",
               Target(f"sum by (model) ({m('gmlx_prompt_cache_bytes', model=True)})", "{{model}} held"),
               Target(f"sum by (model) ({m('gmlx_prompt_cache_pinned_bytes', model=True)})", "{{model}} pinned"),
               Target(f"sum by (model) ({m('gmlx_prompt_cache_max_bytes', model=True)})", "{{model}} bound"),
               unit="bytes"),
        series("Prompt cache entries", Target(f"sum by (model) ({m('gmlx_prompt_cache_entries', model=True)})",
                                              "{{model}}"), width=12),
        series("Prompt cache evictions/s",
               Target(rate("gmlx_prompt_cache_evictions_total", "model", model=True), "{{model}} evicted"),
               Target(rate("gmlx_prompt_cache_rejected_total", "model", model=True), "{{model}} not stored"),
               width=12, description="Entries evicted to stay within server.prompt_cache_bytes, and snapshots "
                                     "too large to store."),
    ])


def model_rows() -> list[Row]:
    return [Row("$model", [
        series("Decoding and waiting",
               Target(m("gmlx_resident_models_in_flight", model=True), "decoding"),
               Target(m("gmlx_resident_models_waiting", model=True), "waiting"),
               Target(m("gmlx_resident_models_decode_batch", model=True), "decode width")),
        series("Tokens/s",
               Target(rate("gmlx_generated_tokens_total", "model", model=True), "generated"),
               Target(rate("gmlx_prompt_tokens_total", "model", model=True), "prompt")),
        series("Finished/s by reason",
               Target(rate("gmlx_requests_finished_total", "finish_reason", model=True), "{{finish_reason}}"),
               unit="reqps"),
        series("Model memory",
               Target(m("gmlx_resident_models_weights_bytes", model=True), "weights"),
               Target(m("gmlx_resident_models_active_bytes", model=True), "active"), unit="bytes", width=16),
        stat("Load time", Target(f"max({m('gmlx_resident_models_load_s', model=True)})"), unit="s", width=8),
        series("Prompt cache lookups/s by tier",
               Target(rate("gmlx_prompt_cache_hits_total", "tier", model=True), "{{tier}}"),
               Target(rate("gmlx_prompt_cache_misses_total", model=True), "miss"), unit="reqps", stack=True),
        series("Prompt cache memory", Target(m("gmlx_prompt_cache_bytes", model=True), "held"),
               Target(m("gmlx_prompt_cache_max_bytes", model=True), "bound"), unit="bytes"),
        series("Prompt cache reuse",
               Target(rate("gmlx_prompt_cache_tokens_reused_total", model=True), "tokens reused/s"),
               Target(rate("gmlx_prompt_cache_evictions_total", model=True), "evictions/s")),
    ], repeat="model")]


def _variable(name: str, label: str, query: str, multi: bool) -> dict[str, Any]:
    return {"name": name, "label": label, "type": "query", "datasource": DS, "definition": query,
            "query": {"query": query, "refId": f"{name}-values"}, "refresh": 2, "sort": 1,
            "includeAll": True, "allValue": ".*", "multi": multi, "current": {}, "hide": 0}


def _panel_json(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": pid, "type": p.kind, "title": p.title, "description": p.description, "datasource": DS,
        "gridPos": {"h": p.height, "w": p.width, "x": x, "y": y},
        "targets": [t.json(chr(ord("A") + i)) for i, t in enumerate(p.targets)],
        "fieldConfig": {"defaults": {"unit": p.unit, **p.defaults}, "overrides": p.overrides},
        "options": p.options or {"legend": {"displayMode": "list", "placement": "bottom"},
                                 "tooltip": {"mode": "multi"}},
    }
    if p.transformations:
        out["transformations"] = p.transformations
    return out


def _layout(rows: list[Row]) -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = []
    y = 0
    for row in rows:
        panels.append({"id": len(panels) + 1, "type": "row", "title": row.title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": [],
                       **({"repeat": row.repeat} if row.repeat else {})})
        y, x, line = y + 1, 0, 0
        for p in row.panels:
            if x + p.width > 24:
                y, x, line = y + line, 0, 0
            panels.append(_panel_json(p, len(panels) + 1, x, y))
            x, line = x + p.width, max(line, p.height)
        y += line
    return panels


def dashboard(uid: str, title: str, description: str, rows: list[Row]) -> dict[str, Any]:
    return {
        "uid": uid, "title": title, "description": description, "tags": ["gmlx"], "editable": True,
        "schemaVersion": 39, "version": 1, "refresh": "10s", "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser", "graphTooltip": 1, "annotations": {"list": []},
        "links": [{"type": "dashboards", "tags": ["gmlx"], "asDropdown": False, "title": "gmlx"}],
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0, "refresh": 1},
            _variable("instance", "Server", "label_values(gmlx_concurrency_decode_batch, instance)", True),
            _variable("model", "Model", "label_values(gmlx_resident_models_in_flight, model)", True),
        ]},
        "panels": _layout(rows),
    }


def dashboards() -> dict[str, dict[str, Any]]:
    return {
        "gmlx-overview.json": dashboard(
            "gmlx-overview", "gmlx overview",
            "Throughput, latency, queue and admission, the memory governor, memory, the boot capacity table and "
            "the prompt cache.",
            overview_rows()),
        "gmlx-models.json": dashboard(
            "gmlx-models", "gmlx models", "One row per resident model (repeated over the model variable).",
            model_rows()),
    }


def render(board: dict[str, Any]) -> str:
    return json.dumps(board, indent=2, sort_keys=False) + "\n"


def main(argv: list[str]) -> int:
    stale = []
    for name, board in dashboards().items():
        path, text = OUT / name, render(board)
        if "--check" in argv:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            OUT.mkdir(exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run: python grafana/generate.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
