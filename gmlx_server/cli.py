"""`gmlx serve | run | top | plan`: the one place that parses the command line."""

from __future__ import annotations

import argparse
import sys

from gmlx_plan.cli import add_plan_parser
from gmlx_server.run_cmd import add_run_parser
from gmlx_server.serve import add_serve_parser
from gmlx_top.cli import add_top_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gmlx", description="Local GGUF models on MLX, served and planned.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_serve_parser(sub)
    add_run_parser(sub)
    add_top_parser(sub)
    add_plan_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
