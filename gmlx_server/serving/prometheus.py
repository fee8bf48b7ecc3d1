"""Prometheus text rendering of the metrics snapshot, through a custom collector read at scrape time.

Snapshot sections flatten to `gmlx_<section>_<field>` gauges; requests[] is high-cardinality and
contributes only counts by state. Counters and histograms in base units come from telemetry, and
`gmlx_prompt_cache_*` per model from the engines' prompt caches (what /v1/cache/stats reports);
`gmlx_speculative_*` per model from telemetry. Three `vllm:*` gauges per resident model are what LLM-aware
routers read (docs/operations.md, "Router gauges").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from gmlx_server.engine.types import SpeculativeStats
from gmlx_server.serving.governor import BANDS
from gmlx_server.serving.telemetry import Histogram, Telemetry

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_FLAT = ("concurrency", "queue", "memory", "rates")
_COUNTERS = {"rejections"}  # snapshot fields that are counts since start
CacheStats = Callable[[], Mapping[str, Mapping[str, Any]]]  # model -> its prompt cache's counters
_CACHE_COUNTERS = {"misses": "prompt cache lookups that found nothing",
                   "tokens_reused": "prompt tokens restored from the prompt cache instead of prefilled",
                   "evictions": "prompt cache entries evicted to stay within the bound",
                   "rejected": "snapshots not stored: larger than what eviction could free"}
_CACHE_GAUGES = {"entries": "prompt cache entries", "bytes": "prompt cache bytes held",
                 "max_bytes": "prompt cache bound", "pinned_bytes": "bytes of pinned (anchor) entries"}

_DISK_COUNTERS = {"hits": "prompt cache lookups the disk tier answered", "misses": "disk tier lookups that found "
                  "nothing restorable", "restored_tokens": "prompt tokens restored from the disk tier",
                  "restore_seconds": "seconds disk tier restores took (the read and the copy)",
                  "writes": "snapshots written to the disk tier",
                  "writes_dropped": "snapshots not written: the writer was behind, or one was over the cap",
                  "skipped_slower_than_prefill": "disk hits skipped: prefilling the tokens was faster",
                  "removed_bad": "unreadable disk tier files removed"}
_DISK_GAUGES = {"entries": "this model's disk tier files", "bytes": "this model's disk tier bytes"}


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _flat_sections(server: Mapping[str, Any]) -> Iterator[Metric]:
    for section in _FLAT:
        for key, value in (server.get(section) or {}).items():
            v = _num(value)
            if v is None:
                continue
            if key in _COUNTERS:
                yield CounterMetricFamily(f"gmlx_{section}_{key}", f"{section}.{key} of /v1/metrics", value=v)
            else:
                yield GaugeMetricFamily(f"gmlx_{section}_{key}", f"{section}.{key} of /v1/metrics", value=v)


def _governor(server: Mapping[str, Any]) -> Iterator[Metric]:
    gov = server.get("governor") or {}
    band = GaugeMetricFamily("gmlx_governor_band", "1 for the current memory band", labels=["band"])
    for b in BANDS:
        band.add_metric([b], 1.0 if gov.get("band") == b else 0.0)
    yield band
    changes = CounterMetricFamily("gmlx_governor_band_changes", "times each band was entered", labels=["band"])
    for b, n in (gov.get("band_changes") or {}).items():
        changes.add_metric([b], float(n))
    yield changes
    if _num(gov.get("sheds")) is not None:
        yield CounterMetricFamily("gmlx_governor_sheds", "requests shed by the governor", value=gov["sheds"])


def _requests(server: Mapping[str, Any]) -> Iterator[Metric]:
    g = GaugeMetricFamily("gmlx_requests", "live requests by state (requests[] as a count)", labels=["state"])
    rows = server.get("requests") or []
    for state in ("queued", "prefill", "decode"):
        g.add_metric([state], float(sum(1 for r in rows if r.get("state") == state)))
    yield g
    prefilling = [r for r in rows if r.get("state") == "prefill"]
    left = sum(max(0, (r.get("prompt_tokens") or 0) - (r.get("position") or 0)) for r in prefilling)
    yield GaugeMetricFamily("gmlx_prefill_tokens_in_flight", "prompt tokens still to prefill of the requests "
                            "prefilling now (a long agent prompt shows here before its first token)", value=left)


def _resident(server: Mapping[str, Any]) -> Iterator[Metric]:
    fields = ("in_flight", "waiting", "decode_batch", "weights_bytes", "active_bytes", "load_s")
    families = {f: GaugeMetricFamily(f"gmlx_resident_models_{f}", f"resident model {f}", labels=["model", "profile"])
                for f in fields}
    for row in server.get("resident_models") or []:
        for f in fields:
            v = _num(row.get(f))
            if v is not None:
                families[f].add_metric([row["id"], row.get("profile") or ""], v)
    yield from families.values()


# The Gateway API Inference Extension's model-server protocol, under vLLM's names and its `model_name` label.
_ROUTER = (("vllm:num_requests_waiting", "waiting", "requests queued for a decode slot of this model"),
           ("vllm:num_requests_running", "in_flight", "requests holding a decode slot of this model"),
           ("vllm:kv_cache_usage_perc", "kv_cache_usage", "share of this model's KV budget (decode slots x "
                                                         "context) held by its live requests now, 0..1"))


def _router(server: Mapping[str, Any]) -> Iterator[Metric]:
    for name, field, doc in _ROUTER:
        family = GaugeMetricFamily(name, doc, labels=["model_name"])
        for row in server.get("resident_models") or []:
            v = _num(row.get(field))
            if v is not None:
                family.add_metric([row["id"]], v)
        yield family


def _capacity(server: Mapping[str, Any]) -> Iterator[Metric]:
    cap = server.get("capacity")
    if not isinstance(cap, Mapping):
        return
    model = str(cap.get("model", ""))
    max_ctx = GaugeMetricFamily("gmlx_capacity_max_ctx", "max context per stream at a width", labels=["model", "width"])
    for width, n in (cap.get("max_ctx") or {}).items():
        max_ctx.add_metric([model, str(width)], float(n))
    yield max_ctx
    at = GaugeMetricFamily("gmlx_capacity_max_width_at_depth", "max streams at a depth", labels=["model", "depth"])
    for depth, n in (cap.get("max_width_at_depth") or {}).items():
        at.add_metric([model, str(depth)], float(n))
    yield at
    for key, value in cap.items():
        if key.endswith("_bytes") and _num(value) is not None:
            yield GaugeMetricFamily(f"gmlx_capacity_{key}", f"capacity table {key}", value=float(value))


def _histogram(name: str, doc: str, h: Histogram) -> Metric:
    buckets = [("+Inf" if b == float("inf") else repr(b), float(n)) for b, n in h.cumulative()]
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=h.total)


def _telemetry(t: Telemetry) -> Iterator[Metric]:
    yield _histogram("gmlx_time_to_first_token_seconds", "time to first token", t.ttft)
    yield _histogram("gmlx_request_duration_seconds", "end-to-end request latency", t.latency)
    prompt = CounterMetricFamily("gmlx_prompt_tokens", "prompt tokens processed", labels=["model"])
    gen = CounterMetricFamily("gmlx_generated_tokens", "tokens generated", labels=["model"])
    thought = CounterMetricFamily("gmlx_reasoning_tokens", "tokens generated inside thinking blocks (of "
                                  "gmlx_generated_tokens)", labels=["model"])
    done = CounterMetricFamily("gmlx_requests_finished", "finished requests", labels=["model", "finish_reason"])
    for m, r in t.models.items():
        prompt.add_metric([m], float(r.prompt_tokens))
        gen.add_metric([m], float(r.generated_tokens))
        thought.add_metric([m], float(r.reasoning_tokens))
        for reason, n in r.finished.items():
            done.add_metric([m, reason], float(n))
    yield from (prompt, gen, thought, done)
    yield from _speculative(t)
    tools = CounterMetricFamily("gmlx_tool_calls", "tool calls by outcome: parsed, constrained (parsed from "
                                "grammar-constrained output), failed (opened but did not parse)",
                                labels=["model", "outcome"])
    for m, r in t.models.items():
        for outcome in ("parsed", "constrained", "failed"):  # zeros too: a series exists from the first request
            tools.add_metric([m, outcome], float(r.tool_calls.get(outcome, 0)))
    yield tools
    rej = CounterMetricFamily("gmlx_admission_rejections", "requests refused by admission", labels=["reason"])
    for reason, n in t.rejections.items():
        rej.add_metric([reason], float(n))
    ignored = CounterMetricFamily("gmlx_ignored_fields", "requests that set a field gmlx ignores, by field "
                                  "(the warning is logged once an hour per client and field set)", labels=["field"])
    for name, n in t.ignored_fields.items():
        ignored.add_metric([name], float(n))
    yield from (rej, ignored)
    yield from _keys(t)


def _keys(t: Telemetry) -> Iterator[Metric]:
    """Per configured key name (`anonymous`: no key): requests by status, refusals, tokens."""
    families = (("gmlx_key_requests", "requests by API key name and HTTP status", t.keys.requests, "status"),
                ("gmlx_key_rejections", "requests answered 4xx/5xx, by API key name and status", t.keys.refused(),
                 "status"),
                ("gmlx_key_tokens", "prompt and generated tokens by API key name", t.keys.tokens, "kind"))
    for name, doc, counts, label in families:
        family = CounterMetricFamily(name, doc, labels=["key", label])
        for (key, value), n in sorted(counts.items()):
            family.add_metric([key, value], float(n))
        yield family


def _speculative(t: Telemetry) -> Iterator[Metric]:
    """Per model, its finished requests' speculative rounds and drafted and accepted tokens (0 for a model
    without a drafter); the accept rate is rate(accepted) / rate(drafted)."""
    families = {name: CounterMetricFamily(f"gmlx_speculative_{name}", doc, labels=["model"]) for name, doc in (
        ("rounds", "speculative rounds run (draft, then verify in one target pass)"),
        ("drafted_tokens", "tokens the drafter proposed"),
        ("accepted_tokens", "drafted tokens the target kept"))}
    for m, r in t.models.items():
        s = r.speculative or SpeculativeStats()
        for family, value in zip(families.values(), (s.rounds, s.drafted, s.accepted), strict=True):
            family.add_metric([m], float(value))
    yield from families.values()


def _prompt_cache(caches: Mapping[str, Mapping[str, Any]]) -> Iterator[Metric]:
    hits = CounterMetricFamily("gmlx_prompt_cache_hits", "prompt cache hits by tier", labels=["model", "tier"])
    families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
    for kind, docs in ((CounterMetricFamily, _CACHE_COUNTERS), (GaugeMetricFamily, _CACHE_GAUGES)):
        families.update({k: kind(f"gmlx_prompt_cache_{k}", doc, labels=["model"]) for k, doc in docs.items()})
    disk: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
    for kind, docs in ((CounterMetricFamily, _DISK_COUNTERS), (GaugeMetricFamily, _DISK_GAUGES)):
        disk.update({k: kind(f"gmlx_prompt_cache_disk_{k}", doc, labels=["model"]) for k, doc in docs.items()})
    for model, stats in caches.items():
        for tier, n in (stats.get("hits") or {}).items():
            hits.add_metric([model, tier], float(n))
        _add(families, model, stats)
        _add(disk, model, stats.get("disk") or {})
    yield from (hits, *families.values(), *disk.values())


def _add(families: Mapping[str, CounterMetricFamily | GaugeMetricFamily], model: str,
         stats: Mapping[str, Any]) -> None:
    for k, family in families.items():
        v = _num(stats.get(k))
        if v is not None:
            family.add_metric([model], v)


_SERVICE_COUNTERS = {"requests": "service requests admitted or refused", "errors": "service requests that failed",
                     "rejections": "service requests refused at the concurrency cap",
                     "bytes_in": "request bytes received by a service", "bytes_out": "response bytes a service sent"}


def _services(server: Mapping[str, Any]) -> Iterator[Metric]:
    """Per service (embeddings, rerank, stt, tts): counters, in-flight, state and the latency histogram."""
    rows = server.get("services")
    if not isinstance(rows, Mapping) or not rows:
        return  # no service configured: no families
    labels = ["service", "model"]
    counters = {k: CounterMetricFamily(f"gmlx_service_{k}", doc, labels=labels) for k, doc in _SERVICE_COUNTERS.items()}
    in_flight = GaugeMetricFamily("gmlx_service_in_flight", "service requests in flight", labels=labels)
    ready = GaugeMetricFamily("gmlx_service_ready", "1 when the service's model is loaded", labels=[*labels, "state"])
    latency = HistogramMetricFamily("gmlx_service_latency_seconds", "service request latency", labels=labels)
    for kind, row in rows.items():
        names = [str(kind), str(row.get("id", kind))]
        for k, family in counters.items():
            family.add_metric(names, float(row.get(k) or 0))
        in_flight.add_metric(names, float(row.get("in_flight") or 0))
        ready.add_metric([*names, str(row.get("state"))], 1.0 if row.get("state") == "ready" else 0.0)
        buckets = [(str(b) if b == "+Inf" else repr(float(b)), float(n)) for b, n in row.get("latency_buckets") or []]
        if buckets:
            latency.add_metric(names, buckets, float(row.get("latency_s_sum") or 0.0))
    yield from (*counters.values(), in_flight, ready, latency)


def _assistants(server: Mapping[str, Any]) -> Iterator[Metric]:
    """Per assistant: its tool calls by tool and outcome with their latency, its MCP servers, its live loops."""
    rows = server.get("assistants")
    if not isinstance(rows, Mapping) or not rows:
        return  # no assistant configured: no families
    tool, link = ["assistant", "tool"], ["assistant", "server"]
    calls = CounterMetricFamily("gmlx_assistant_tool_calls", f"tool calls an assistant ran, by outcome "
                                f"({', '.join(_TOOL_OUTCOMES)})", labels=[*tool, "outcome"])
    latency = HistogramMetricFamily("gmlx_assistant_tool_call_seconds", "one tool call, sent to result", labels=tool)
    up = GaugeMetricFamily("gmlx_assistant_mcp_up", "1 while the MCP server is connected", labels=link)
    restarts = CounterMetricFamily("gmlx_assistant_mcp_restarts", "times the MCP server was started again", labels=link)
    loops = GaugeMetricFamily("gmlx_assistant_loops", "requests in the assistant's tool loop now", labels=["assistant"])
    for aid, row in rows.items():
        for name, stats in (row.get("tools") or {}).items():
            for outcome in _TOOL_OUTCOMES:  # zeros too: every allowed tool has its series from the start
                calls.add_metric([aid, name, outcome], float((stats.get("outcomes") or {}).get(outcome, 0)))
            buckets = [(str(b) if b == "+Inf" else repr(float(b)), float(n)) for b, n in stats["latency_buckets"]]
            latency.add_metric([aid, name], buckets, float(stats.get("latency_s_sum") or 0.0))
        for name, state in (row.get("servers") or {}).items():
            up.add_metric([aid, name], 1.0 if state.get("state") == "ready" else 0.0)
            restarts.add_metric([aid, name], float(state.get("restarts") or 0))
        loops.add_metric([aid], float(len(row.get("active") or [])))
    yield from (calls, latency, up, restarts, loops)


_TOOL_OUTCOMES = ("ok", "tool_error", "tool_timeout", "tool_unavailable", "tool_not_allowed")


class SnapshotCollector(Collector):
    def __init__(self, snapshot: Callable[[], Mapping[str, Any]], telemetry: Telemetry,
                 caches: CacheStats | None = None) -> None:
        self._snapshot, self._telemetry, self._caches = snapshot, telemetry, caches

    def collect(self) -> Iterator[Metric]:
        server = self._snapshot().get("server", {})
        for part in (_flat_sections, _governor, _requests, _resident, _router, _capacity, _services, _assistants):
            yield from part(server)
        yield from _telemetry(self._telemetry)
        yield from _prompt_cache(self._caches() if self._caches is not None else {})


def make_registry(snapshot: Callable[[], Mapping[str, Any]], telemetry: Telemetry,
                  caches: CacheStats | None = None) -> CollectorRegistry:
    """A registry of our own (no process-global default registry)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot, telemetry, caches))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
