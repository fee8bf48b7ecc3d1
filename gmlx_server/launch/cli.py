"""The `gmlx launch` command line: refuse early and clearly, then replace this process with the client."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from gmlx_server.launch.clients import CLIENTS, Invocation
from gmlx_server.launch.server import LaunchError, ServerClient
from gmlx_server.launch.sizing import FIXED_PROMPT
from gmlx_top.client import DEFAULT_URL  # the one default address of the client commands


def add_launch_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "launch", help="run an agent harness (claude, codex, opencode, pi) against a running gmlx server",
        allow_abbrev=False,  # a client's --max must not turn into launch's --max-output
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Check the server, keep the model resident, configure the client for it, and run it.\n\n"
                    "Arguments launch does not know go to the client, in order:\n"
                    "  gmlx launch pi --model smollm2 -p 'say hi'\n"
                    "  gmlx launch codex --model qwen exec --skip-git-repo-check 'say hi'\n"
                    "  gmlx launch opencode --model smollm2 run 'say hi'\n"
                    "Everything after -- goes to the client as it is; use it for an argument launch also\n"
                    "has (--model, --url, --api-key, --max-output, --config-home, --dry-run, -h):\n"
                    "  gmlx launch codex --model qwen -- --help\n\n"
                    "Where each client's config is written (other settings in those files are kept):\n"
                    "  pi        $PI_CODING_AGENT_DIR/models.json (default ~/.pi/agent)\n"
                    "  opencode  $XDG_CONFIG_HOME/opencode/opencode.json (default ~/.config/opencode)\n"
                    "  codex     $CODEX_HOME/config.toml and $CODEX_HOME/gmlx.config.toml (default ~/.codex)\n"
                    "  claude    nothing: environment variables only")
    p.add_argument("client", choices=sorted(CLIENTS), help="the harness to run")
    p.add_argument("--model", required=True, help="a served id, alias or id@profile")
    p.add_argument("--url", default=None, help=f"the gmlx server (default GMLX_URL, else {DEFAULT_URL})")
    p.add_argument("--api-key", default=None, help="the server's API key (default GMLX_API_KEY)")
    p.add_argument("--max-output", type=int, default=None,
                   help="the client's output cap (default: a quarter of the model's window, at most 32000 and at most "
                        "half of what the client's own prompt leaves)")
    p.add_argument("--config-home", default=None, metavar="DIR",
                   help="write the client's config under DIR instead of the user's (sets the client's "
                        "PI_CODING_AGENT_DIR, XDG_CONFIG_HOME, CODEX_HOME or CLAUDE_CONFIG_DIR to DIR)")
    p.add_argument("--dry-run", action="store_true",
                   help="write the client's config and print the command instead of running it")
    p.set_defaults(func=run_launch)  # the client's arguments: gmlx_server.cli.parse
    return p


def prepare(args: argparse.Namespace, environ: dict[str, str]) -> Invocation:
    client = CLIENTS[args.client]
    if shutil.which(client.binary, path=environ.get("PATH")) is None:
        raise LaunchError(f"{client.name} is not installed ('{client.binary}' is not on PATH); "
                          f"install it with: {client.install}", 127)
    if args.config_home:
        environ[client.home_env] = str(Path(args.config_home).expanduser().resolve())
    url = (args.url or environ.get("GMLX_URL") or DEFAULT_URL).rstrip("/")
    key = args.api_key or environ.get("GMLX_API_KEY") or None
    server = ServerClient(url, key)
    server.check_up()
    prompt = FIXED_PROMPT[args.client]
    target = server.target(args.model, args.max_output, client.name, prompt)
    inv = client.configure(url, key, target, list(args.passthrough_args), environ)
    fixed = target.fixed_prompt
    if fixed + target.max_output > target.context_window:  # only an explicit --max-output gets here
        inv.notes.append(f"{client.name}'s own prompt is about {fixed} tokens: with {target.max_output} output "
                         f"tokens its first request is over the {target.context_window}-token window, and the "
                         "server will refuse it")
    return inv


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
