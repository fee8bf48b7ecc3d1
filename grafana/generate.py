"""Generate the Grafana dashboards in grafana/dashboards/ with grafana-foundation-sdk's typed builders.

    .venv/bin/python grafana/generate.py          # rewrite the JSON files
    .venv/bin/python grafana/generate.py --check  # exit 1 when the committed JSON is stale

Every query filters on the `instance` variable (one Prometheus, several gmlx servers: each target's
host:port) and per-model queries on `model`. The overview's Now row sums over the selected servers (the
fleet's totals) and its Fleet row draws one series per host beside the total. The panels' PromQL is run
against a real Prometheus scraping two real `gmlx serve` hosts by tests/e2e/test_prometheus.py.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

from grafana_foundation_sdk.builders import common, dashboard, prometheus, statetimeline, timeseries
from grafana_foundation_sdk.builders import stat as stat_panel
from grafana_foundation_sdk.builders import table as table_panel
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.variants import Dataquery
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

OUT = Path(__file__).resolve().parent / "dashboards"
DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
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


def Target(expr: str, legend: str = "", instant: bool = False) -> prometheus.Dataquery:
    q = prometheus.Dataquery().datasource(DS).expr(expr).legend_format(legend)
    return q.instant().format(PromQueryFormat.TABLE) if instant else q.range()


class _Panel(Protocol):
    """The setters every panel builder has (the SDK gives each panel type its own class)."""

    def with_target(self, target: Builder[Dataquery]) -> Self: ...
    def title(self, title: str) -> Self: ...
    def description(self, description: str) -> Self: ...
    def datasource(self, datasource: dm.DataSourceRef) -> Self: ...
    def span(self, w: int) -> Self: ...
    def height(self, h: int) -> Self: ...
    def unit(self, unit: str) -> Self: ...


P = TypeVar("P", bound=_Panel)
L = TypeVar("L", timeseries.Panel, statetimeline.Panel)
PanelBuilder = timeseries.Panel | stat_panel.Panel | table_panel.Panel | statetimeline.Panel


@dataclass
class Row:
    title: str
    panels: list[PanelBuilder]
    repeat: str | None = None


def _panel(p: P, title: str, targets: tuple[prometheus.Dataquery, ...], width: int, height: int, unit: str = "short",
           description: str = "") -> P:
    for i, t in enumerate(targets):
        p = p.with_target(t.ref_id(chr(ord("A") + i)))
    return p.title(title).description(description).datasource(DS).span(width).height(height).unit(unit)


def _legend_and_tooltip(p: L) -> L:
    """A bottom list legend and a shared tooltip; said in full, as the SDK's defaults hide the legend and sort
    the tooltip, unlike Grafana's."""
    legend = common.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST).placement(cm.LegendPlacement.BOTTOM)
    tooltip = common.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.NONE)
    return p.legend(legend.show_legend(True)).tooltip(tooltip)


def series(title: str, *targets: prometheus.Dataquery, unit: str = "short", width: int = 8, stack: bool = False,
           description: str = "") -> timeseries.Panel:
    mode = cm.StackingMode.NORMAL if stack else cm.StackingMode.NONE
    return _legend_and_tooltip(_panel(timeseries.Panel(), title, targets, width, 8, unit, description)
                               .stacking(common.StackingConfig().mode(mode)).fill_opacity(20 if stack else 8))


def stat(title: str, target: prometheus.Dataquery, unit: str = "short", width: int = 4,
         text_mode: cm.BigValueTextMode = cm.BigValueTextMode.AUTO,
         color_mode: cm.BigValueColorMode = cm.BigValueColorMode.VALUE, description: str = "") -> stat_panel.Panel:
    return (_panel(stat_panel.Panel(), title, (target,), width, 4, unit, description)
            .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
            .color_mode(color_mode).graph_mode(cm.BigValueGraphMode.NONE).text_mode(text_mode))


def table(title: str, target: prometheus.Dataquery, columns: dict[str, str], width: int = 8) -> table_panel.Panel:
    """An instant table; `columns` renames the kept fields, every other field is hidden."""
    organize = dm.DataTransformerConfig(id_val="organize", options={
        "renameByName": columns, "includeByName": dict.fromkeys(columns, True)})
    return _panel(table_panel.Panel(), title, (target,), width, 8).with_transformation(organize)


def band_colors(p: stat_panel.Panel) -> stat_panel.Panel:
    for b in BANDS:
        p = p.override_by_name(b, [dm.DynamicConfigValue(id_val="color", value={
            "mode": "fixed", "fixedColor": BAND_COLORS[b]})])
    return p


def band_timeline(title: str, target: prometheus.Dataquery, width: int) -> statetimeline.Panel:
    mapping = dm.ValueMap(options={str(i): dm.ValueMappingResult(text=b, color=BAND_COLORS[b], index=i)
                                   for i, b in enumerate(BANDS)})
    return _legend_and_tooltip(_panel(statetimeline.Panel(), title, (target,), width, 8).mappings([mapping])
                               .color_scheme(dashboard.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS)))


def overview_rows() -> list[Row]:
    now = Row("Now", [
        band_colors(stat("Governor band", Target(f"{m('gmlx_governor_band')} == 1", "{{band}}"),
                        text_mode=cm.BigValueTextMode.NAME, color_mode=cm.BigValueColorMode.BACKGROUND,
                        description="The memory governor's band on each server.")),
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
               Target(rate("gmlx_reasoning_tokens_total", "model", model=True), "{{model}} reasoning"),
               Target(rate("gmlx_prompt_tokens_total", "model", model=True), "{{model}} prompt")),
        series("Prefill and restore tok/s (last 8 requests)",
               Target(m("gmlx_rates_prefill_tok_s_recent"), "prefill {{instance}}"),
               Target(m("gmlx_rates_restore_tok_s_recent"), "restore {{instance}}"),
               description="Prefill: prompt tokens run through the model over their compute seconds (a cache "
                           "hit's reused tokens are not prefill). Restore: tokens a cache hit brought back."),
        series("Requests finished/s by reason",
               Target(rate("gmlx_requests_finished_total", "finish_reason", model=True), "{{finish_reason}}"),
               unit="reqps", width=12),
        series("Decode streams", Target(m("gmlx_rates_decode_streams"), "{{instance}}"), width=12),
        series("Prefill tokens in flight", Target(m("gmlx_prefill_tokens_in_flight"), "{{instance}}"),
               unit="short", width=24, description="Prompt tokens still to prefill of the requests prefilling now: an "
                                         "agent's long first prompt shows here before its first token."),
        series("Tool calls/s by outcome",
               Target(rate("gmlx_tool_calls_total", "outcome", model=True), "{{outcome}}"), width=24,
               description="Calls parsed from replies; constrained: of those, decoded under a call grammar; "
                           "failed: calls opened that did not parse (returned as text)."),
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
        band_timeline("Governor band", Target(band_index(), "{{instance}}"), 12),
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
    return [now, fleet_row(), throughput, latency, queue, governor, capacity, prompt_cache_row(), services_row(),
            speculative_row(), assistants_row(), keys_row()]


def fleet_row() -> Row:
    """Several hosts behind a balancer (deploy/haproxy): one series per host (`instance`) and the fleet's total."""
    def per_host(name: str) -> str:
        return f"sum by (instance) ({m(name)})"

    return Row("Fleet (one series per host, and the total)", [
        stat("Hosts reporting", Target(f"count({m('gmlx_concurrency_decode_batch')})"),
             description="gmlx servers this Prometheus scrapes (the Server variable's selection)."),
        stat("Fleet decode slots", Target(f"sum({m('gmlx_concurrency_decode_batch')})")),
        stat("Fleet queue cap", Target(f"sum({m('gmlx_queue_cap')})"),
             description="Requests the fleet queues before every host refuses: slots + queue caps is what it "
                         "takes at once (gmlx plan --hosts)."),
        stat("Fleet rejections/s", Target(rate("gmlx_queue_rejections_total")), unit="reqps"),
        stat("Busiest host's drain", Target(f"max({m('gmlx_queue_eta_s')})"), unit="s"),
        stat("Least headroom", Target(f"min({m('gmlx_memory_headroom_bytes')})"), unit="bytes"),
        series("Decode tok/s per host", Target(per_host("gmlx_rates_decode_tok_s"), "{{instance}}"),
               Target(f"sum({m('gmlx_rates_decode_tok_s')})", "fleet")),
        series("Decoding and waiting per host", Target(per_host("gmlx_concurrency_in_flight"), "{{instance}} decoding"),
               Target(per_host("gmlx_queue_waiting"), "{{instance}} waiting")),
        series("Requests finished/s per host", Target(rate("gmlx_requests_finished_total", "instance"), "{{instance}}"),
               Target(rate("gmlx_requests_finished_total"), "fleet"), unit="reqps",
               description="How evenly the balancer spreads the work."),
        series("Time to first token p90 per host",
               Target(f"histogram_quantile(0.9, sum by (le, instance) "
                      f"(rate({m('gmlx_time_to_first_token_seconds_bucket')}{RATE})))", "{{instance}}"),
               unit="s", width=12),
        series("Rejections/s per host", Target(rate("gmlx_queue_rejections_total", "instance"), "{{instance}}"),
               unit="reqps", width=12, description="503s a host answered; the balancer retries them on another "
                                                   "host, so a client sees one only when every host refused."),
    ])


def services_row() -> Row:
    """Embeddings, rerank and speech (gmlx_service_*): requests, latency and errors per service."""
    def by_service(name: str) -> str:
        return f"sum by (service) ({m(name)})"

    latency = [Target(f"histogram_quantile({q}, sum by (le, service) (rate({m('gmlx_service_latency_seconds_bucket')}"
                      f"{RATE})))", f"{{{{service}}}} p{int(q * 100)}") for q in (0.5, 0.9, 0.99)]
    return Row("Services (embeddings, rerank, speech)", [
        series("Service requests/s", Target(rate("gmlx_service_requests_total", "service"), "{{service}}"),
               unit="reqps", description="Requests each service admitted or refused."),
        series("Service latency", *latency, unit="s"),
        series("Service errors and rejections/s",
               Target(rate("gmlx_service_errors_total", "service"), "{{service}} failed"),
               Target(rate("gmlx_service_rejections_total", "service"), "{{service}} refused at its cap"),
               unit="reqps"),
        series("Service requests in flight", Target(by_service("gmlx_service_in_flight"), "{{service}}")),
        series("Service bytes/s", Target(rate("gmlx_service_bytes_in_total", "service"), "{{service}} in"),
               Target(rate("gmlx_service_bytes_out_total", "service"), "{{service}} out"), unit="Bps"),
        table("Service models", Target(m("gmlx_service_ready"), instant=True),
              {"instance": "server", "service": "service", "model": "model", "state": "state", "Value": "ready"}),
    ])


def assistants_row() -> Row:
    """Assistant ids (gmlx_assistant_*): the MCP tool calls the server ran, their latency, the servers' health."""
    latency = [Target(f"histogram_quantile({q}, sum by (le, assistant, tool) "
                      f"(rate({m('gmlx_assistant_tool_call_seconds_bucket')}{RATE})))",
                      f"{{{{assistant}}}}/{{{{tool}}}} p{int(q * 100)}") for q in (0.5, 0.99)]
    return Row("Assistants (MCP tools)", [
        series("Tool calls/s by outcome",
               Target(rate("gmlx_assistant_tool_calls_total", "assistant, outcome"), "{{assistant}} {{outcome}}"),
               unit="reqps", stack=True,
               description="Calls an assistant's loop ran: ok, tool_error, tool_timeout, tool_unavailable (its MCP "
                           "server down), tool_not_allowed (outside the allowlist, sent nowhere)."),
        series("Tool call latency", *latency, unit="s"),
        series("Requests in a tool loop", Target(f"sum by (assistant) ({m('gmlx_assistant_loops')})",
                                                 "{{assistant}}")),
        series("MCP servers up", Target(f"min by (assistant, server) ({m('gmlx_assistant_mcp_up')})",
                                        "{{assistant}}/{{server}}"), width=12),
        series("MCP server restarts", Target(f"sum by (assistant, server) "
                                             f"(increase({m('gmlx_assistant_mcp_restarts_total')}{RATE}))",
                                             "{{assistant}}/{{server}}"), width=12,
               description="A stdio server that died is started again after a backoff that doubles (0.5 s to 30 s)."),
    ])


def keys_row() -> Row:
    """Per API key name (gmlx_key_*; `anonymous` is no key): what each key sends, uses and is refused."""
    return Row("API keys", [
        series("Requests/s by key", Target(rate("gmlx_key_requests_total", "key"), "{{key}}"), unit="reqps",
               stack=True, description="Every request a key made (any route, any status); names only, never keys."),
        series("Refusals/s by key and status",
               Target(rate("gmlx_key_rejections_total", "key, status"), "{{key}} {{status}}"), unit="reqps",
               description="4xx and 5xx answers per key: 429 rate_limited is its fair share, 403 its scope."),
        series("Tokens/s by key", Target(rate("gmlx_key_tokens_total", "key, kind"), "{{key}} {{kind}}"),
               unit="short", stack=True, description="Prompt and generated tokens of each key's finished requests."),
        series("Ignored request fields/s", Target(rate("gmlx_ignored_fields_total", "field"), "{{field}}"),
               unit="reqps", description="Requests that set a field gmlx ignores (metadata, ...), by field."),
    ])


def accept_rate(model: bool = True) -> str:
    """Drafted tokens the target kept, as a fraction (no series while nothing drafted: 0 / 0)."""
    return (f"{rate('gmlx_speculative_accepted_tokens_total', 'model', model=model)} / "
            f"{rate('gmlx_speculative_drafted_tokens_total', 'model', model=model)}")


def speculative_panels(width: int) -> list[PanelBuilder]:
    return [
        series("Speculative accept rate", Target(accept_rate(), "{{model}}"), unit="percentunit", width=width,
               description="Drafted tokens the target kept (rate of accepted over drafted, finished requests)."),
        series("Drafted and accepted tokens/s",
               Target(rate("gmlx_speculative_drafted_tokens_total", "model", model=True), "{{model}} drafted"),
               Target(rate("gmlx_speculative_accepted_tokens_total", "model", model=True), "{{model}} accepted"),
               width=width),
        series("Tokens per speculative round",
               Target(f"1 + {rate('gmlx_speculative_accepted_tokens_total', 'model', model=True)} / "
                      f"{rate('gmlx_speculative_rounds_total', 'model', model=True)}", "{{model}}"), width=width,
               description="Each round emits its kept drafts and one token of the target's own; 1 means no gain."),
    ]


def speculative_row() -> Row:
    return Row("Speculative decoding", speculative_panels(8))


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
                                              "{{model}}"),
               Target(f"sum by (model) ({m('gmlx_prompt_cache_disk_entries', model=True)})", "{{model}} on disk"),
               width=12),
        series("Prompt cache evictions/s",
               Target(rate("gmlx_prompt_cache_evictions_total", "model", model=True), "{{model}} evicted"),
               Target(rate("gmlx_prompt_cache_rejected_total", "model", model=True), "{{model}} not stored"),
               width=12, description="Entries evicted to stay within server.prompt_cache_bytes, and snapshots "
                                     "too large to store."),
        *disk_tier_panels(),
    ])


def disk_tier_panels() -> list[timeseries.Panel]:
    """The prompt cache's disk tier (server.prompt_cache_disk_bytes): no series while it is off."""
    def disk(name: str) -> str:
        return rate(f"gmlx_prompt_cache_disk_{name}_total", "model", model=True)

    return [
        series("Disk tier lookups/s", Target(disk("hits"), "{{model}} hit"), Target(disk("misses"), "{{model}} miss"),
               Target(disk("skipped_slower_than_prefill"), "{{model}} skipped"), unit="reqps", width=6,
               description="Lookups the disk tier answered after a RAM miss, found nothing for, or skipped because "
                           "prefilling was faster than reading."),
        series("Disk tier restore pace", Target(f"{disk('restored_tokens')} / {disk('restore_seconds')}",
                                                "{{model}} tokens/s"), width=6,
               description="Prompt tokens restored from disk per second of restore (the read and the copy)."),
        series("Disk tier writes/s", Target(disk("writes"), "{{model}} written"),
               Target(disk("writes_dropped"), "{{model}} dropped"), Target(disk("removed_bad"), "{{model}} bad"),
               width=6, description="Snapshots written, dropped (writer behind, or over the cap) and unreadable "
                                    "files removed."),
        series("Disk tier bytes", Target(f"sum by (model) ({m('gmlx_prompt_cache_disk_bytes', model=True)})",
                                         "{{model}} bytes"),
               unit="bytes", width=6),
    ]


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
        *speculative_panels(8),
    ], repeat="model")]


def _variable(name: str, label: str, query: str) -> dashboard.QueryVariable:
    return (dashboard.QueryVariable(name).label(label).datasource(DS).query({"query": query, "refId": f"{name}-values"})
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
            .include_all(True).all_value(".*").multi(True))


def dashboard_json(uid: str, title: str, description: str, rows: list[Row]) -> dict[str, Any]:
    board = (dashboard.Dashboard(title).uid(uid).description(description).tags(["gmlx"]).editable().version(1)
             .refresh("10s").time("now-1h", "now").timezone("browser").tooltip(dm.DashboardCursorSync.CROSSHAIR)
             .link(dashboard.DashboardLink("gmlx").type(dm.DashboardLinkType.DASHBOARDS).tags(["gmlx"])
                   .as_dropdown(False))
             .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
             .with_variable(_variable("instance", "Server", "label_values(gmlx_concurrency_decode_batch, instance)"))
             .with_variable(_variable("model", "Model", "label_values(gmlx_resident_models_in_flight, model)")))
    pid = 0  # rows stay expanded (their panels follow them); the SDK lays panels left to right and wraps at 24
    for row in rows:
        pid += 1
        r = dashboard.Row(row.title).id(pid)
        board = board.with_row(r.repeat(row.repeat) if row.repeat else r)
        for p in row.panels:
            pid += 1
            board = board.with_panel(p.id(pid))
    out: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return out


def dashboards() -> dict[str, dict[str, Any]]:
    return {
        "gmlx-overview.json": dashboard_json(
            "gmlx-overview", "gmlx overview",
            "Throughput, latency, queue and admission, the memory governor, memory, the boot capacity table, "
            "the prompt cache and speculative decoding.",
            overview_rows()),
        "gmlx-models.json": dashboard_json(
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
