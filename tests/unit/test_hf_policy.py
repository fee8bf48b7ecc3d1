"""The Hugging Face policy: hf: refs and repo ids resolve from the local hub cache only (read as folders),
repo ids at the loader get 403 hf_access_disabled, and a request never names its way to a download."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import pytest

from gmlx_server.config import ConfigError, ModelEntry, RuntimeEnv, ServerConfig, ServerSettings, load_config, read_env
from gmlx_server.hf_cache import looks_like_repo_id, looks_remote, resolve_file, resolve_repo, split_hf_ref
from gmlx_server.startup import prepare_process
from tests.fakes import FakeEngine, FakeFactory
from tests.routes.conftest import make_config, serve

HUB_IDS = ("HuggingFaceTB/SmolLM2-135M-Instruct", "hf:org/repo/model.gguf", "org/repo@main",
           "https://huggingface.co/org/repo/resolve/main/model.gguf")
ROUTES = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"prompt": "hi"},
    "/v1/messages": {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/responses": {"input": "hi"},
}


@pytest.fixture
def hub(tmp_path: Path) -> Path:
    """A hub cache holding org/repo at two revisions (refs/main names the older) and org/multi with two GGUFs."""
    cache = tmp_path / "hub"
    root = cache / "models--org--repo"
    (root / "blobs").mkdir(parents=True)
    (root / "blobs" / "b1").write_bytes(b"GGUF main")
    for rev in ("main-rev", "newer-rev"):
        (root / "snapshots" / rev / "sub").mkdir(parents=True)
        (root / "snapshots" / rev / "model.gguf").symlink_to(root / "blobs" / "b1")
        (root / "snapshots" / rev / "sub" / "x.gguf").write_bytes(b"GGUF")
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("main-rev\n")
    multi = cache / "models--org--multi" / "snapshots" / "r"
    multi.mkdir(parents=True)
    for name in ("a.gguf", "b.gguf"):
        (multi / name).write_bytes(b"GGUF")
    return cache


def test_shapes() -> None:
    assert split_hf_ref("hf:org/repo/sub/x.gguf") == ("org/repo", "sub/x.gguf")
    for bad in ("hf:org/repo", "hf:org/repo/", "hf:org/repo/../x.gguf", "hf:/abs/x.gguf"):
        assert split_hf_ref(bad) is None, bad
    assert looks_like_repo_id("org/repo") and looks_like_repo_id("Org.1/re_po-2")
    for not_repo in ("model.gguf", "/abs/path", "a/b/c", "org/model.gguf", "./x/y", "org/repo@main"):
        assert not looks_like_repo_id(not_repo), not_repo
    assert looks_remote("https://huggingface.co/x") and looks_remote("hf:a/b/c.gguf") and looks_remote("org/repo")
    assert not looks_remote("/models/x.gguf")


def test_resolution_reads_the_cache_folders(hub: Path) -> None:
    snaps = hub / "models--org--repo" / "snapshots"
    assert resolve_file(hub, "org/repo", "model.gguf") == snaps / "main-rev" / "model.gguf"  # refs/main wins
    assert resolve_file(hub, "org/repo", "sub/x.gguf") == snaps / "main-rev" / "sub" / "x.gguf"
    assert resolve_file(hub, "org/repo", "absent.gguf") is None and resolve_file(hub, "org/none", "x.gguf") is None
    assert resolve_repo(hub, "org/repo") == snaps / "main-rev" / "model.gguf"  # its one GGUF
    assert resolve_repo(hub, "org/multi") == hub / "models--org--multi" / "snapshots" / "r"
    assert resolve_repo(hub, "org/none") is None


def test_hub_cache_location_follows_huggingface_hub() -> None:
    assert read_env({}).hf_hub_cache is None  # then ~/.cache/huggingface/hub
    assert read_env({"HF_HOME": "/h"}).hf_hub_cache == "/h/hub"
    assert read_env({"HF_HOME": "/h", "HF_HUB_CACHE": "/c"}).hf_hub_cache == "/c"
    assert read_env({"XDG_CACHE_HOME": "/x"}).hf_hub_cache == "/x/huggingface/hub"


def _write(tmp_path: Path, path: str, hf_cache: bool = False) -> str:
    cfg = tmp_path / "gmlx.yaml"
    cfg.write_text(f"server:\n  hf_cache: {str(hf_cache).lower()}\nmodels:\n  m:\n    path: {path}\n")
    return str(cfg)


def test_hf_ref_in_the_config_resolves_from_the_cache_or_fails_at_load(hub: Path, tmp_path: Path) -> None:
    env = RuntimeEnv(hf_hub_cache=str(hub))
    cfg = load_config(_write(tmp_path, "hf:org/repo/model.gguf"), env=env)
    assert cfg.models["m"].path == str(hub / "models--org--repo" / "snapshots" / "main-rev" / "model.gguf")
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, "hf:org/repo/missing.gguf"), env=env)
    assert e.value.key == "models.m.path" and "not in the local Hugging Face cache" in e.value.what
    assert "never downloads" in e.value.what
    with pytest.raises(ConfigError, match=r"expected hf:org/repo/path/file\.gguf"):
        load_config(_write(tmp_path, "hf:org/repo"), env=env)


def test_hf_cache_true_runs_the_hf_libraries_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # recorded, so what prepare_process sets is undone after
    monkeypatch.delenv("HF_HUB_OFFLINE")
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    prepare_process(load_config(_write(tmp_path, "m.gguf")))
    assert "HF_HUB_OFFLINE" not in os.environ
    cfg = load_config(_write(tmp_path, "org/repo", hf_cache=True))  # a repo id passes the config: the loader judges
    assert "HF_HUB_OFFLINE" not in os.environ and cfg.models["m"].path == "org/repo"  # loading has no side effects
    prepare_process(cfg)  # what the entry points do before any model loads
    assert os.environ["HF_HUB_OFFLINE"] == "1"


def _repo_config(path: str, hf_cache: bool, hub: Path) -> ServerConfig:
    return ServerConfig(ServerSettings(hf_cache=hf_cache), MappingProxyType({"m": ModelEntry(id="m", path=path)}),
                        env=RuntimeEnv(hf_hub_cache=str(hub)))


@pytest.mark.parametrize("path", ["org/repo", "org/absent", "https://huggingface.co/org/repo", "hf:org/x/y.gguf"])
def test_a_remote_path_at_the_loader_is_403_without_hf_cache(path: str, hub: Path) -> None:
    s = serve(_repo_config(path, False, hub))
    r = s.chat({"model": "m"})
    assert r.status_code == 403 and r.json()["error"]["type"] == "hf_access_disabled", r.text
    assert "never downloads" in r.json()["error"]["message"] and s.factory.calls == 0
    s.client.close()


@dataclass
class RecordingFactory(FakeFactory):
    paths: list[str] = field(default_factory=list)

    def __call__(self, entry: ModelEntry, env: RuntimeEnv) -> FakeEngine:
        self.paths.append(entry.path)
        return super().__call__(entry, env)


def test_hf_cache_lets_a_cached_repo_id_load_from_the_cache(hub: Path) -> None:
    factory = RecordingFactory()
    s = serve(_repo_config("org/repo", True, hub), factory)
    assert s.chat({"model": "m"}).status_code == 200
    assert factory.paths == [str(hub / "models--org--repo" / "snapshots" / "main-rev" / "model.gguf")]
    s.client.close()
    s = serve(_repo_config("org/absent", True, hub))
    r = s.chat({"model": "m"})
    assert r.status_code == 403 and "not in the local Hugging Face cache" in r.json()["error"]["message"]
    s.client.close()


@pytest.mark.parametrize("route", list(ROUTES))
def test_requests_for_unconfigured_hub_looking_ids_get_the_404(route: str) -> None:
    s = serve(make_config(("m1",)))
    for model in HUB_IDS:
        r = s.client.post(route, json={"model": model, **ROUTES[route]})
        assert r.status_code == 404, (route, model, r.text)
        assert r.json()["error"]["type"] in ("model_not_found", "not_found_error")
    assert s.factory.calls == 0
    s.client.close()


def test_resolving_never_imports_huggingface_hub(hub: Path, tmp_path: Path) -> None:
    code = ("import sys; from gmlx_server.config import load_config, RuntimeEnv; "
            "import gmlx_server.serving.hf_policy; "
            f"load_config({_write(tmp_path, 'hf:org/repo/model.gguf')!r}, env=RuntimeEnv(hf_hub_cache={str(hub)!r})); "
            "assert 'huggingface_hub' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])

