"""/health latency on a real `gmlx serve` (the embedded SmolLM2), quiet and under each heavy request.

    .venv/bin/python bench/responsiveness.py [--prefill 1500] [--only NAME]

Polls /health every 20 ms from its own connection while one request runs: the largest input each route
accepts (tokenized off the event loop), the bodies that used to freeze the server (a 30 MB count_tokens
body, 300k chat messages), and a long prefill. Prints p50/p99/max per load and the request's own status
and duration. The loads are tests/e2e/health_probe.py's, which tests/e2e/test_responsiveness.py asserts on.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.health_probe import loads, prefill_load, quiet, under
from tests.e2e.server import gmlx_serve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefill", type=int, default=1500, help="prompt tokens of the prefill load (0: skip it)")
    ap.add_argument("--only", default=None, help="run only the loads whose name contains this")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, gmlx_serve([], Path(tmp)) as server:
        todo = loads("") + ([prefill_load("", args.prefill)] if args.prefill else [])
        todo = [x for x in todo if args.only is None or args.only in x.name]
        under(server.base_url, prefill_load("", 16))  # loads the model, outside the figures
        print(f"{'load':26s} {'status':>6s} {'request s':>9s}   /health")
        print(f"{'quiet':26s} {'':6s} {'':9s}   {quiet(server.base_url)}")
        for load in todo:
            out = under(server.base_url, load)
            print(f"{load.name:26s} {out.status:6d} {out.seconds:9.2f}   {out.health}"
                  + (f"  ({len(out.failures)} failed polls)" if out.failures else ""))


if __name__ == "__main__":
    main()
