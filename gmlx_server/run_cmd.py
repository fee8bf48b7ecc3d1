"""`gmlx run <id-or-path>[@profile] "prompt"`: one prompt from the terminal, same addressing as the server."""

from __future__ import annotations

import argparse
import logging
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from gmlx_server.config import ConfigError, ServerConfig, load_config, read_env
from gmlx_server.errors import GmlxError, ModelNotFound
from gmlx_server.service.addressing import Address, Catalog, resolve_address, resolve_settings

log = logging.getLogger("gmlx.run")


def add_run_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "run", help="answer one prompt in the terminal",
        description="Stream one answer. MODEL is a GGUF path or a configured id/alias, optionally @profile.")
    p.add_argument("model", nargs="?", default="", help="GGUF path, id, alias, id@profile (default: the default model)")
    p.add_argument("prompt", nargs="?", help="the prompt (default: read standard input)")
    p.add_argument("--config", help="a gmlx YAML config file, for configured ids, aliases and profiles")
    p.add_argument("--profile", help="a profile or built-in intent (chat, coding, creative, precise)")
    p.add_argument("--temperature", type=float)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--seed", type=int)
    p.add_argument("--system", help="a system message")
    p.add_argument("--raw", action="store_true", help="complete the text as is, without the chat template")
    p.add_argument("--weights", choices=["auto", "packed", "dense"], help="override the weight layout")
    p.add_argument("-v", "--verbose", action="store_true", help="show the load log")
    p.set_defaults(func=run_run)
    return p


def _split_path(model: str) -> tuple[str | None, str]:
    """`path.gguf@coding` -> (path, 'coding'); the suffix is a profile only when the path exists without it."""
    head, sep, tail = model.rpartition("@")
    if Path(model).is_file():
        return model, ""
    if sep and Path(head).is_file():
        return head, tail
    return None, model


def _resolve(args: argparse.Namespace) -> tuple[ServerConfig, Address]:
    path, rest = _split_path(args.model) if args.model else (None, "")
    if args.config and path:
        raise ConfigError("command line", "", "give a GGUF path or --config, not both")
    cfg = load_config(args.config, model=path, env=read_env())
    cat = Catalog.from_config(cfg)
    model = next(iter(cfg.models)) + (f"@{rest}" if rest else "") if path else rest
    return cfg, resolve_address(model, args.profile, cat)


def _resolve_or_shift(args: argparse.Namespace) -> tuple[ServerConfig, Address]:
    """`gmlx run "prompt"`: a lone positional that names no model is the prompt."""
    try:
        return _resolve(args)
    except ModelNotFound:
        if args.prompt is not None or not args.model:
            raise
        args.prompt, args.model = args.model, ""
        return _resolve(args)


def _prompt_text(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return str(args.prompt)
    if sys.stdin.isatty():
        raise ConfigError("command line", "prompt", "give a prompt, or pipe one on standard input")
    return sys.stdin.read()


def run_run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg, addr = _resolve_or_shift(args)
        text = _prompt_text(args)
    except (ConfigError, GmlxError) as e:
        print(f"gmlx run: {e}", file=sys.stderr)
        return 2
    from gmlx_server.startup import prepare_process

    prepare_process(cfg)  # OpenBLAS before mlx loads
    from gmlx_server.engine.factory import create_engine  # imports MLX: only once we know what to run

    entry = cfg.models[addr.model_id]
    if args.weights:
        entry = type(entry)(**{**entry.__dict__, "weights": args.weights})
    try:
        engine = create_engine(entry, cfg.env)
    except (OSError, ValueError) as e:
        print(f"gmlx run: cannot load {entry.path}: {e}", file=sys.stderr)
        return 1
    try:
        return _generate(engine, cfg, addr, args, text)
    finally:
        engine.close()


def _generate(engine: Any, cfg: ServerConfig, addr: Address, args: argparse.Namespace, text: str) -> int:
    from gmlx_server.engine.types import GenerationRequest, SamplingParams, TokenEvent

    settings = resolve_settings(addr, engine.info.family, Catalog.from_config(cfg))
    sampling = dict(settings.sampling)
    for key, value in (("temperature", args.temperature), ("seed", args.seed)):
        if value is not None:
            sampling[key] = value
    fields = set(SamplingParams.__dataclass_fields__)
    params = SamplingParams(**{k: v for k, v in sampling.items() if k in fields})
    prompt = _render(engine, settings, args, text)
    req = GenerationRequest(f"run-{uuid.uuid4().hex[:8]}", prompt, args.max_tokens, params)
    t0 = time.perf_counter()
    final: list[TokenEvent] = []

    def on_event(ev: TokenEvent) -> None:
        sys.stdout.write(ev.text)
        sys.stdout.flush()
        if ev.finish_reason is not None:
            final.append(ev)

    engine.generate_sync(req, on_event)
    _report(final[0] if final else None, time.perf_counter() - t0)
    return 0 if final and final[0].finish_reason != "error" else 1


def _render(engine: Any, settings: Any, args: argparse.Namespace, text: str) -> list[int]:
    if args.raw:
        return list(engine.tokenizer.encode(text))
    messages = []
    system = args.system or settings.system
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": text})
    rendered = engine.template.render(messages, add_generation_prompt=True, **settings.template_kwargs)
    # The template writes BOS itself where the model wants one.
    return list(engine.tokenizer.encode(rendered, add_special_tokens=False))


def _report(final: Any, wall: float) -> None:
    if final is None or final.timings is None:
        print(f"\n[no result after {wall:.1f} s]", file=sys.stderr)
        return
    t = final.timings
    print(f"\n[{final.finish_reason}{': ' + final.error if final.error else ''}] "
          f"prompt {t.prompt_tokens} tok at {t.prefill_tok_s:.1f} tok/s, "
          f"generated {t.generated} tok at {t.decode_tok_s:.1f} tok/s, {wall:.1f} s", file=sys.stderr)
