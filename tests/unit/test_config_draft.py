"""models.<id>.draft and draft_tokens: a configured id, a GGUF path or an hf: ref becomes a Draft; every
misconfiguration is a ConfigError naming the key, at start and at reload: the keys by load_config and
reload_config, the files (the drafter's token list against the target's) by check_drafts, which reads the
GGUF headers the config layer never opens. Tiny GGUF headers stand in for models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from gmlx_server.config import ConfigError, Draft, RuntimeEnv, load_config, reload_config
from gmlx_server.serving.model_files import check_drafts
from tests.gguf_factory import FakeTensor, write_gguf

TOKENS = [f"t{i}" for i in range(10)]


def _gguf(path: Path, tokens: list[str]) -> Path:
    meta = {f"llama.{k}": v for k, v in {"block_count": 2, "context_length": 256, "embedding_length": 64,
                                          "feed_forward_length": 96, "attention.head_count": 4,
                                          "attention.head_count_kv": 2}.items()}
    embd = FakeTensor("token_embd.weight", np.zeros((len(tokens), 64), np.float32), QT.F32)
    return write_gguf(path, [embd], metadata=meta | {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens})


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    _gguf(tmp_path / "target.gguf", TOKENS)
    _gguf(tmp_path / "small.gguf", TOKENS)
    _gguf(tmp_path / "longer.gguf", [*TOKENS, "t10"])
    _gguf(tmp_path / "other.gguf", [*TOKENS[:3], "x", *TOKENS[4:]])
    (tmp_path / "text.gguf").write_text("not a model")
    snap = tmp_path / "hub" / "models--org--drafts" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "small.gguf").symlink_to(tmp_path / "small.gguf")
    return tmp_path


def _config(tree: Path, model_keys: str, extra: str = "") -> str:
    text = (f"models:\n  coder:\n    path: target.gguf\n{model_keys}"
            f"  small:\n    path: small.gguf\n    weights: packed\n{extra}")
    p = tree / "gmlx.yaml"
    p.write_text(text)
    return str(p)


def _load(tree: Path, model_keys: str, extra: str = "") -> Draft | None:
    return check_drafts(load_config(_config(tree, model_keys, extra), env=_env(tree))).models["coder"].draft


def _env(tree: Path) -> RuntimeEnv:
    return RuntimeEnv(hf_hub_cache=str(tree / "hub"))


def test_a_configured_id_a_path_and_an_hf_ref(tree: Path) -> None:
    assert _load(tree, "    draft: small\n") == Draft(str(tree / "small.gguf"), "small", 4, "packed")
    assert _load(tree, "    draft: coder\n    draft_tokens: 7\n") == Draft(str(tree / "target.gguf"), "coder", 7)
    assert _load(tree, "    draft: small.gguf\n    draft_tokens: 1\n") == Draft(str(tree / "small.gguf"), "small", 1)
    hf = _load(tree, "    draft: hf:org/drafts/small.gguf\n")
    assert hf is not None and (hf.model_id, Path(hf.path).resolve()) == ("small", (tree / "small.gguf").resolve())
    assert _load(tree, "") is None


def test_load_key_changes_with_the_draft(tree: Path) -> None:
    cfg = load_config(_config(tree, "    draft: small\n"), env=_env(tree)).models
    other = load_config(_config(tree, "    draft: small\n    draft_tokens: 2\n"), env=_env(tree)).models
    assert cfg["coder"].load_key != other["coder"].load_key and cfg["small"].load_key == other["small"].load_key


@pytest.mark.parametrize("keys, key, what", [
    ("    draft: missing.gguf\n", "models.coder.draft", "file not found"),
    ("    draft: hf:org/drafts/none.gguf\n", "models.coder.draft", "not in the local Hugging Face cache"),
    ("    draft: text.gguf\n", "models.coder.draft", "not a GGUF file"),
    ("    draft: longer.gguf\n", "models.coder.draft", "has 11 tokens"),
    ("    draft: other.gguf\n", "models.coder.draft", "token 3 is 'x' in"),
    ("    draft: small\n    draft_tokens: 0\n", "models.coder.draft_tokens", "must be 1 to 16, got 0"),
    ("    draft: small\n    draft_tokens: 17\n", "models.coder.draft_tokens", "must be 1 to 16, got 17"),
    ("    draft: small\n    draft_tokens: four\n", "models.coder.draft_tokens", "expected int"),
    ("    draft: small\n    draft_tokens: -2\n", "models.coder.draft_tokens", "must not be negative"),
    ("    draft_tokens: 4\n", "models.coder.draft_tokens", "set without draft"),
    ("    draft: 3\n", "models.coder.draft", "expected str"),
    ("    draft: ' '\n", "models.coder.draft", "expected a configured model id"),
    ("    draft: small\n    kv_quant: {scheme: kvarn, tail_tokens: 64}\n", "models.coder.draft",
     "use kv_quant scheme uniform"),
])
def test_misconfigurations_name_the_key(tree: Path, keys: str, key: str, what: str) -> None:
    with pytest.raises(ConfigError) as e:
        _load(tree, keys)
    assert e.value.key == key and what in e.value.what, str(e.value)
    assert str(e.value).startswith(f"{tree / 'gmlx.yaml'}: {key}: ") and "\n" not in str(e.value)


def test_a_mismatch_names_both_files(tree: Path) -> None:
    with pytest.raises(ConfigError) as e:
        _load(tree, "    draft: longer.gguf\n")
    assert str(tree / "longer.gguf") in e.value.what and str(tree / "target.gguf") in e.value.what


def test_kvarn_without_a_tail_and_uniform_are_accepted(tree: Path) -> None:
    assert _load(tree, "    draft: small\n    kv_quant: {scheme: kvarn, tail_tokens: 0}\n") is not None
    assert _load(tree, "    draft: small\n    kv_quant: {scheme: uniform, bits: 8}\n") is not None


def test_the_target_must_be_a_local_gguf(tree: Path) -> None:
    (tree / "mlx-dir").mkdir()
    text = "models:\n  coder:\n    path: mlx-dir\n    draft: small.gguf\n"
    (tree / "gmlx.yaml").write_text(text)
    with pytest.raises(ConfigError) as e:
        check_drafts(load_config(str(tree / "gmlx.yaml")))
    assert e.value.key == "models.coder.path" and "must be a local GGUF file" in e.value.what


def test_reload_refuses_a_broken_draft(tree: Path) -> None:
    running = load_config(_config(tree, "    draft: small\n"), env=_env(tree))
    _config(tree, "    draft: longer.gguf\n")
    with pytest.raises(ConfigError) as e:
        check_drafts(reload_config(running))
    assert e.value.key == "models.coder.draft" and "has 11 tokens" in e.value.what
    _config(tree, "    draft: small.gguf\n    draft_tokens: 6\n")
    assert check_drafts(reload_config(running)).models["coder"].draft == Draft(str(tree / "small.gguf"), "small", 6)




def test_the_config_layer_reads_no_header(tree: Path) -> None:
    """load_config takes a drafter with another token list; only check_drafts, reading both files, refuses it."""
    cfg = load_config(_config(tree, "    draft: longer.gguf\n"), env=_env(tree))
    assert cfg.models["coder"].draft == Draft(str(tree / "longer.gguf"), "longer", 4)
    with pytest.raises(ConfigError, match="has 11 tokens"):
        check_drafts(cfg)
