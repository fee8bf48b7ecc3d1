"""The configuration reference stays true: every key the parser accepts and every variable the server
reads is in docs/configuration.md, and the example files there and in README load with the real parser."""

from __future__ import annotations

import re
from pathlib import Path

from gmlx_server.config import assistants, env, parse, service_entries
from gmlx_server.config.draft import DRAFT_KEYS
from gmlx_server.config.parse import parse as parse_config
from tests.conftest import smollm2_path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = (ROOT / "docs" / "configuration.md").read_text()
README = (ROOT / "README.md").read_text()


def accepted_keys() -> set[str]:
    return (set(parse._SERVER_KINDS) | set(parse._MODEL_KINDS) | set(parse._KV_QUANT_KINDS) | parse._PROFILE_KEYS
            | parse._TOP_KEYS | DRAFT_KEYS | {"kv_quant"} | set(service_entries.KINDS)
            | set(service_entries._COMMON) | {"aliases"}
            | {k for kind in service_entries.OPTIONS.values() for k in kind}
            | assistants.KEYS)


def test_every_key_and_variable_is_in_the_reference() -> None:
    assert not sorted(k for k in accepted_keys() if f"`{k}`" not in REFERENCE)
    variables = set(re.findall(r'"((?:GMLX|TOP|HF|XDG)_[A-Z_]+)"', Path(env.__file__).read_text()))
    assert len(variables) > 15 and not sorted(v for v in variables if f"`{v}`" not in REFERENCE)


def examples(text: str) -> list[str]:
    return [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "models:" in b]


def test_the_example_files_load(tmp_path: Path) -> None:
    """Paths become the test model (and a template file, a models_dir): every key as written is accepted."""
    (tmp_path / "t.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    section = README[README.index("## Configuration\n"):README.index("## Layout\n")]
    blocks = examples(REFERENCE) + examples(section)
    assert len(blocks) == 2
    for block in blocks:
        text = re.sub(r"\bpath: [^,}\s]+", f"path: {smollm2_path()}", block)
        text = re.sub(r"\bmmproj: \S+", f"mmproj: {smollm2_path()}", text)  # the parser checks only that it exists
        text = re.sub(r"models_dir: \S+", f"models_dir: {tmp_path}", text)
        text = re.sub(r"chat_template: \S+", f"chat_template: {tmp_path / 't.jinja'}", text)
        cfg = parse_config(str(tmp_path / "gmlx.yaml"), text)
        assert cfg.models and cfg.aliases
