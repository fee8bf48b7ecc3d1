"""`gmlx run <id-or-path>[@profile] "prompt"`: one prompt from the terminal, through the server's own path.

The model host, prompt preparation and request builder are the server's (serving/generation.py), so a profile's
stop strings, max_tokens and system prompt and the context fit apply as they do to an HTTP request; only
admission is skipped (one request) and no HTTP server starts.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from gmlx_server.config import ConfigError, ServerConfig, WeightsLayout, load_config, read_env
from gmlx_server.errors import GmlxError, ModelNotFound
from gmlx_server.generation_params import GenerationParams, ImageRef
from gmlx_server.protocol.params import sampling as knobs
from gmlx_server.serving.addressing import Address, Catalog, resolve_address

if TYPE_CHECKING:  # the service and engine modules load once the process is prepared for MLX
    from gmlx_server.engine.types import Engine, GenerationRequest
    from gmlx_server.serving.generation import Prepared
    from gmlx_server.serving.model_host import ModelHost

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
    p.add_argument("--max-tokens", type=int,
                   help="the output cap (default: the profile's max_tokens, else what the context window leaves)")
    p.add_argument("--seed", type=int)
    p.add_argument("--system", help="a system message")
    p.add_argument("--raw", action="store_true", help="complete the text as is, without the chat template")
    p.add_argument("--image", action="append", default=[], metavar="PATH_OR_URL",
                   help="an image for a vision model: a file, an http(s) URL or a data: URI (repeatable)")
    p.add_argument("--mmproj", help="the vision projector GGUF for a GGUF path (a configured id has its own)")
    p.add_argument("--weights", choices=get_args(WeightsLayout), help="override the weight layout")
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
    from gmlx_server.serving.model_files import check_drafts  # reads tokenizers (numpy): `gmlx --help` stays light

    cfg = _with_mmproj(check_drafts(load_config(args.config, model=path, env=read_env())), args.mmproj, path)
    # The terminal's user is the operator: an --image URL is their own word, so any address may be fetched.
    cfg = replace(cfg, server=replace(cfg.server, image_fetch_allow_private=True))
    cat = Catalog.from_config(cfg)
    model = next(iter(cfg.models)) + (f"@{rest}" if rest else "") if path else rest
    return cfg, resolve_address(model, args.profile, cat)


def _with_mmproj(cfg: ServerConfig, mmproj: str | None, path: str | None) -> ServerConfig:
    if mmproj is None:
        return cfg
    if path is None:
        raise ConfigError("command line", "mmproj", "--mmproj goes with a GGUF path; a configured id has its own")
    if not Path(mmproj).is_file():
        raise ConfigError("command line", "mmproj", f"file not found: {mmproj}")
    (mid, entry), = cfg.models.items()
    return replace(cfg, models={mid: replace(entry, mmproj=str(Path(mmproj).resolve()))})


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
        inp = _params(args, addr, _prompt_text(args))
    except (ConfigError, GmlxError) as e:
        print(f"gmlx run: {e}", file=sys.stderr)
        return 2
    from gmlx_server.startup import prepare_process

    prepare_process(cfg)  # OpenBLAS before mlx loads
    from gmlx_server.serving.model_host import ModelHost  # its engine factory imports MLX on the first load

    host = ModelHost(_with_weights(cfg, addr.model_id, args.weights))
    args.skip_native_teardown = True  # MLX will run on an engine thread: see cli._exit_without_teardown
    try:
        try:
            prep = asyncio.run(_prepare(host, inp))
        except GmlxError as e:  # the server's refusals: context, length, memory, a file that cannot load
            print(f"gmlx run: {e}", file=sys.stderr)
            return 2 if e.status < 500 else 1
        return _generate(prep.prompt.engine, prep.request)
    finally:
        host.close()


def _params(args: argparse.Namespace, addr: Address, text: str) -> GenerationParams:
    """The terminal's prompt as the generation request a protocol parser would build from a body."""
    sampling = knobs({"temperature": args.temperature, "seed": args.seed})  # the request fields' ranges
    common = {"model": addr.model_id, "profile": addr.profile, "sampling": sampling, "max_tokens": args.max_tokens}
    if args.raw:
        return GenerationParams(**common, prompt=text)
    system = [{"role": "system", "content": args.system}] if args.system else []
    content: str | list[dict[str, Any]] = text
    if args.image:  # the images first, then the question, as mlx-vlm and llama.cpp's CLIs place them
        from gmlx_server.protocol.image_parts import image_part  # numpy (and its BLAS): not for `gmlx top`'s import

        content = [*(image_part(_image_ref(x, f"--image[{i}]")) for i, x in enumerate(args.image)),
                   {"type": "text", "text": text}]
    return GenerationParams(**common, messages=(*system, {"role": "user", "content": content}))


def _image_ref(arg: str, where: str) -> ImageRef:
    """A file is read here; a URL or data: URI goes the way a request's image_url does."""
    if arg.startswith(("http://", "https://", "data:")):
        from gmlx_server.protocol.image_parts import from_url

        return from_url(arg, where, where)
    try:
        return ImageRef(where, data=Path(arg).expanduser().read_bytes())
    except OSError as e:
        raise ConfigError("command line", "image", f"cannot read {arg}: {e.strerror or e}") from None


def _with_weights(cfg: ServerConfig, model_id: str, weights: WeightsLayout | None) -> ServerConfig:
    if weights is None:
        return cfg
    entry = replace(cfg.models[model_id], weights=weights)
    return replace(cfg, models={**cfg.models, model_id: entry})


async def _prepare(host: ModelHost, inp: GenerationParams) -> Prepared:
    """The server's path up to submit (prompt, context fit, request), in one event loop for the CLI."""
    from gmlx_server.serving.generation import prepare_request

    return await prepare_request(host, inp, f"run-{uuid.uuid4().hex[:8]}")


def _generate(engine: Engine, request: GenerationRequest) -> int:
    from gmlx_server.engine.types import TokenEvent

    t0 = time.perf_counter()
    final: list[TokenEvent] = []

    def on_event(ev: TokenEvent) -> None:
        sys.stdout.write(ev.text)
        sys.stdout.flush()
        if ev.finish_reason is not None:
            final.append(ev)

    engine.generate_sync(request, on_event)
    _report(final[0] if final else None, time.perf_counter() - t0)
    return 0 if final and final[0].finish_reason != "error" else 1


def _report(final: Any, wall: float) -> None:
    if final is None or final.timings is None:
        print(f"\n[no result after {wall:.1f} s]", file=sys.stderr)
        return
    t = final.timings
    print(f"\n[{final.finish_reason}{': ' + final.error if final.error else ''}] "
          f"prompt {t.prompt_tokens} tok at {t.prefill_tok_s:.1f} tok/s, "
          f"generated {t.generated} tok at {t.decode_tok_s:.1f} tok/s, {wall:.1f} s", file=sys.stderr)
