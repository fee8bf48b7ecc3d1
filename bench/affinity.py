"""Prompt-cache hits through HAProxy (deploy/haproxy) for each client's real affinity shape, against none.

    .venv/bin/python bench/affinity.py [--conversations 6] [--turns 4] [--output 8]

Three `gmlx serve` hosts (the embedded SmolLM2) behind HAProxy. `conversations` agent-like conversations
(one shared system prompt, each its own task) run interleaved turn by turn; each turn resends the whole
history plus a new user message, as harnesses do. Each shape is one client's real request:
  claude   Messages as Claude Code 2.1 sends them to a local server: its session id inside metadata.user_id
  codex    Responses, the whole input each turn, with session_id (Codex)
  openai   chat completions with prompt_cache_key in the body (the OpenAI SDK's field)
  none     chat completions with no key, HAProxy generated with --no-address-key (least connections)
Every host's prompt cache is emptied before each shape. Prints per shape: the prompt tokens of turns 2 and
later, the share the hosts' prompt caches served (cached tokens / prompt tokens), and the mean number of
hosts a conversation touched.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from tests.fleet.haproxy import haproxy, host_of, hosts_of
from tests.fleet.live import Host, start_all

SYSTEM = ("You are a coding agent working in a repository. Read files before you change them, keep changes "
          "small, run the tests after each change, and explain what you did in one short paragraph. ") * 6
Turn = tuple[int, int, str, str]  # prompt tokens, cached tokens, answering host, answer text


def _claude(url: str, sid: str, history: list[dict[str, str]], output: int) -> Turn:
    user = json.dumps({"device_id": "ca0fda8b", "account_uuid": "", "session_id": sid})
    r = httpx.post(url + "/v1/messages", timeout=300, json={
        "model": "smollm2", "max_tokens": output, "temperature": 0, "system": SYSTEM, "messages": history,
        "metadata": {"user_id": user}})
    r.raise_for_status()
    u, text = r.json()["usage"], "".join(b.get("text", "") for b in r.json()["content"])
    return u["input_tokens"] + u["cache_read_input_tokens"], u["cache_read_input_tokens"], host_of(r), text


def _codex(url: str, sid: str, history: list[dict[str, str]], output: int) -> Turn:
    r = httpx.post(url + "/v1/responses", headers={"session_id": sid}, timeout=300, json={
        "model": "smollm2", "max_output_tokens": output, "temperature": 0, "instructions": SYSTEM,
        "input": history, "store": False})
    r.raise_for_status()
    u = r.json()["usage"]
    return u["input_tokens"], u["input_tokens_details"]["cached_tokens"], host_of(r), _output_text(r.json())


def _output_text(body: dict[str, Any]) -> str:
    return "".join(c.get("text", "") for item in body["output"] if item.get("type") == "message"
                   for c in item["content"])


def _chat(key: bool) -> Callable[[str, str, list[dict[str, str]], int], Turn]:
    def send(url: str, sid: str, history: list[dict[str, str]], output: int) -> Turn:
        body: dict[str, Any] = {"model": "smollm2", "max_tokens": output, "temperature": 0,
                                "messages": [{"role": "system", "content": SYSTEM}, *history]}
        if key:
            body["prompt_cache_key"] = sid
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
        r.raise_for_status()
        u = r.json()["usage"]
        text = r.json()["choices"][0]["message"]["content"] or ""
        return u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"], host_of(r), text
    return send


SHAPES = {"claude": _claude, "codex": _codex, "openai": _chat(True), "none": _chat(False)}


def run_shape(url: str, send: Callable[..., Turn], args: argparse.Namespace) -> tuple[int, int, float]:
    """(prompt tokens, cached tokens) over turns 2.., and the mean hosts per conversation."""
    histories: dict[str, list[dict[str, str]]] = {f"conv-{c}-7f3a": [] for c in range(args.conversations)}
    hosts: dict[str, set[str]] = {sid: set() for sid in histories}
    prompt = cached = 0
    for turn in range(args.turns):
        for c, (sid, history) in enumerate(histories.items()):
            history.append({"role": "user", "content": f"Task {c}, step {turn}: list the next file to read."})
            p, k, host, text = send(url, sid, history, args.output)
            history.append({"role": "assistant", "content": text or "ok"})
            hosts[sid].add(host)
            if turn:
                prompt, cached = prompt + p, cached + k
    return prompt, cached, sum(len(h) for h in hosts.values()) / len(hosts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", type=int, default=6)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--output", type=int, default=8)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        hs = [Host(f"gmlx{i + 1}", Path(tmp)) for i in range(3)]
        try:
            start_all(hs)
            for name, send in SHAPES.items():
                for h in hs:
                    httpx.post(h.url + "/v1/cache/reset", json={}, timeout=60).raise_for_status()
                with haproxy(hosts_of([h.url for h in hs]), Path(tmp), address_key=False) as proxy:
                    rows.append((name, *run_shape(proxy.url, send, args)))
        finally:
            for h in hs:
                h.stop()
    print(f"3 hosts, {args.conversations} conversations x {args.turns} turns, interleaved; {args.output} tokens "
          "an answer; turns 2.. counted")
    print(f"{'shape':>7} {'prompt tok':>10} {'cached':>7} {'hit rate':>8} {'hosts/conv':>10}")
    for name, prompt, cached, spread in rows:
        print(f"{name:>7} {prompt:>10} {cached:>7} {cached / max(prompt, 1):>8.1%} {spread:>10.2f}")


if __name__ == "__main__":
    main()
