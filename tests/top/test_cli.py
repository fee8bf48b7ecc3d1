"""`gmlx top` arguments, through the parser the gmlx CLI wires in."""

from __future__ import annotations

import argparse

import pytest

from gmlx_top.cli import add_top_parser, run_top


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gmlx")
    add_top_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["top", *argv])


def test_defaults_and_flags() -> None:
    args = _parse()
    assert (args.urls, args.api_key, args.interval, args.func) == (["http://127.0.0.1:8080"], None, 1.0, run_top)
    args = _parse("box:9000", "--api-key", "k", "--interval", "0.25")
    assert (args.urls, args.api_key, args.interval) == (["box:9000"], "k", 0.25)
    assert _parse("h1:8080", "h2:8080", "h3:8080").urls == ["h1:8080", "h2:8080", "h3:8080"]  # a fleet


@pytest.mark.parametrize("bad", ["0", "-1", "nan-ish"])
def test_a_bad_interval_is_a_usage_error(bad: str) -> None:
    with pytest.raises(SystemExit):
        _parse("--interval", bad)
