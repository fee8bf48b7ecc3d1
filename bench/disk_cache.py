"""The prompt cache's disk tier: TTFT of an agent's next turn after a server restart, beside a cold prefill and a
RAM hit, on a real `gmlx serve` over HTTP; and decode with the tier on and off.

    .venv/bin/python bench/disk_cache.py [--turns 3] [--tools 120] [--gen 16]
    .venv/bin/python bench/disk_cache.py --decode    # decode tok/s with the disk tier writing, and without it

A Claude Code-shaped conversation: a system prompt of tool descriptions (about 6K tokens on SmolLM2 at the
default 120 tools), then a tool result and a short answer each turn. For each turn k+1:
  cold     both tiers reset, then turn k+1
  ram      both tiers reset, turn k, then turn k+1 in the same process (a RAM hit)
  restart  both tiers reset, turn k, the server restarted, then turn k+1 (a disk hit)
TTFT is the time to the first streamed content at the client. The restore pace is the disk tier's restored tokens
over its restore seconds (from /v1/cache/stats), beside the cold turn's prefill pace; the resident MLX memory
after the restart's turn is printed beside the cold turn's. Every answer must equal the cold one (greedy).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import openai
from openai.types.chat import ChatCompletionChunk

from tests.conftest import smollm2_path
from tests.e2e.server import LiveServer, gmlx_serve

Message = dict[str, str]


def system_prompt(tools: int) -> str:
    return "You are a coding agent. Use the tools below.\n" + "\n".join(
        f"- tool_{i}(path: string, mode: 'read'|'write', limit?: int): reads or edits file {i} of the "
        f"workspace and returns its lines {i * 3}..{i * 3 + 40} with line numbers." for i in range(tools))


def conversation(tools: int, turns: int) -> list[list[Message]]:
    """The message lists of turns 0..turns: each adds the previous answer and a new tool result."""
    out, messages = [], [{"role": "system", "content": system_prompt(tools)}]
    for k in range(turns + 1):
        messages = [*messages, {"role": "user", "content": f"Tool result {k}: file_{k}.py has {k * 7 + 3} lines, "
                                                           f"test_{k} failed on line {k + 11}. What next?"}]
        out.append(messages)
        messages = [*messages, {"role": "assistant", "content": f"I will read file_{k + 1}.py next."}]
    return out


def ttft(s: LiveServer, messages: list[Message], gen: int) -> tuple[float, str]:
    """Seconds to the first streamed content, and the greedy answer."""
    client = openai.OpenAI(base_url=s.v1, api_key="unused", max_retries=0, timeout=900)
    t0 = time.perf_counter()
    first, parts = None, []
    stream = client.chat.completions.create(model="smollm2", messages=messages,  # type: ignore[arg-type]
                                            max_tokens=gen, temperature=0, stream=True)
    for chunk in stream:
        assert isinstance(chunk, ChatCompletionChunk)
        if chunk.choices and chunk.choices[0].delta.content:  # the role chunk comes before the prefill
            first = time.perf_counter() - t0 if first is None else first
            parts.append(chunk.choices[0].delta.content)
    assert first is not None
    return first, "".join(parts)


def post(s: LiveServer, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    r = httpx.post(s.base_url + path, json=body or {}, timeout=120)
    r.raise_for_status()
    return dict(r.json())


def settled(s: LiveServer) -> dict[str, Any]:
    """The cache stats once the disk writer has nothing queued."""
    deadline = time.monotonic() + 60
    while True:
        body: dict[str, Any] = httpx.get(s.v1 + "/cache/stats", timeout=10).json()
        if not any(m["disk"]["writes_pending"] for m in body.get("models", {}).values()) \
                or time.monotonic() > deadline:
            return body
        time.sleep(0.05)


def active_bytes(s: LiveServer) -> int:
    return int(httpx.get(s.v1 + "/metrics", timeout=10).json()["server"]["memory"]["active_bytes"] or 0)


@contextlib.contextmanager
def server(root: Path, disk: str) -> Iterator[LiveServer]:
    cfg = root / "gmlx.yaml"
    cfg.write_text(f"server:\n  prompt_cache_disk_bytes: {disk}\n  prompt_cache_dir: {root / 'pc'}\n"
                   f"models:\n  smollm2:\n    path: {smollm2_path()}\n")
    with gmlx_serve(["--config", str(cfg)], root) as s:
        post(s, "/v1/keep", {"model": "smollm2", "warm": False})
        yield s


def one_turn(root: Path, before: list[Message], turn: list[Message], gen: int) -> dict[str, Any]:
    with server(root, "2GiB") as s:
        prompt = post(s, "/tokenize", {"model": "smollm2", "messages": turn})["count"]
        post(s, "/v1/cache/reset")
        cold, answer = ttft(s, turn, gen)
        cold_mem = active_bytes(s)
        post(s, "/v1/cache/reset")
        ttft(s, before, gen)
        ram, ram_answer = ttft(s, turn, gen)
        post(s, "/v1/cache/reset")
        ttft(s, before, gen)
        settled(s)
    with server(root, "2GiB") as s:
        disk, disk_answer = ttft(s, turn, gen)
        stats = settled(s)["models"]["smollm2"]
        mem = active_bytes(s)
    d = stats["disk"]
    return {"cold": cold, "ram": ram, "restart": disk, "same": answer == ram_answer == disk_answer,
            "restored": d["restored_tokens"], "restore_tok_s": d["restored_tokens"] / max(d["restore_seconds"], 1e-9),
            "cold_mem": cold_mem, "mem": mem, "prompt": prompt}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tools", type=int, default=120)
    ap.add_argument("--gen", type=int, default=16)
    ap.add_argument("--decode", action="store_true")
    args = ap.parse_args()
    if args.decode:
        return decode(args.gen)
    turns = conversation(args.tools, args.turns)
    print("turn  prompt  cold_ttft_s  ram_ttft_s  restart_ttft_s  restart/cold  ram/cold  restored  restore_tok_s  "
          "cold_tok_s  mem_MiB cold/restart  same")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(1, args.turns + 1):
            r = one_turn(Path(tmp), turns[k - 1], turns[k], args.gen)
            ratios.append(r["restart"] / r["cold"])
            print(f"{k:4d}  {r['prompt']:6d}  {r['cold']:11.3f}  {r['ram']:10.3f}  {r['restart']:14.3f}  "
                  f"{ratios[-1]:12.3f}  "
                  f"{r['ram'] / r['cold']:8.3f}  {r['restored']:8d}  {r['restore_tok_s']:13.0f}  "
                  f"{r['prompt'] / r['cold']:10.0f}  {r['cold_mem'] / 2**20:7.0f}/{r['mem'] / 2**20:<7.0f}  "
                  f"{'yes' if r['same'] else 'NO'}", flush=True)
    print(f"median restart/cold TTFT: {statistics.median(ratios):.3f} (target <= 0.15)")


def decode(gen: int, streams: int = 4) -> None:
    """Decode tok/s of `streams` sequential requests with distinct prompts (each snapshot is written while
    the next decodes), with the disk tier on and then off."""
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        for disk in ("2GiB", "0"):
            with server(Path(tmp), disk) as s:
                per = []
                for i in range(streams):
                    msgs = [{"role": "system", "content": system_prompt(40 + i)},
                            {"role": "user", "content": f"Write a story about ship {i}."}]
                    per.append(stream_rate(s, msgs, max(gen, 128)))
                rates[disk] = statistics.median(per)
    print(f"decode tok/s with the disk tier on: {rates['2GiB']:.1f}, off: {rates['0']:.1f}, "
          f"on/off {rates['2GiB'] / rates['0']:.3f} (target >= 0.95)")


def stream_rate(s: LiveServer, messages: list[Message], gen: int) -> float:
    client = openai.OpenAI(base_url=s.v1, api_key="unused", max_retries=0, timeout=900)
    stamps = []
    for chunk in client.chat.completions.create(model="smollm2", messages=messages,  # type: ignore[arg-type]
                                                max_tokens=gen, temperature=0, stream=True,
                                                extra_body={"logit_bias": {"2": -100}}):
        assert isinstance(chunk, ChatCompletionChunk)
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.perf_counter())
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


if __name__ == "__main__":
    main()
