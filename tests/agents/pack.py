"""Pack a capture.py directory into one session file for tests/data/agents/ (what bench/agents.py replays).

    python tests/agents/pack.py DIR --client pi --version 0.73.1 --model smollm2 --gguf smollm2 \
        [--config capture.yaml] [--prompt "turn 1" --prompt "turn 2" ...] --out tests/data/agents/pi-session.json

Only generation requests are kept (POST /v1/chat/completions, /v1/messages, /v1/responses, in the order
they were sent); `gmlx launch`'s /health, /v1/keep and /v1/models and Claude Code's count_tokens go. Headers
are cut to the ones that change how a request is read (no keys: capture.py already drops them). A request
that did not get a 200 keeps its status and the start of the error body, so a replay can tell.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

GENERATION_PATHS = ("/v1/chat/completions", "/v1/messages", "/v1/responses")
KEEP_HEADERS = ("content-type", "anthropic-version", "anthropic-beta", "user-agent", "x-app")


def is_generation(entry: dict[str, Any]) -> bool:
    return entry["method"] == "POST" and entry["path"].split("?", 1)[0] in GENERATION_PATHS


def reply_usage(reply: str) -> dict[str, int]:
    """The last usage a streamed (or whole) reply reported: the live session's prompt and cached tokens."""
    usage: dict[str, int] = {}
    for line in reply.splitlines() or [""]:
        text = line[6:] if line.startswith("data: {") else line if line.startswith("{") else ""
        try:
            event = json.loads(text) if text else {}
        except ValueError:
            continue
        u = event.get("usage") or (event.get("message") or {}).get("usage")
        if isinstance(u, dict) and ("prompt_tokens" in u or "input_tokens" in u):
            usage = {k: v for k, v in u.items() if isinstance(v, int)}
            if details := u.get("prompt_tokens_details"):
                usage["cached_tokens"] = details.get("cached_tokens") or 0
    return usage


def pack(capture: Path, client: dict[str, str], model: dict[str, Any], prompts: list[str]) -> dict[str, Any]:
    entries = sorted((json.loads(p.read_text()) for p in capture.glob("*.json")), key=lambda e: e["seq"])
    requests = []
    for e in filter(is_generation, entries):
        req: dict[str, Any] = {
            "method": e["method"], "path": e["path"],
            "headers": {k.lower(): v for k, v in e["headers"].items() if k.lower() in KEEP_HEADERS},
            "body": e["body"], "status": e["status"]}
        if e["status"] != 200:
            req["error"] = e["reply"][:2000]
        elif usage := reply_usage(e["reply"]):
            req["usage"] = usage
        requests.append(req)
    return {"client": client, "model": model, "prompts": prompts, "requests": requests}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("capture", type=Path)
    ap.add_argument("--client", required=True, help="the client's name, e.g. pi or claude")
    ap.add_argument("--version", required=True, help="the client's version")
    ap.add_argument("--model", required=True, help="the served model id the client asked for")
    ap.add_argument("--gguf", required=True, choices=("smollm2", "gemma"), help="the test model behind it")
    ap.add_argument("--config", type=Path, help="the YAML the server ran (its model path becomes {gguf})")
    ap.add_argument("--prompt", action="append", default=[], help="what each turn asked, in order")
    ap.add_argument("--note", default="", help="how the session was run")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    model: dict[str, Any] = {"id": a.model, "gguf": a.gguf}
    if a.config:
        config = yaml.safe_load(a.config.read_text())
        for entry in config.get("models", {}).values():
            entry["path"] = "{gguf}"
        model["config"] = config
    session = pack(a.capture, {"name": a.client, "version": a.version}, model, a.prompt)
    if a.note:
        session = {"note": a.note, **session}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(session, indent=1, ensure_ascii=False) + "\n")
    print(f"{a.out}: {len(session['requests'])} generation requests, {a.out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
