"""`gmlx serve [MODEL.gguf] [--config FILE] [--host] [--port] [--api-key]`: the app under uvicorn.

One worker: every worker would hold its own copy of each model, so one process is one model host.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from typing import Any

from gmlx_server.config import ConfigError, ServerConfig, load_config, read_env
from gmlx_server.log_format import LOG_FORMATS, configure_logging
from gmlx_server.serving.drain import DEFAULT_DRAIN_S
from gmlx_server.startup import prepare_process

log = logging.getLogger("gmlx.serve")


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "serve", help="serve GGUF models over the OpenAI and Anthropic HTTP APIs",
        description="Serve one GGUF model, the models of a config file, or the embedded SmolLM2 default.")
    p.add_argument("model", nargs="?", help="a GGUF file to serve (default: the embedded SmolLM2)")
    p.add_argument("--config", help="a gmlx YAML config file (models, profiles, aliases)")
    p.add_argument("--host", help="address to bind (default 127.0.0.1, or GMLX_HOST)")
    p.add_argument("--port", type=int, help="port to bind (default 8080, or GMLX_PORT)")
    p.add_argument("--api-key", help="require this key on every route but /health (or GMLX_API_KEY)")
    p.add_argument("--clamp-max-tokens", action="store_true", default=None,
                   help="lower an oversized max_tokens to what the context window leaves, instead of a 400 "
                        "(or GMLX_CLAMP_MAX_TOKENS=1; per model: clamp_max_tokens in the config)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="debug adds each request's prompt text to its request line")
    p.add_argument("--log-format", choices=LOG_FORMATS,
                   help="text (default) or json: one JSON object per line (or GMLX_LOG_FORMAT)")
    p.add_argument("--ssl-certfile", metavar="PEM", help="serve HTTPS with this certificate (chain) file")
    p.add_argument("--ssl-keyfile", metavar="PEM", help="the certificate's private key (with --ssl-certfile)")
    p.add_argument("--drain-timeout", type=_seconds, default=DEFAULT_DRAIN_S, metavar="S",
                   help="on SIGTERM, stop admitting, report not ready and let running requests finish for at most "
                        f"S seconds, then shed the rest and exit (default {DEFAULT_DRAIN_S:g}; 0: shed at once)")
    p.set_defaults(func=run_serve)
    return p


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 86400:
        raise argparse.ArgumentTypeError("expected seconds between 0 and 86400")
    return value


def _tls(args: argparse.Namespace) -> dict[str, Any]:
    """uvicorn's TLS options: both files or neither, each readable, so a typo fails at start with its name."""
    files = {"ssl_certfile": args.ssl_certfile, "ssl_keyfile": args.ssl_keyfile}
    given: dict[str, Any] = {k: v for k, v in files.items() if v}
    if len(given) == 1:
        raise ConfigError("command line", "ssl", "--ssl-certfile and --ssl-keyfile go together")
    for name, path in given.items():
        if not os.access(path, os.R_OK):
            raise ConfigError("command line", f"--{name.replace('_', '-')}", f"cannot read {path}")
    return given


def _config(args: argparse.Namespace) -> ServerConfig:
    if args.config and args.model:
        raise ConfigError("command line", "", "give a MODEL or --config, not both")
    env = read_env()
    if args.clamp_max_tokens:
        env = dataclasses.replace(env, clamp_max_tokens=True)  # in env, so /v1/reload keeps it
    from gmlx_server.serving.model_files import check_drafts  # reads tokenizers (numpy): `gmlx --help` stays light

    return check_drafts(load_config(args.config, model=args.model, env=env, host=args.host, port=args.port,
                                    api_key=args.api_key))


def _describe(config: ServerConfig, model_arg: str | None) -> None:
    if config.source is not None:
        log.info("config %s: %d models (%s)", config.source, len(config.models), ", ".join(config.models))
        return
    entry = next(iter(config.models.values()))
    what = "the embedded default model" if model_arg is None else "model"
    log.info("serving %s %s from %s", what, entry.id, entry.path)


def run_serve(args: argparse.Namespace) -> int:
    level = logging.getLevelNamesMapping().get(str(args.log_level).upper(), logging.INFO)
    try:
        config, tls = _config(args), _tls(args)
    except ConfigError as e:
        print(f"gmlx serve: {e}", file=sys.stderr)
        return 2
    log_format = args.log_format or config.env.log_format
    configure_logging(level, log_format)
    _describe(config, args.model)
    prepare_process(config)  # OpenBLAS before mlx loads
    try:
        from gmlx_server.engine.factory import create_engine  # noqa: F401  (the host's default factory)
    except ImportError as e:
        print(f"gmlx serve: the MLX engine is not available: {e}", file=sys.stderr)
        return 1

    import uvicorn

    from gmlx_server.app import create_app
    from gmlx_server.graceful import serve_draining
    from gmlx_server.header_timeout import uvicorn_limits
    from gmlx_server.serving.model_host import ModelHost

    host = ModelHost(config, drain_deadline_s=args.drain_timeout)  # the default factory; GGUF headers checked
    app = create_app(config, host=host)
    s = config.server
    log.info("listening on %s://%s:%d%s", "https" if tls else "http", s.host, s.port,
             " (API key required)" if s.keys else "")
    # JSON: uvicorn's own lines go through the root handler too, as JSON (its default config would add text handlers).
    logs: dict[str, Any] = {"log_config": None} if log_format == "json" else {}
    serve_draining(uvicorn.Config(app, host=s.host, port=s.port, workers=1, lifespan="on", log_level=args.log_level,
                                  timeout_graceful_shutdown=5, **logs, **tls,
                                  **uvicorn_limits(config.env.header_timeout_s)),
                   host)
    return 0
