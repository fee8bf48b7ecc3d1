"""What a launcher hands back (the client's argv and environment, the files it wrote) and how it writes them."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gmlx_server.launch.server import ModelTarget

LOCAL_KEY = "gmlx-local"  # harnesses insist on a key; a keyless server ignores it


@dataclass(frozen=True)
class Invocation:
    argv: list[str]
    env: dict[str, str]
    wrote: list[Path] = field(default_factory=list)  # config files written for the client
    notes: list[str] = field(default_factory=list)


Configure = Callable[[str, str | None, ModelTarget, list[str], Mapping[str, str]], Invocation]


@dataclass(frozen=True)
class Client:
    name: str
    binary: str
    install: str  # the command that installs it
    configure: Configure
    home_env: str  # the variable naming the directory its config lives in (what --config-home sets)


def write_atomic(path: Path, text: str) -> None:
    """Write beside, then rename: a client that reloads its config while running never reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".gmlx-tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def home(env: Mapping[str, str], variable: str, *default: str) -> Path:
    """A client's config directory: its own variable when set, else DEFAULT under HOME."""
    return Path(env.get(variable) or Path(env.get("HOME", "~"), *default)).expanduser()
