"""The `gmlx launch` command line: refuse early and clearly, then replace this process with the client."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Any

from gmlx_server.launch.clients import CLIENTS, Invocation
from gmlx_server.launch.server import LaunchError, ServerClient
from gmlx_top.client import DEFAULT_URL  # the one default address of the client commands


def add_launch_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "launch", help="run an agent harness (claude, pi) against a running gmlx server",
        description="Check the server, keep the model resident, configure the client for it, and run it. "
                    "Arguments after -- go to the client: gmlx launch claude --model ID -- -p 'say hi'.")
    p.add_argument("client", choices=sorted(CLIENTS), help="the harness to run")
    p.add_argument("--model", required=True, help="a served id, alias or id@profile")
    p.add_argument("--url", default=None, help=f"the gmlx server (default GMLX_URL, else {DEFAULT_URL})")
    p.add_argument("--api-key", default=None, help="the server's API key (default GMLX_API_KEY)")
    p.add_argument("--max-output", type=int, default=None,
                   help="the client's output cap (default: a quarter of the model's window, at most 32000)")
    p.add_argument("--dry-run", action="store_true", help="print what would run instead of running it")
    p.set_defaults(func=run_launch)  # what follows -- is the client's: gmlx_server.cli.split_passthrough
    return p


def prepare(args: argparse.Namespace, environ: dict[str, str]) -> Invocation:
    client = CLIENTS[args.client]
    if shutil.which(client.binary, path=environ.get("PATH")) is None:
        raise LaunchError(f"{client.name} is not installed ('{client.binary}' is not on PATH); "
                          f"install it with: {client.install}", 127)
    url = (args.url or environ.get("GMLX_URL") or DEFAULT_URL).rstrip("/")
    key = args.api_key or environ.get("GMLX_API_KEY") or None
    server = ServerClient(url, key)
    server.check_up()
    target = server.target(args.model, args.max_output)
    return client.configure(url, key, target, list(args.passthrough_args), environ)


def run_launch(args: argparse.Namespace) -> int:
    environ = dict(os.environ)
    try:
        inv = prepare(args, environ)
    except LaunchError as e:
        print(f"gmlx launch: {e}", file=sys.stderr)
        return e.code
    for path in inv.wrote:
        print(f"gmlx launch: wrote {path}", file=sys.stderr)
    print(f"gmlx launch: {' '.join(inv.argv)} ({inv.notes[0]})", file=sys.stderr)
    for note in inv.notes[1:]:
        print(f"gmlx launch: note: {note}", file=sys.stderr)
    if args.dry_run:
        return 0
    binary = shutil.which(inv.argv[0], path=inv.env.get("PATH")) or inv.argv[0]
    os.execve(binary, inv.argv, inv.env)  # the client owns the terminal from here
    return 0  # not reached
