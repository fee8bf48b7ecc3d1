"""`gmlx serve | run | top | plan | launch`: the one place that parses the command line."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from gmlx_plan.cli import add_plan_parser
from gmlx_server.launch.cli import add_launch_parser
from gmlx_server.run_cmd import add_run_parser
from gmlx_server.serve import add_serve_parser
from gmlx_top.cli import add_top_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gmlx", description="Local GGUF models on MLX, served and planned.")
    parser.set_defaults(func=None, skip_native_teardown=False)  # a command's parser sets its own
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_serve_parser(sub)
    add_run_parser(sub)
    add_top_parser(sub)
    add_plan_parser(sub)
    add_launch_parser(sub)
    return parser


def split_passthrough(argv: list[str]) -> tuple[list[str], list[str]]:
    """`gmlx launch ... -- CLIENT ARGS`: everything after the first -- belongs to the launched client."""
    if argv[:1] == ["launch"] and "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return argv, []


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """launch hands the client every argument it does not know, in order, then those after --;
    every other command refuses an unknown argument."""
    own, passthrough = split_passthrough(argv)
    if own[:1] != ["launch"]:
        args = parser.parse_args(own)
        args.passthrough_args = passthrough
        return args
    args, unknown = parser.parse_known_args(own)
    args.passthrough_args = [*unknown, *passthrough]
    return args


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse(parser, list(sys.argv[1:] if argv is None else argv))
    if args.func is None:
        parser.print_help()
        return 2
    rc = int(args.func(args))
    if args.skip_native_teardown:
        _exit_without_teardown(rc)
    return rc


def _exit_without_teardown(rc: int) -> None:
    """MLX used off the main thread can abort in C++ static destructors at interpreter exit ("terminate called
    without an active exception"): once the work is done and every stream flushed, leave without them."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    sys.exit(main())
