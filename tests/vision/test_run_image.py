"""`gmlx run --image` on the tiny Gemma 3: a file and a loopback URL give transformers' greedy text; two
images too; an image for a model without --mmproj exits 2 with the server's refusal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.server import ROOT, production_env
from tests.vision.conftest import NEW_TOKENS, ImageServer, hf_messages, png, reference
from tests.vision.tiny_models import tiny_vlm

pytestmark = [pytest.mark.slow, pytest.mark.reference]
QUESTION = "What is in this image?"


def gmlx_run(*args: str) -> subprocess.CompletedProcess[str]:
    m = tiny_vlm("gemma3")
    cmd = [sys.executable, "-m", "gmlx_server.cli", "run", str(m.text_gguf), *args, "--temperature", "0",
           "--max-tokens", str(NEW_TOKENS)]
    return subprocess.run(cmd, cwd=ROOT, env=production_env(), capture_output=True, text=True, timeout=300)


def test_run_with_images(tmp_path: Path, image_server: ImageServer) -> None:
    mmproj = str(tiny_vlm("gemma3").mmproj_gguf)
    (tmp_path / "a.png").write_bytes(png(1))
    expected = reference("gemma3").run(hf_messages(QUESTION), [png(1)])
    for image in (str(tmp_path / "a.png"), image_server.url("/img/a.png")):
        done = gmlx_run(QUESTION, "--mmproj", mmproj, "--image", image)
        assert done.returncode == 0, done.stderr
        assert done.stdout.rstrip("\n") == expected.text.rstrip("\n")
    two = reference("gemma3").run(hf_messages("Compare them.", images=2), [png(1), png(2)])
    done = gmlx_run("Compare them.", "--mmproj", mmproj, "--image", str(tmp_path / "a.png"), "--image",
                    image_server.url("/img/b.png"))
    assert done.returncode == 0 and done.stdout.rstrip("\n") == two.text.rstrip("\n")


def test_run_refuses_an_image_for_a_text_only_model(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(png(1))
    done = gmlx_run(QUESTION, "--image", str(tmp_path / "a.png"))
    assert done.returncode == 2 and "'--image[0]'" in done.stderr and "not a vision model" in done.stderr
