"""The README's first-request examples, run as written against a real `gmlx serve` with no arguments (the
embedded SmolLM2): its curl command and its SDK snippet, only the address moved to the test server's port, so
the README cannot show a request that fails. Its config examples are parsed in tests/unit/test_config_reference.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.e2e.server import ROOT, LiveServer

pytestmark = pytest.mark.slow
README = (ROOT / "README.md").read_text()
ADDRESS = "http://127.0.0.1:8080"


def block(lang: str, after: str) -> str:
    """The first ```lang block after the heading or sentence `after`."""
    found = re.search(rf"```{lang}\n(.*?)```", README[README.index(after):], re.S)
    assert found is not None, f"no {lang} block after {after!r}"
    return found.group(1)


def run(cmd: list[str], server: LiveServer) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr + server.log()[-3000:]
    return proc.stdout


def test_the_first_requests_curl_answers(default_server: LiveServer) -> None:
    curl = block("bash", "## A first request")
    assert ADDRESS in curl
    reply = json.loads(run(["bash", "-c", curl.replace(ADDRESS, default_server.base_url)], default_server))
    assert reply["object"] == "chat.completion" and reply["choices"][0]["message"]["content"]


def test_the_sdk_snippet_answers_on_both_protocols(default_server: LiveServer) -> None:
    snippet = block("python", "The official SDKs work unchanged")
    assert snippet.count(ADDRESS) == 2  # the OpenAI base URL (with /v1) and the Anthropic one
    # the snippet's own names: each SDK's reply has text
    check = "\nassert reply.choices[0].message.content and message.content[0].text\n"
    run([sys.executable, "-c", snippet.replace(ADDRESS, default_server.base_url) + check], default_server)


def test_the_set_up_block_names_scripts_that_exist() -> None:
    for line in block("bash", "# gmlx").splitlines():
        script = re.match(r"bash (\S+)", line)
        assert script is not None and (ROOT / script.group(1)).is_file(), line
