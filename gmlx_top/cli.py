"""`gmlx top [URL] [--api-key KEY] [--interval S]`: the parser and entry point the gmlx CLI wires in."""

from __future__ import annotations

import argparse
import os
from typing import Any

from gmlx_top.client import DEFAULT_URL, HttpClient


def add_top_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "top", help="live terminal dashboard of a running gmlx server",
        description="Poll a gmlx server's /v1/metrics: live requests, governor band, queue, rates, resident "
                    "models. Several URLs (the hosts behind a load balancer): one row per host, the selected "
                    "host's details below. Keys: u unload, k keep, r reset cache (each asks first), n/p next/"
                    "previous host, q quit.")
    p.add_argument("urls", nargs="*", default=[DEFAULT_URL], metavar="URL",
                   help=f"server URL, or several for a fleet (default {DEFAULT_URL})")
    p.add_argument("--api-key", default=None, help="the server's API key (default: GMLX_API_KEY)")
    p.add_argument("--interval", type=_interval, default=1.0, help="seconds between polls (default 1.0)")
    p.set_defaults(func=run_top)
    return p


def _interval(text: str) -> float:
    value = float(text)
    if not 0.05 <= value <= 3600:
        raise argparse.ArgumentTypeError("interval must be between 0.05 and 3600 seconds")
    return value


def run_top(args: argparse.Namespace) -> int:
    from gmlx_top.app import TopApp  # Textual loads only for `gmlx top`, not for every gmlx command

    api_key = args.api_key or os.environ.get("GMLX_API_KEY") or None
    TopApp([HttpClient(url, api_key) for url in args.urls], interval=args.interval).run()
    return 0
