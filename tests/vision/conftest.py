"""Vision fixtures: test images, transformers' reference run of the tiny models, a loopback image server
(good, slow, huge, redirecting and mistyped URLs), and one real `gmlx serve` with both vision families and
a text-only model."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from tests.conftest import smollm2_path
from tests.e2e.server import LiveServer, gmlx_serve
from tests.vision.tiny_models import TinyVLM, tiny_vlm

FAMILIES = ("gemma3", "idefics3")
MODEL_IDS = {"gemma3": "gemma-vlm", "idefics3": "idefics-vlm"}
NEW_TOKENS = 16
FETCH_TIMEOUT_S = 1.0  # the server's image_fetch_timeout_s: the slow URL never finishes within it
MAX_IMAGE_BYTES = 100 * 1024  # the server's image_max_bytes


def png(seed: int, width: int = 56, height: int = 40, fmt: str = "PNG") -> bytes:
    """A noise image: different seeds give different pixels (and so different image features)."""
    from PIL import Image

    pixels = (np.random.RandomState(seed).rand(height, width, 3) * 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt)
    return out.getvalue()


def pil(data: bytes) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


@dataclass(frozen=True)
class Expected:
    ids: list[int]  # the prompt as transformers' processor tokenizes it
    rows: np.ndarray  # the logits at every prompt position (teacher-forced)
    greedy: list[int]  # transformers' first NEW_TOKENS greedy tokens
    greedy_bytes: list[bytes]  # each of those tokens as bytes (SentencePiece pieces, byte fallback resolved)

    @property
    def logits(self) -> np.ndarray:
        """The first generated token's logits (the prompt's last position)."""
        return self.rows[-1]

    @property
    def text(self) -> str:
        return b"".join(self.greedy_bytes).decode("utf-8", errors="replace")


class Reference:
    """transformers on the tiny model's own HF directory (fp32, the same random weights as its GGUFs)."""

    def __init__(self, model: TinyVLM) -> None:
        import sentencepiece as spm
        import torch
        from transformers import AutoModelForImageTextToText
        from transformers.models.gemma3 import Gemma3Processor
        from transformers.models.idefics3 import Idefics3Processor

        # transformers' own classes: importing mlx-vlm's models registers its processors with AutoProcessor
        cls = Gemma3Processor if model.family == "gemma3" else Idefics3Processor
        self.processor = cls.from_pretrained(model.hf_dir)
        self.model = AutoModelForImageTextToText.from_pretrained(model.hf_dir, dtype=torch.float32).eval()
        self.sp = spm.SentencePieceProcessor(model_file=str(model.hf_dir / "tokenizer.model"))

    def run(self, messages: Sequence[dict[str, Any]], images: Sequence[bytes]) -> Expected:
        import torch

        text = self.processor.apply_chat_template(list(messages), add_generation_prompt=True)
        enc = self.processor(text=text, images=[pil(b) for b in images] or None, return_tensors="pt",
                             add_special_tokens=False)
        n = enc["input_ids"].shape[1]
        with torch.no_grad():
            rows = self.model(**enc).logits[0].numpy()
            out = self.model.generate(**enc, max_new_tokens=NEW_TOKENS, do_sample=False)[0, n:].tolist()
        return Expected(enc["input_ids"][0].tolist(), rows, out, [self.piece(t) for t in out])

    def piece(self, token: int) -> bytes:
        """A token's bytes as llama.cpp's token_to_piece gives them (what gmlx reports in logprobs.bytes)."""
        piece = self.sp.id_to_piece(token)
        if self.sp.is_byte(token):
            return bytes([int(piece[3:5], 16)])
        if self.sp.is_control(token):
            return b""
        return piece.replace("\u2581", " ").encode()


@cache
def reference(family: str) -> Reference:
    pytest.importorskip("torch", reason="the reference is transformers on torch (scripts/setup.sh --test)")
    return Reference(tiny_vlm(family))


def hf_messages(question: str, images: int = 1) -> list[dict[str, Any]]:
    """One user turn: the images first, then the question (the layout every protocol test sends)."""
    return [{"role": "user", "content": [*({"type": "image"} for _ in range(images)),
                                         {"type": "text", "text": question}]}]


# --- a loopback image server ---------------------------------------------------------------------

class _Images(BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, bytes]] = {}
    hits: ClassVar[list[str]] = []  # every path requested: a refused fetch must leave none

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        path = self.path
        self.hits.append(path)
        if path in self.routes:
            self._send(200, "image/png", self.routes[path])
        elif path == "/redirect-to-image":
            self._redirect("/img/a.png")
        elif path == "/redirect-to-loopback-ip":  # from the name the server allows to an address it does not
            self._redirect(f"http://127.0.0.1:{self.server.server_address[1]}/img/a.png")
        elif path == "/redirect-to-file":
            self._redirect("file:///etc/passwd")
        elif path == "/page":
            self._send(200, "text/html; charset=utf-8", b"<html>not an image</html>")
        elif path == "/huge-declared":
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(1 << 40))
            self.end_headers()
        elif path == "/huge-streamed":
            self._stream(b"\x89PNG" + b"\0" * 65536, 64)  # no Content-Length: the cap must stop the reading
        elif path == "/slow":
            self._stream(b"\x89", 600, pause_s=0.1)  # a byte every 0.1 s for a minute
        else:
            self._send(404, "text/plain", b"no such image")

    def _send(self, status: int, media: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", media)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _stream(self, chunk: bytes, times: int, pause_s: float = 0.0) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()
        try:
            for _ in range(times):
                self.wfile.write(chunk)
                self.wfile.flush()
                time.sleep(pause_s)
        except OSError:  # the fetcher hung up, as it should
            pass


@dataclass
class ImageServer:
    base: str  # http://localhost:PORT: the name the test servers allow
    images: dict[str, bytes]
    hits: list[str]
    port: int

    def url(self, path: str) -> str:
        return self.base + path


@pytest.fixture(scope="session")
def image_server() -> Iterator[ImageServer]:
    images = {"/img/a.png": png(1), "/img/b.png": png(2), "/img/big.png": png(3, 400, 400)}
    hits: list[str] = []
    handler = type("Images", (_Images,), {"routes": images, "hits": hits})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    port = int(httpd.server_address[1])
    yield ImageServer(f"http://localhost:{port}", images, hits, port)
    httpd.shutdown()
    httpd.server_close()


# --- one real gmlx serve -------------------------------------------------------------------------

def write_config(path: Path, allowed: str = "[localhost]", **server: Any) -> Path:
    """The vision servers' config; `allowed` is server.image_fetch_allowed_hosts ("[]": public addresses only)."""
    lines = ["server:", f"  image_fetch_timeout_s: {FETCH_TIMEOUT_S}", f"  image_max_bytes: {MAX_IMAGE_BYTES}",
             f"  image_fetch_allowed_hosts: {allowed}"]
    lines += [f"  {k}: {v}" for k, v in server.items()]
    lines.append("models:")
    for family, model_id in MODEL_IDS.items():
        m = tiny_vlm(family)
        lines += [f"  {model_id}:", f"    path: {m.text_gguf}", f"    mmproj: {m.mmproj_gguf}"]
    lines += ["  smollm2:", f"    path: {smollm2_path()}"]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="session")
def vlm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    for family in FAMILIES:
        tiny_vlm(family)  # built (or skipped) before the server starts
    d = tmp_path_factory.mktemp("vlm-server")
    with gmlx_serve(["--config", str(write_config(d / "gmlx.yaml"))], d, env={"TOP_LOGPROBS_K": "20"}) as srv:
        yield srv
