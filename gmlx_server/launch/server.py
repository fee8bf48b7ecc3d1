"""What `gmlx launch` asks the server: is it up, keep the model, and how large is its window."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from gmlx_server.launch.sizing import (
    FixedPrompt,
    context_window,
    ends_no_turn,
    fitting_max_output,
    models_that_fit,
    needed_window,
)


class LaunchError(Exception):
    """A refusal `gmlx launch` prints as one line and exits with `code`."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class ModelTarget:
    requested: str  # what the client sends as its model (may carry @profile or be an alias)
    model_id: str  # the configured id it resolves to
    context_window: int
    max_output: int
    default_max_tokens: int | None = None  # the server's cap for a request that names none (/v1/models)
    fixed_prompt: int = 0  # the client's own prompt as the server will render it on this model


class ServerClient:
    def __init__(self, url: str, api_key: str | None, timeout_s: float = 900.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self.http.request(method, path, **kw)
        except httpx.TransportError as e:
            raise LaunchError(f"no gmlx server answers at {self.url} ({e.__class__.__name__}); start one first, "
                              "e.g. `gmlx serve` (gmlx launch starts nothing itself)") from None
        if r.status_code >= 400:
            raise LaunchError(f"{method} {path}: {r.status_code} {_error_text(r)}")
        return r.json()

    def check_up(self) -> None:
        self._call("GET", "/health", timeout=5.0)

    def target(self, model: str, max_output: int | None, client: str, prompt: FixedPrompt) -> ModelTarget:
        """POST /v1/keep (load and warm the model), then size the client from GET /v1/models: its output beside
        its own `fixed` prompt, or a refusal naming the served models that fit. A base model nothing stops is
        refused before it loads (an id or alias; MODEL@PROFILE is not listed, and names the profile on purpose)."""
        rows = self._call("GET", "/v1/models")["data"]
        named = next((r for r in rows if r["id"] == model), None)
        if named is not None and ends_no_turn(named):
            raise LaunchError(base_refusal(client, model, models_that_fit(rows, prompt)), 2)
        model_id = str(self._call("POST", "/v1/keep", json={"model": model})["model"])
        rows = self._call("GET", "/v1/models")["data"]  # the resident model's own window
        row = next((r for r in rows if r["id"] == model_id), None)
        if row is None:
            raise LaunchError(f"the server kept '{model_id}' but does not list it in /v1/models")
        window = context_window(row)
        fixed = prompt.on(row)
        out = max_output if max_output is not None else fitting_max_output(window, fixed)
        if out is None:
            budget = prompt.compact_budget(window) if fixed == prompt.full else None
            raise LaunchError(too_small(client, fixed, model_id, window, models_that_fit(rows, prompt),
                                        needed_window(prompt), budget), 2)
        if not 0 < out < window:
            raise LaunchError(f"--max-output {out} does not fit the {window}-token window of '{model_id}'", 2)
        return ModelTarget(model, model_id, window, out, row.get("default_max_tokens"), fixed)


def base_refusal(client: str, model_id: str, fit: list[str]) -> str:
    where = f"served models that fit: {', '.join(fit)}" if fit else "no served instruct model fits"
    return (f"'{model_id}' is a base model (no chat template of its own) with no stop strings: it never ends a "
            f"turn, so each of {client}'s replies would run to its output cap, and on to the window where the client "
            f"asks it to continue; give it a profile with stop strings (profiles.NAME.stop) and launch "
            f"'{model_id}@NAME', or serve an instruct model; {where}")


def too_small(client: str, fixed: int, model_id: str, window: int, fit: list[str], needed: int,
              budget: float | None = None) -> str:
    if fit:
        where = f"served models that fit: {', '.join(fit)}"
    elif budget is not None and window >= needed:  # the window is big enough: the tools' rendering is not
        where = "no served model fits as its tools are rendered"
    else:
        where = f"no served model fits: serve one with a window of at least {needed} tokens"
    compact = (f"; or serve '{model_id}' with tool_prompt_budget: {budget:g}, which renders its tools compactly"
               if budget is not None else "")
    return (f"{client}'s own prompt (its system prompt and tools) is about {fixed} tokens, more than half the "
            f"{window}-token window of '{model_id}': its conversation would have less room than that prompt, and a "
            f"reply that runs long fills the window (--max-output N starts it anyway); {where}{compact}")


def _error_text(r: httpx.Response) -> str:
    try:
        err = r.json().get("error", {})
    except ValueError:
        return r.text[:300]
    text = str(err.get("message", r.text[:300]))
    available = err.get("available_models")
    return f"{text} (available: {', '.join(available)})" if available else text
