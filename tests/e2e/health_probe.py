"""/health latency while a server works: a poller thread, and the heavy requests it is measured under.

Shared by tests/e2e/test_responsiveness.py (which asserts a generous bound) and bench/responsiveness.py
(which prints the figures). The loads are the largest inputs each route accepts on the embedded model
(SmolLM2: 8192-token window, no token over 81 characters, so 663,552 characters is the most a prompt may
hold untokenized), plus the bodies that froze the server before (30 MB, 300k messages), plus a long prefill.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

WINDOW, TOKEN_CHARS = 8192, 81  # SmolLM2's context window and longest token, in characters
MOST_CHARS = WINDOW * TOKEN_CHARS - 4096  # just inside the bound once the template's own text is added
WORDS = ("lighthouse", "keeper", "sea", "storm", "lamp", "rock", "gull", "tide", "night", "ship", "harbor")


def prose(chars: int) -> str:
    """Plain words (about 4-5 characters a token): what a long document or a tool result looks like."""
    out, n, i = [], 0, 0
    while n < chars:
        word = WORDS[(i * 7 + i // 3) % len(WORDS)]
        out.append(word)
        n += len(word) + 1
        i += 1
    return " ".join(out)[:chars]


def _turns(n: int, content: str = "hi") -> list[dict[str, str]]:
    return [{"role": ("user", "assistant")[i % 2], "content": content} for i in range(n + 1 - n % 2)]


@dataclass(frozen=True)
class Load:
    name: str
    path: str
    body: Callable[[], dict[str, Any]]  # built when run: some are tens of megabytes
    status: int  # what the server answers: each is a typed answer, never a 5xx


def loads(model: str) -> list[Load]:
    text = prose(MOST_CHARS)
    one = [{"role": "user", "content": text}]
    return [
        Load("count_tokens 30 MB", "/v1/messages/count_tokens",
             lambda: {"model": model, "messages": [{"role": "user", "content": prose(30_000_000)}]}, 400),
        Load("chat 300k messages", "/v1/chat/completions",
             lambda: {"model": model, "messages": _turns(300_000), "max_tokens": 1}, 400),
        Load("chat 100k messages", "/v1/chat/completions",
             lambda: {"model": model, "messages": _turns(99_999), "max_tokens": 1}, 400),
        Load("count_tokens 660k chars", "/v1/messages/count_tokens", lambda: {"model": model, "messages": one}, 200),
        Load("estimate 660k chars", "/v1/estimate", lambda: {"model": model, "messages": one}, 200),
        Load("messages 660k chars", "/v1/messages", lambda: {"model": model, "messages": one, "max_tokens": 1}, 400),
        Load("responses 660k chars", "/v1/responses", lambda: {"model": model, "input": one, "max_output_tokens": 1},
             400),
        Load("chat 660k chars", "/v1/chat/completions", lambda: {"model": model, "messages": one, "max_tokens": 1},
             400),
    ]


def prefill_load(model: str, tokens: int) -> Load:
    """A prompt of about `tokens` tokens and one output token: the engine thread prefills the whole time."""
    content = prose(tokens * 5)
    return Load(f"prefill ~{tokens} tokens", "/v1/chat/completions",
                lambda: {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 1,
                         "temperature": 0}, 200)


@dataclass
class Poller:
    """GET /health every `interval_s` on its own connection; each latency is one request's round trip."""

    base_url: str
    interval_s: float = 0.02
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Poller:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(120)

    def _run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=120) as client:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                try:
                    r = client.get("/health")
                    if r.status_code != 200:
                        self.failures.append(f"{r.status_code} {r.text[:200]}")
                except httpx.HTTPError as e:
                    self.failures.append(repr(e))
                self.latencies.append(time.perf_counter() - t0)
                self._stop.wait(self.interval_s)


@dataclass(frozen=True)
class Figures:
    n: int
    p50: float
    p99: float
    worst: float

    def __str__(self) -> str:
        ms = [f"{x * 1e3:8.1f} ms" for x in (self.p50, self.p99, self.worst)]
        return f"n={self.n:4d}  p50 {ms[0]}  p99 {ms[1]}  max {ms[2]}"


def figures(latencies: list[float]) -> Figures:
    s = sorted(latencies)
    if not s:
        return Figures(0, 0.0, 0.0, 0.0)
    return Figures(len(s), statistics.median(s), s[min(len(s) - 1, round(0.99 * (len(s) - 1)))], s[-1])


def quiet(base_url: str, seconds: float = 2.0) -> Figures:
    with Poller(base_url) as p:
        time.sleep(seconds)
    return figures(p.latencies)


@dataclass(frozen=True)
class Outcome:
    load: Load
    status: int
    body: dict[str, Any]
    seconds: float
    health: Figures
    failures: list[str]


def under(base_url: str, load: Load, timeout_s: float = 600) -> Outcome:
    """Send the load's request while polling /health; the figures cover the request's whole span."""
    # Serialized first: json.dumps of 30 MB in this process would stall the poller thread, not the server.
    raw = json.dumps(load.body()).encode()
    with httpx.Client(base_url=base_url, timeout=timeout_s) as client, Poller(base_url) as p:
        time.sleep(0.1)  # a few quiet polls first, so the poller's connection is open
        t0 = time.perf_counter()
        r = client.post(load.path, content=raw, headers={"content-type": "application/json"})
        seconds = time.perf_counter() - t0
    return Outcome(load, r.status_code, r.json(), seconds, figures(p.latencies), p.failures)
