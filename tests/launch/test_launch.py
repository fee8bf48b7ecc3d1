"""`gmlx launch` against a real HTTP server (uvicorn over fake engines) with stand-in client binaries.

The real Claude Code and pi run in tests/agents (slow); here the clients are scripts that record
the argv, environment and config file they were started with, so each refusal and each written
setting is checked quickly, both with the client present and absent.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import httpx
import pytest

from gmlx_server.config import RuntimeEnv
from gmlx_server.launch.server import too_small
from gmlx_server.launch.sizing import (
    FIXED_PROMPT,
    context_window,
    fitting_max_output,
    models_that_fit,
    needed_window,
)
from tests.e2e.server import free_port
from tests.fakes import FakeFactory
from tests.routes.conftest import Served, ThreadedServer, make_config, serve

RECORDER = """#!{python}
import json, os, sys
from pathlib import Path
home = Path(os.environ.get("PI_CODING_AGENT_DIR", "/nonexistent")) / "models.json"
record = {{"argv": sys.argv, "env": dict(os.environ),
           "models_json": json.loads(home.read_text()) if home.is_file() else None}}
Path(os.environ["RECORD_TO"]).write_text(json.dumps(record))
sys.exit(7)
"""


@pytest.fixture
def server() -> Iterator[tuple[str, Served]]:
    """m1 with a 32K window whose tools render compactly past a quarter of it, m2 (alias fast) with 4K: beside
    Claude Code's 20K prompt (5.3K with its tools compact) only m1 fits."""
    config = make_config(("m1", "m2"), aliases={"fast": "m2"}, api_key="sekrit", env=RuntimeEnv(sse_keepalive_s=0.05))
    small = dataclasses.replace(config.models["m2"], max_kv_size=4096)
    compact = dataclasses.replace(config.models["m1"], tool_prompt_budget=0.25)
    s = serve(dataclasses.replace(config, models=MappingProxyType({**config.models, "m1": compact, "m2": small})),
              FakeFactory(context_length=32768))
    with ThreadedServer(s.app) as url:
        yield url, s


def launch(tmp_path: Path, args: list[str], clients: tuple[str, ...] = ("claude", "codex", "opencode", "pi"),
           env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name in clients:
        script = bindir / name
        script.write_text(RECORDER.format(python=sys.executable))
        script.chmod(0o755)
    record = tmp_path / "record.json"
    full_env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path), "RECORD_TO": str(record),
                "PI_CODING_AGENT_DIR": str(tmp_path / "pi"), "ANTHROPIC_API_KEY": "real-cloud-key",
                **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "gmlx_server.cli", "launch", *args], env=full_env,
                          capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2])
    return proc, (json.loads(record.read_text()) if record.is_file() else None)


def test_pi_gets_a_provider_that_fits_the_window_and_its_arguments(tmp_path: Path,
                                                                   server: tuple[str, Served]) -> None:
    url, s = server
    (tmp_path / "pi").mkdir()
    (tmp_path / "pi" / "models.json").write_text(json.dumps({"providers": {
        "ollama": {"baseUrl": "x", "models": [{"id": "llama"}]},
        "gmlx": {"models": [{"id": "m2", "contextWindow": 1}, {"id": "other"}]}}}))
    proc, rec = launch(tmp_path, ["pi", "--model", "m2", "--url", url, "--api-key", "sekrit", "--",
                                  "-p", "hello"])
    assert proc.returncode == 7, proc.stderr  # the client's own exit status: launch exec'd it
    assert rec is not None and rec["argv"][1:] == ["--provider", "gmlx", "--model", "m2", "-p", "hello"]
    providers = rec["models_json"]["providers"]
    assert providers["ollama"] == {"baseUrl": "x", "models": [{"id": "llama"}]}  # other providers kept
    gmlx = providers["gmlx"]
    assert gmlx["baseUrl"] == f"{url}/v1" and gmlx["api"] == "openai-completions" and gmlx["apiKey"] == "sekrit"
    assert [m["id"] for m in gmlx["models"]] == ["other", "m2"]
    m2 = gmlx["models"][1]
    assert m2["contextWindow"] == 4096 and m2["maxTokens"] == 1024  # the fake engines' window, a quarter
    assert "m2" in s.factory.engines and "m1" not in s.factory.engines  # /v1/keep loaded it
    assert "compaction.reserveTokens (16384)" in proc.stderr and "set it to 1024" in proc.stderr
    assert "little room" not in proc.stderr  # no generic advice: pi's 1.5K prompt fits beside 1024 tokens
    (tmp_path / "pi" / "settings.json").write_text(json.dumps({"compaction": {"reserveTokens": 1024}}))
    proc, _ = launch(tmp_path, ["pi", "--model", "m2", "--url", url, "--api-key", "sekrit"])
    assert proc.returncode == 7 and "reserveTokens" not in proc.stderr  # a reserve that fits: no advice


def test_claude_gets_environment_for_every_model_tier(tmp_path: Path, server: tuple[str, Served]) -> None:
    url, _ = server
    proc, rec = launch(tmp_path, ["claude", "--model", "fast", "--url", url, "--max-output", "500", "--", "-p", "hi"],
                       env={"GMLX_API_KEY": "sekrit"})
    assert proc.returncode == 7, proc.stderr
    assert rec is not None and rec["argv"][1:] == ["-p", "hi"]
    env = rec["env"]
    assert env["ANTHROPIC_BASE_URL"] == url and env["ANTHROPIC_AUTH_TOKEN"] == "sekrit"
    assert "ANTHROPIC_API_KEY" not in env  # a cloud key in the shell must not win over the local token
    assert env["ANTHROPIC_MODEL"] == env["ANTHROPIC_DEFAULT_SONNET_MODEL"] == "fast"
    # side calls (titles, summaries) at batch priority, so they queue behind the turn the user waits on
    assert env["ANTHROPIC_SMALL_FAST_MODEL"] == env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "fast@batch"
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "500"
    assert "its first request is over the 4096-token window" in proc.stderr  # --max-output starts it anyway


def test_a_client_whose_own_prompt_leaves_no_room_is_refused_naming_the_models_that_fit(
        tmp_path: Path, server: tuple[str, Served]) -> None:
    url, _ = server
    proc, rec = launch(tmp_path, ["claude", "--model", "fast", "--url", url, "--api-key", "sekrit"])
    assert proc.returncode == 2 and rec is None and "no served model fits" in proc.stderr  # m1's window unknown
    assert f"at least {needed_window(FIXED_PROMPT['claude'])} tokens" in proc.stderr
    httpx.post(f"{url}/v1/keep", json={"model": "m1"}, headers={"Authorization": "Bearer sekrit"}, timeout=30)
    proc, rec = launch(tmp_path, ["claude", "--model", "fast", "--url", url, "--api-key", "sekrit"])
    assert proc.returncode == 2 and rec is None
    assert f"about {FIXED_PROMPT['claude'].compact} tokens" in proc.stderr  # its tools compact, and still too big
    assert "more than half the 4096-token window of 'm2'" in proc.stderr
    assert "served models that fit: m1" in proc.stderr and "clamp" not in proc.stderr
    proc, rec = launch(tmp_path, ["claude", "--model", "m1", "--url", url, "--api-key", "sekrit"])
    assert proc.returncode == 7 and rec is not None
    sized = fitting_max_output(32768, FIXED_PROMPT["claude"].at(32768, 0.25))
    assert rec["env"]["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == str(sized) == "8192"


@pytest.mark.parametrize("client, package", [("claude", "@anthropic-ai/claude-code"),
                                             ("pi", "@mariozechner/pi-coding-agent"),
                                             ("codex", "@openai/codex"), ("opencode", "opencode-ai")])
def test_a_missing_client_is_refused_with_how_to_install_it(tmp_path: Path, client: str, package: str) -> None:
    proc, rec = launch(tmp_path, [client, "--model", "m1", "--url", f"http://127.0.0.1:{free_port()}"],
                       clients=())
    assert proc.returncode == 127 and rec is None
    assert "not installed" in proc.stderr and f"npm install -g {package}" in proc.stderr


def test_no_server_is_refused_and_nothing_is_started(tmp_path: Path) -> None:
    proc, rec = launch(tmp_path, ["pi", "--model", "m1", "--url", f"http://127.0.0.1:{free_port()}"])
    assert proc.returncode == 1 and rec is None
    assert "no gmlx server answers" in proc.stderr and "gmlx serve" in proc.stderr
    assert not (tmp_path / "pi" / "models.json").exists()


def test_unknown_model_wrong_key_and_oversized_output_are_refused(tmp_path: Path,
                                                                  server: tuple[str, Served]) -> None:
    url, _ = server
    proc, _ = launch(tmp_path, ["pi", "--model", "nope", "--url", url, "--api-key", "sekrit"])
    assert proc.returncode == 1 and "404" in proc.stderr and "m1, m2" in proc.stderr
    proc, _ = launch(tmp_path, ["pi", "--model", "m1", "--url", url, "--api-key", "wrong"])
    assert proc.returncode == 1 and "401" in proc.stderr
    proc, rec = launch(tmp_path, ["pi", "--model", "m2", "--url", url, "--api-key", "sekrit",
                                  "--max-output", "4096"])
    assert proc.returncode == 2 and "does not fit" in proc.stderr and rec is None


def test_dry_run_prints_the_command_without_running_it(tmp_path: Path, server: tuple[str, Served]) -> None:
    url, _ = server
    proc, rec = launch(tmp_path, ["claude", "--model", "m1", "--url", url, "--api-key", "sekrit", "--dry-run"])
    assert proc.returncode == 0 and rec is None and "claude" in proc.stderr


def test_window_and_output_rules() -> None:
    assert context_window({"context_length": 32768, "max_context_at_width_1": None}) == 32768
    assert context_window({"context_length": 32768, "max_context_at_width_1": 9000}) == 9000
    assert (fitting_max_output(8192), fitting_max_output(32768), fitting_max_output(1 << 20)) == (2048, 8192, 32000)
    assert fitting_max_output(300) is None  # a quarter of it is no answer
    # SmolLM2's 8K window: opencode's 7.6K fits only because the server renders its tools compactly past half the
    # window (3.1K in all); Codex's 6.2K and Claude Code's 5.3K (compact) take more than half of it: refused
    assert [fitting_max_output(8192, FIXED_PROMPT[c].at(8192)) for c in ("opencode", "codex", "pi", "claude")] == [
        2048, None, 2048, None]
    assert fitting_max_output(8192, FIXED_PROMPT["opencode"].full) is None
    assert (fitting_max_output(8192, 4096), fitting_max_output(8192, 4097)) == (2048, None)  # half is the line
    assert FIXED_PROMPT["claude"].at(40_000) == FIXED_PROMPT["claude"].full  # tools under half: in full
    # 17,027 SmolLM2 tokens are over half of 32768, but Qwen writes them in 15,967: within the tokenizers' spread
    # of the line launch counts them in full, and Claude Code's 20K is more than half the window
    assert fitting_max_output(32768, FIXED_PROMPT["claude"].at(32768)) is None
    assert FIXED_PROMPT["claude"].compact_budget(32768) == 0.45  # which renders them compactly on any tokenizer
    assert fitting_max_output(32768, FIXED_PROMPT["claude"].at(32768, 0.45)) == 8192
    refusal = too_small("Claude Code", 20223, "qwen", 32768, [], 10672, 0.45)
    assert "or serve 'qwen' with tool_prompt_budget: 0.45, which renders its tools compactly" in refusal
    assert "at least" not in refusal  # its 32K window is not what is short: no window advice beside a 32K model
    assert "at least 10672 tokens" in too_small("Claude Code", 5336, "smollm2", 8192, [], 10672, None)
    assert FIXED_PROMPT["codex"].compact_budget(32768) is None  # not measured compactly
    # the model's own tool_prompt_budget, against its whole window, as the server weighs them
    row = {"context_length": 40_000, "max_context_at_width_1": 30_000, "tool_prompt_budget": 0.25}
    assert FIXED_PROMPT["claude"].on(row) == FIXED_PROMPT["claude"].compact
    assert FIXED_PROMPT["claude"].on({**row, "tool_prompt_budget": 1.0}) == FIXED_PROMPT["claude"].full
    assert fitting_max_output(4096, FIXED_PROMPT["claude"].at(4096)) is None
    rows = [{"id": "tiny", "kind": "chat", "context_length": 4096}, {"id": "e", "kind": "embeddings"},
            {"id": "gemma", "kind": "chat", "context_length": 32768, "max_context_at_width_1": 30000,
             "tool_prompt_budget": 0.25}, {"id": "qwen", "kind": "chat", "context_length": 32768}]
    assert models_that_fit(rows, FIXED_PROMPT["claude"]) == ["gemma"]  # qwen renders Claude Code's tools in full
    # a base model ends no turn unless its profile's stop strings end it
    base = {"kind": "chat", "context_length": 32768, "base": True, "tool_prompt_budget": 0.25}
    assert models_that_fit([{**base, "id": "b", "stop": []}, {**base, "id": "s", "stop": ["\n"]}],
                           FIXED_PROMPT["claude"]) == ["s"]
    assert needed_window(FIXED_PROMPT["claude"]) == 2 * 5336
    assert fitting_max_output(2 * 5336, FIXED_PROMPT["claude"].at(2 * 5336)) == 2 * 5336 // 4
    assert "no served model fits: serve one with a window of at least 10672" in too_small(
        "Claude Code", 5336, "tiny", 4096, models_that_fit(rows[:1], FIXED_PROMPT["claude"]), 10672)


def test_launch_is_listed_in_gmlx_help() -> None:
    out = subprocess.run([sys.executable, "-m", "gmlx_server.cli", "--help"], capture_output=True, text=True,
                         env={**os.environ}, timeout=60).stdout
    assert "launch" in out


def test_client_arguments_pass_through_with_or_without_the_separator(tmp_path: Path,
                                                                    server: tuple[str, Served]) -> None:
    url, _ = server
    proc, rec = launch(tmp_path, ["pi", "--model", "m1", "-p", "hi", "--url", url, "--api-key", "sekrit",
                                  "--thinking", "off", "--", "--model", "not-launch's"])
    assert proc.returncode == 7, proc.stderr  # was an argparse error before `--` became optional
    assert rec is not None and rec["argv"][1:] == ["--provider", "gmlx", "--model", "m1", "-p", "hi",
                                                   "--thinking", "off", "--model", "not-launch's"]
    proc, rec = launch(tmp_path, ["pi", "--model", "m1", "--url", url, "--api-key", "sekrit", "--max", "3"])
    assert rec is not None and rec["argv"][-2:] == ["--max", "3"]  # never abbreviated to --max-output


def test_help_says_how_to_separate_ambiguous_client_arguments() -> None:
    out = subprocess.run([sys.executable, "-m", "gmlx_server.cli", "launch", "--help"], capture_output=True,
                         text=True, timeout=60).stdout
    assert "after -- goes to the client" in out and "codex" in out and "opencode" in out
    assert "CODEX_HOME" in out and "XDG_CONFIG_HOME" in out  # where each client's config is written


OPENCODE_JSON = {"$schema": "https://opencode.ai/config.json", "model": "anthropic/claude", "theme": "x",
                 "provider": {"ollama": {"npm": "@ai-sdk/openai-compatible", "models": {"llama": {}}},
                              "gmlx": {"models": {"other": {"limit": {"context": 1, "output": 1}},
                                                  "m1": {"limit": {"context": 1, "output": 1}}}}}}


def test_opencode_gets_a_provider_with_limits_and_the_model_for_this_run_only(
        tmp_path: Path, server: tuple[str, Served]) -> None:
    url, _ = server
    config = tmp_path / ".config" / "opencode" / "opencode.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps(OPENCODE_JSON))
    proc, rec = launch(tmp_path, ["opencode", "--model", "m1", "--url", url, "--api-key", "sekrit", "run", "hi"],
                       env={"OPENCODE_CONFIG_CONTENT": '{"share": "disabled", "model": "x/y"}'})
    assert proc.returncode == 7, proc.stderr
    assert rec is not None and rec["argv"][1:] == ["run", "hi"]
    data = json.loads(config.read_text())
    assert {k: data[k] for k in ("$schema", "model", "theme")} == {k: OPENCODE_JSON[k] for k in
                                                                    ("$schema", "model", "theme")}
    assert data["provider"]["ollama"] == OPENCODE_JSON["provider"]["ollama"]  # other providers kept
    gmlx = data["provider"]["gmlx"]
    assert gmlx["npm"] == "@ai-sdk/openai-compatible"
    assert gmlx["options"] == {"baseURL": f"{url}/v1", "apiKey": "sekrit"}
    assert list(gmlx["models"]) == ["other", "m1"]  # other models kept, the launched one replaced
    assert gmlx["models"]["m1"]["limit"] == {"context": 32768, "output": 8192}
    inline = json.loads(rec["env"]["OPENCODE_CONFIG_CONTENT"])  # the user's inline config, the model on top
    assert inline == {"share": "disabled", "model": "gmlx/m1", "small_model": "gmlx/m1"}


def test_opencode_config_with_comments_is_left_alone(tmp_path: Path, server: tuple[str, Served]) -> None:
    url, _ = server
    config = tmp_path / "xdg" / "opencode" / "opencode.json"
    config.parent.mkdir(parents=True)
    config.write_text('{\n  // mine\n  "theme": "x",\n}\n')
    proc, rec = launch(tmp_path, ["opencode", "--model", "m1", "--url", url, "--api-key", "sekrit"],
                       env={"XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert proc.returncode == 1 and rec is None
    assert "not plain JSON" in proc.stderr and "--config-home" in proc.stderr
    assert config.read_text() == '{\n  // mine\n  "theme": "x",\n}\n'


CODEX_TOML = '''# my settings
model = "gpt-5"  # the cloud default stays
approval_policy = "on-request"

[model_providers.gmlx]
name = "old"
base_url = "http://old/v1"
stream_max_retries = 9

[model_providers.gmlx.http_headers]
X-Old = "1"

[model_providers.ollama]
name = "Ollama"
base_url = "http://localhost:11434/v1"

[mcp_servers.docs]
command = "docs-mcp"
args = ["--port", "1"]
'''


def test_codex_gets_a_provider_merged_into_config_toml_and_the_model_in_a_profile(
        tmp_path: Path, server: tuple[str, Served]) -> None:
    url, _ = server
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(CODEX_TOML)
    proc, rec = launch(tmp_path, ["codex", "--model", "m1", "--url", url, "--api-key", "sekrit", "exec",
                                  "--skip-git-repo-check", "say hi"], env={"CODEX_HOME": str(home)})
    assert proc.returncode == 7, proc.stderr
    assert rec is not None and rec["argv"][1:] == ["--profile", "gmlx", "exec", "--skip-git-repo-check", "say hi"]
    assert rec["env"]["GMLX_API_KEY"] == "sekrit"  # Codex reads the key from the variable env_key names
    assert "default_max_tokens (4096), at most half of what its prompt leaves in the window" in proc.stderr
    text = (home / "config.toml").read_text()
    assert "# my settings" in text and "# the cloud default stays" in text and "sekrit" not in text
    after, before = tomllib.loads(text), tomllib.loads(CODEX_TOML)
    assert after["model_providers"].pop("gmlx") == {
        "name": "gmlx", "base_url": f"{url}/v1", "wire_api": "responses", "requires_openai_auth": False,
        "env_key": "GMLX_API_KEY"}
    before["model_providers"].pop("gmlx")
    assert after == before  # every other setting as it was
    profile = tomllib.loads((home / "gmlx.config.toml").read_text())
    assert profile == {"model": "m1", "model_provider": "gmlx", "model_context_window": 32768,
                       "model_auto_compact_token_limit": 24576}


def test_codex_inline_provider_is_refused_and_config_home_isolates(tmp_path: Path,
                                                                   server: tuple[str, Served]) -> None:
    url, _ = server
    home = tmp_path / ".codex"
    home.mkdir()
    inline = 'model_providers = { gmlx = { name = "mine", base_url = "http://x" } }\n'
    (home / "config.toml").write_text(inline)
    proc, rec = launch(tmp_path, ["codex", "--model", "m1", "--url", url, "--api-key", "sekrit"])
    assert proc.returncode == 1 and rec is None and "cannot replace [model_providers.gmlx]" in proc.stderr
    assert (home / "config.toml").read_text() == inline
    proc, rec = launch(tmp_path, ["codex", "--model", "m1", "--url", url, "--config-home", str(tmp_path / "iso"),
                                  "--api-key", "sekrit"])
    assert proc.returncode == 7 and rec is not None and rec["env"]["CODEX_HOME"] == str(tmp_path / "iso")
    assert tomllib.loads((tmp_path / "iso" / "config.toml").read_text())["model_providers"]["gmlx"]["name"] == "gmlx"
    assert (home / "config.toml").read_text() == inline  # the user's own home untouched


def test_codex_without_a_key_names_no_key_variable(tmp_path: Path) -> None:
    from gmlx_server.launch.codex import merge_provider, provider_table
    text = merge_provider("", provider_table("http://h:1", None), tmp_path / "config.toml")
    assert tomllib.loads(text) == {"model_providers": {"gmlx": {
        "name": "gmlx", "base_url": "http://h:1/v1", "wire_api": "responses", "requires_openai_auth": False}}}
