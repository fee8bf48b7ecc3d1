"""`gmlx plan [check|simulate]`: the offline capacity planner and fan-out simulator.

gmlx_server/cli.py calls add_plan_parser(sub); args.func is run_plan.

  gmlx plan --model PATH|ID [--config FILE] --width W --depth D [--memory 64GiB] [--disk-cache 8GiB]
            [--kv-quant uniform:8 | kvarn:4:8:128] [--layout auto|packed|dense|native] [--decode-batch N]
            [--draft PATH|ID|none] [--draft-tokens K]
            [--device auto|metal|cpu] [--kv-dtype auto|f16|f32] [--max-kv-size N] [--json]
  gmlx plan simulate --model ... --width W --depth D --waves K --output-tokens N --think-s T --spread-s S
            [--decode-tok-s R --prefill-tok-s P | --paces FILE | --server URL [--api-key KEY]] [--queue-cap C]
            [--shared-prefix N] [--no-prompt-cache] [--png FILE]
  Either with --hosts H: W spread over H identical hosts behind a least-connections balancer (gmlx_plan/fleet.py):
  each host's share is checked and simulated, and a "fleet" line (JSON: object) says what the fleet admits at once.

Exit status: 0 the plan fits, 1 it does not (the reason is printed), 2 an input error.
--json prints {"plan": {...}, "capacity": <the /v1/metrics capacity section>, "weights_by_type": {...}}
and, when the disk cap is > 0, "disk_tier" (gmlx_plan/disk.py; absent when it is 0).
(simulate: {"capacity", "simulation", "png"}).
Flags win over the config; the config (server.decode_batch, server.memory_budget and the model's
max_kv_size, kv_quant, kv_dtype, weights, draft, draft_tokens) wins over the defaults, so the plan matches the server's
boot table; --disk-cache defaults to server.prompt_cache_disk_bytes.
A drafter adds its weights and (unquantized) KV as the server budgets them.
--layout auto means packed on macOS; elsewhere native when gmlx's CPU kernels are built beside the server
(as its auto layout then is), else dense (the CPU server runs dense whenever OpenBLAS loads, and dense is
the larger of dense and packed, so the plan stays on the safe side).
--device auto means metal on macOS, where prefill attention runs fused for head dims 64/80/128.
--kv-dtype auto means the config's kv_dtype, whose auto is f16 on a CPU with gmlx's kernels built, else f32.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from gmlx_plan.budget import default_budget, parse_disk_cap, parse_memory
from gmlx_plan.capacity import CapacityTable, build_table, largest_width_at, max_width_at, plan, table_to_json
from gmlx_plan.disk import DiskTier, disk_tier
from gmlx_plan.fleet import FleetAdmission, shares, simulate_fleet
from gmlx_plan.geometry import GeometryError
from gmlx_plan.gguf_header import GGUFFormatError, read_header
from gmlx_plan.key_share import KeySplit, key_split
from gmlx_plan.memory import (
    DEFAULT_DRAFT_TOKENS,
    KV_DTYPE_BYTES,
    KV_DTYPE_CHOICES,
    LAYOUT_CHOICES,
    LAYOUTS,
    PREFILL_CHUNK,
    KVDtype,
    Layout,
    MemoryModel,
    UnsupportedType,
    model_from_header,
    model_with_draft,
    resolve_kv_dtype,
    weights_by_type,
)
from gmlx_plan.pace import Paces, paces_from_rates
from gmlx_plan.queueing import Rates, default_queue_cap
from gmlx_plan.report import sim_ascii, sim_png, sim_summary, sim_text, table_text
from gmlx_plan.simulate import ServerSide, Workload
from gmlx_plan.source import (
    DraftSource,
    ModelSource,
    PlanInputError,
    fetch_metrics,
    load_yaml,
    model_paces,
    paces_file,
    parse_kv_quant,
    resolve_draft,
    resolve_model,
    server_rates,
)

DEFAULT_DECODE_BATCH = 4  # the server's default (server.decode_batch)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", nargs="?", choices=("check", "simulate"), default="check",
                   help="check a plan (default) or simulate a fan-out")
    p.add_argument("--model", help="a GGUF path, or a configured id with --config")
    p.add_argument("--config", help="a gmlx YAML config (models.<id>.path and server settings)")
    p.add_argument("--width", type=int, required=True, help="streams (subagents) at once")
    p.add_argument("--depth", type=int, required=True, help="context tokens per stream")
    p.add_argument("--memory", help="memory budget (64GiB, 24G, 512MiB, bytes); default: measured available "
                                    "minus max(512 MiB, 10%%)")
    p.add_argument("--disk-cache", help="the prompt cache's disk cap (8GiB, bytes, 0: off); default: the config's "
                                        "server.prompt_cache_disk_bytes")
    p.add_argument("--kv-quant", help="none, uniform:BITS[:GROUP] or kvarn:KEY_BITS:VALUE_BITS:TAIL[:GROUP]")
    p.add_argument("--layout", choices=LAYOUT_CHOICES, help="weights layout (default auto)")
    p.add_argument("--device", choices=("auto", "metal", "cpu"), default="auto",
                   help="where the model runs (auto: metal on macOS): Metal fuses prefill attention")
    p.add_argument("--kv-dtype", choices=("auto", "f16", "f32"), default="auto",
                   help="the unquantized KV caches' dtype (auto: the config's kv_dtype, else f16 where gmlx's CPU "
                        "kernels run the attention and f32 elsewhere, as the server decides)")
    p.add_argument("--decode-batch", type=int, help=f"decode width (default {DEFAULT_DECODE_BATCH})")
    p.add_argument("--draft", help="a speculative drafter: a GGUF path, a configured id with --config, or none")
    p.add_argument("--draft-tokens", type=int, help=f"tokens drafted per round (default {DEFAULT_DRAFT_TOKENS})")
    p.add_argument("--max-kv-size", type=int, help="lower the context window")
    p.add_argument("--prefill-chunk", type=int, default=PREFILL_CHUNK, help="prefill chunk tokens")
    p.add_argument("--hosts", type=int, default=1,
                   help="identical hosts behind a least-connections balancer (deploy/haproxy): the width is split "
                        "over them, and the answer says what the fleet admits at once")
    p.add_argument("--key", help="with --config: plan for this API key's fair share (its max_concurrent and "
                                 "max_queued, else server.fair_share)")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")


def _simulation(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("simulate")
    g.add_argument("--waves", type=int, default=1)
    g.add_argument("--output-tokens", type=int, default=256)
    g.add_argument("--think-s", type=float, default=0.0, help="pause between a wave's end and the next")
    g.add_argument("--spread-s", type=float, default=0.0, help="arrivals of a wave spread over this many seconds")
    g.add_argument("--decode-tok-s", type=float, help="one stream's decode rate at width 1")
    g.add_argument("--prefill-tok-s", type=float, help="prefill rate")
    g.add_argument("--server", help="read the measured paces (and decode width, queue cap) from URL/v1/metrics")
    g.add_argument("--paces", help="read the measured paces from a JSON table {model: paces} (bench/plan_vs_real.py "
                                   "--save-paces writes one) or a saved /v1/metrics snapshot")
    g.add_argument("--shared-prefix", type=int, default=0,
                   help="leading prompt tokens every subagent shares: once one prompt is cached, later ones restore "
                        "them instead of prefilling")
    g.add_argument("--no-prompt-cache", action="store_true", help="the server runs without a prompt cache")
    g.add_argument("--api-key", help="API key for --server")
    g.add_argument("--batch-scaling", type=float, default=0.9, help="aggregate decode rate = R * width ** this")
    g.add_argument("--queue-cap", type=int, help="waiting requests before 503 (default 4x the decode width)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--max-retries", type=int, default=20, help="503 retries before a subagent gives up")
    g.add_argument("--png", help="also write a PNG plot (needs matplotlib)")


def add_plan_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "plan", help="plan capacity offline, or simulate a fan-out",
        description="Does a machine hold W streams at D tokens of this model? Reads only the GGUF header.")
    _common(p)
    _simulation(p)
    p.set_defaults(func=run_plan)
    return p


def native_kernels_built() -> bool:
    """Whether gmlx's CPU kernels were built beside the server, found by file name (nothing is imported),
    and not turned off with GMLX_NATIVE_KERNELS: then the server's auto layout on a CPU is native."""
    if os.environ.get("GMLX_NATIVE_KERNELS", "").strip().lower() in ("0", "false", "no", "off"):
        return False
    spec = importlib.util.find_spec("gmlx_server")  # locates the package without running it
    roots = spec.submodule_search_locations or [] if spec is not None else []
    return any(any((Path(root) / "engine" / "kernels").glob("_gguf_kernels*")) for root in roots)


def _layout(flag: str | None, configured: str | None) -> Layout:
    choice = flag or configured or "auto"
    if choice == "auto":
        if platform.system() == "Darwin":
            return "packed"
        return "native" if native_kernels_built() else "dense"
    if choice not in LAYOUTS:
        raise PlanInputError(f"layout {choice!r}: expected one of {', '.join(LAYOUT_CHOICES)}")
    return "packed" if choice == "packed" else "native" if choice == "native" else "dense"


def _kv_dtype(flag: str, configured: str | None, metal: bool) -> KVDtype:
    if flag != "auto":
        return "float16" if flag == "f16" else "float32"
    for choice in KV_DTYPE_CHOICES:  # the config's, checked as the server checks it
        if choice == (configured or "auto"):
            return resolve_kv_dtype(choice, kernels_attend=not metal and native_kernels_built())
    raise PlanInputError(f"kv_dtype {configured!r}: expected one of {', '.join(KV_DTYPE_CHOICES)}")


def _build(args: argparse.Namespace) -> tuple[MemoryModel, CapacityTable, dict[str, int], int]:
    src = resolve_model(args.model, args.config)
    header = read_header(src.path, strings=False)
    layout = _layout(args.layout, src.layout)
    kvq = parse_kv_quant(args.kv_quant) if args.kv_quant is not None else src.kv_quant
    metal = args.device == "metal" or (args.device == "auto" and platform.system() == "Darwin")
    kv = _kv_dtype(args.kv_dtype, src.kv_dtype, metal)
    m = model_from_header(header, layout, kvq, args.prefill_chunk, metal=metal, kv_dtype_bytes=KV_DTYPE_BYTES[kv])
    draft = _draft(args, src)
    if draft is not None:
        m = model_with_draft(m, read_header(draft.path, strings=False), _layout(None, draft.layout), draft.name,
                             draft.tokens, metal)
    budget = parse_memory(args.memory) if args.memory else src.memory_budget or default_budget()
    decode_batch = args.decode_batch or src.decode_batch or DEFAULT_DECODE_BATCH
    table = build_table(m, budget, model=src.model_id, decode_batch=decode_batch,
                        max_kv_size=args.max_kv_size or src.max_kv_size)
    disk = parse_disk_cap(args.disk_cache, "--disk-cache") if args.disk_cache is not None else src.disk_cache_bytes
    return m, table, weights_by_type(header.tensors, layout), disk


def _draft(args: argparse.Namespace, src: ModelSource) -> DraftSource | None:
    """--draft and --draft-tokens over the config's draft: and draft_tokens."""
    if args.draft is None:
        if src.draft is None or args.draft_tokens is None:
            return src.draft
        return replace(src.draft, tokens=args.draft_tokens)
    tokens = args.draft_tokens if args.draft_tokens is not None else src.draft.tokens if src.draft else None
    return resolve_draft(args.draft, tokens, args.config, load_yaml(args.config) if args.config else None)


def _fleet(args: argparse.Namespace, table: CapacityTable, need: int, decode_batch: int, queue_cap: int | None
           ) -> FleetAdmission:
    """What the fleet admits: per host, decode slots (fewer when memory holds fewer streams of `need` tokens)
    and the queue cap (--queue-cap, the server's, or the default for the decode width)."""
    slots = max(0, min(decode_batch, largest_width_at(table, need)))
    cap = args.queue_cap if args.queue_cap is not None else queue_cap or default_queue_cap(decode_batch)
    return FleetAdmission(args.hosts, args.width, slots, cap)


def _key(args: argparse.Namespace) -> KeySplit | None:
    if args.key is None:
        return None
    if not args.config:
        raise PlanInputError("--key needs --config (the keys and their shares are the config's)")
    return key_split(load_yaml(args.config), args.key, args.width)


def _check(args: argparse.Namespace, m: MemoryModel, table: CapacityTable, by_type: dict[str, int],
           disk: DiskTier | None) -> int:
    key = _key(args)
    width = key.runs if key is not None else args.width  # a key's fan-out runs only as wide as its share
    per_host = shares(width, args.hosts)[0]  # each host holds its share of the streams
    verdict = plan(table, per_host, args.depth)
    fleet = _fleet(args, table, args.depth, table.decode_batch, None) if args.hosts > 1 else None
    exact = max_width_at(m, table.budget_bytes, args.depth) if args.depth <= table.context_length else 0
    if args.json:
        out = {"plan": {"width": args.width, "depth": args.depth, "ok": verdict.ok, "reason": verdict.reason,
                        "width_read": verdict.width_read, "largest_width": exact,
                        "largest_tabulated_width": largest_width_at(table, args.depth)},
               "capacity": table_to_json(table), "weights_by_type": by_type}
        if fleet is not None:
            out["fleet"] = fleet.as_json()
        if key is not None:
            out["key"] = key.as_json()
        if disk is not None:
            out["disk_tier"] = disk.as_json()
        print(json.dumps(out, indent=2))
    else:
        print(table_text(table, verdict, per_host, args.depth, exact))
        if fleet is not None:
            print(fleet.text())
        if key is not None:
            print(key.text())
        if disk is not None:
            print(disk.text())
    return 0 if verdict.ok and (key is None or key.refused == 0) else 1


def _paces(args: argparse.Namespace, metrics: dict[str, Any], model_id: str) -> Paces:
    """Flags' flat rates win; then --paces FILE; then the server's measured paces (an older server's flat
    recent rates when it publishes none)."""
    if args.decode_tok_s and args.prefill_tok_s:
        return replace(paces_from_rates(Rates(args.decode_tok_s, args.prefill_tok_s, args.batch_scaling)),
                       source="flags")
    if args.paces:
        return paces_file(args.paces, model_id)
    if args.server:
        by_model = (metrics.get("rates") or {}).get("by_model") or {}
        measured = model_paces(by_model, model_id, args.server)
        if measured is not None:
            return measured
        decode, prefill = server_rates(metrics)
        return replace(paces_from_rates(Rates(decode, prefill, args.batch_scaling)), source=f"{args.server} (flat)")
    raise PlanInputError("simulate needs --decode-tok-s and --prefill-tok-s, --paces FILE or --server URL")


def _simulate(args: argparse.Namespace, table: CapacityTable) -> int:
    metrics = fetch_metrics(args.server, args.api_key) if args.server else {}
    paces = _paces(args, metrics, table.model)
    conc = metrics.get("concurrency") or {}
    width = args.decode_batch or conc.get("decode_batch") or table.decode_batch
    need = args.depth + args.output_tokens
    server = ServerSide(decode_batch=width, queue_cap=args.queue_cap if args.queue_cap is not None else
                        conc.get("queue_cap") or default_queue_cap(width), prefill_chunk=table.prefill_chunk,
                        slots=largest_width_at(table, need), geometry_ok=plan(table, 1, need).ok,
                        prompt_cache=not args.no_prompt_cache)
    work = Workload(args.waves, args.width, args.depth, args.output_tokens, args.think_s, args.spread_s,
                    args.seed, args.max_retries, args.shared_prefix)
    result = simulate_fleet(work, server, paces, args.hosts)
    summary = sim_summary(result)
    fleet = _fleet(args, table, need, width, server.queue_cap) if args.hosts > 1 else None
    if fleet is not None:
        summary["fleet"] = fleet.as_json()
    png = sim_png(result, args.png) if args.png else None
    if args.json:
        print(json.dumps({"capacity": table_to_json(table), "simulation": summary, "png": png}, indent=2))
        return 0
    if fleet is not None:
        print(fleet.text())
    print(f"fan-out: {work.waves} waves x {work.width} subagents, {work.depth}-token prompts"
          + (f" sharing their first {work.shared_prefix}" if work.shared_prefix else "")
          + f", {work.output_tokens} output tokens; decode width {width}, queue cap {server.queue_cap}")
    print(sim_text(summary))
    print(sim_ascii(result))
    if args.png:
        print(f"PNG written to {args.png}" if png else "PNG skipped: matplotlib is not installed")
    return 0


def run_plan(args: argparse.Namespace) -> int:
    try:
        if args.hosts < 1:
            raise PlanInputError(f"--hosts {args.hosts}: expected at least 1")
        m, table, by_type, disk_cap = _build(args)
        if args.action == "simulate":
            return _simulate(args, table)
        return _check(args, m, table, by_type, disk_tier(m, disk_cap, args.depth) if disk_cap else None)
    except (PlanInputError, GGUFFormatError, GeometryError, UnsupportedType, ValueError, RuntimeError) as e:
        print(f"gmlx plan: error: {e}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (`python -m gmlx_plan.cli ...`); `gmlx plan` goes through gmlx_server/cli.py."""
    parser = argparse.ArgumentParser(prog="gmlx")
    add_plan_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
