"""A real `gmlx serve` against what a web page can send: cross-site requests, DNS rebinding, text/plain
bodies and stalled connections are refused; an allowed origin works with CORS, preflight and streaming.

The hostile requests carry exactly the headers a browser adds (Origin, Sec-Fetch-*, the content type a
`fetch` with a string body or an HTML form gets), sent over real HTTP to the real server.
"""

from __future__ import annotations

import http.server
import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.e2e.server import ROOT, LiveServer, free_port, gmlx_serve, production_env

pytestmark = pytest.mark.slow
EVIL = "http://evil.example"
PAGE = "http://localhost:5173"  # a local dev server's page: allowed by default
APP = "https://app.example"  # allowed through GMLX_ALLOWED_ORIGINS
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4,
        "temperature": 0}
CHAT_RAW = b'{"model": "smollm2", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}'
CROSS_SITE = {"Origin": EVIL, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors",
              "Content-Type": "text/plain;charset=UTF-8"}  # fetch(url, {method: "POST", body: "..."})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = {"GMLX_ALLOWED_ORIGINS": APP, "GMLX_HEADER_TIMEOUT_S": "2", "GMLX_BODY_TIMEOUT_S": "2"}
    with gmlx_serve([], tmp_path_factory.mktemp("browser"), env=env) as s:
        yield s


def _port(s: LiveServer) -> int:
    return int(s.base_url.rsplit(":", 1)[1])


def _resident(s: LiveServer) -> bool:
    models = httpx.get(s.v1 + "/models", timeout=10).json()["data"]
    return bool(next(m for m in models if m["id"] == "smollm2")["resident"])


def test_cross_site_requests_are_refused_and_run_nothing(server: LiveServer) -> None:
    with httpx.Client(base_url=server.base_url, timeout=30) as c:
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/cache/reset", "/unload", "/v1/keep"):
            r = c.post(path, content=CHAT_RAW, headers=CROSS_SITE)
            assert r.status_code == 403 and r.json()["error"]["type"] == "origin_not_allowed", (path, r.text)
            assert "access-control-allow-origin" not in r.headers
        form = {**CROSS_SITE, "Content-Type": "application/x-www-form-urlencoded", "Sec-Fetch-Mode": "navigate"}
        r = c.post("/v1/chat/completions", content=b'{"a": "=b"}', headers=form)  # an auto-submitted <form>
        assert r.status_code == 403
        r = c.post("/v1/messages", content=CHAT_RAW, headers=CROSS_SITE)
        assert r.status_code == 403 and r.json()["error"] == {
            "type": "permission_error", "code": "origin_not_allowed", "message": r.json()["error"]["message"]}
        r = c.get("/v1/metrics", headers={"Origin": EVIL, "Sec-Fetch-Mode": "cors"})  # a read through fetch()
        assert r.status_code == 403
    assert not _resident(server)  # none of them even loaded the model


def test_text_plain_is_refused_even_without_an_origin(server: LiveServer) -> None:
    r = httpx.post(server.v1 + "/chat/completions", content=CHAT_RAW,
                   headers={"Content-Type": "text/plain"}, timeout=30)
    assert r.status_code == 415 and r.json()["error"]["type"] == "unsupported_media_type"
    r = httpx.post(server.v1 + "/chat/completions", content=b"--x\r\n\r\n{}\r\n--x--",
                   headers={"Content-Type": "multipart/form-data; boundary=x"}, timeout=30)
    assert r.status_code == 415
    assert not _resident(server)


def test_dns_rebinding_host_is_refused(server: LiveServer) -> None:
    host = f"evil.example:{_port(server)}"  # what the browser sends once evil.example resolves to 127.0.0.1
    for method, path in (("GET", "/v1/models"), ("GET", "/v1/metrics"), ("GET", "/health"),
                         ("POST", "/v1/cache/reset")):
        r = httpx.request(method, server.base_url + path, headers={"Host": host}, timeout=30)
        assert r.status_code == 403 and r.json()["error"]["type"] == "host_not_allowed", (path, r.text)
    for ok in (f"localhost:{_port(server)}", f"127.0.0.1:{_port(server)}"):
        assert httpx.get(server.v1 + "/models", headers={"Host": ok}, timeout=30).status_code == 200


def test_the_sdks_see_a_typed_403_from_a_foreign_origin(server: LiveServer) -> None:
    oa = openai.OpenAI(base_url=server.v1, api_key="none", default_headers={"Origin": EVIL}, max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as e:
        oa.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert e.value.code == "origin_not_allowed"
    an = anthropic.Anthropic(base_url=server.base_url, api_key="none", default_headers={"Origin": EVIL},
                             max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError) as ae:
        an.messages.create(model="smollm2", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert "GMLX_ALLOWED_ORIGINS" in str(ae.value)


def _read_until_closed(sock: socket.socket) -> bytes:
    sock.settimeout(60)  # a bound on a hang, not a measured duration
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_stalled_headers_and_bodies_are_cut_off(server: LiveServer) -> None:
    port = _port(server)
    with socket.create_connection(("127.0.0.1", port)) as sock:  # a slowloris: headers that never end
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        assert _read_until_closed(sock) == b""
    with socket.create_connection(("127.0.0.1", port)) as sock:  # half a body, then silence
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json"
                     b"\r\nContent-Length: 500\r\n\r\n" + CHAT_RAW[:40])
        answer = _read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 408 ") and b"request_timeout" in answer
    # Under the 64 KiB bound a head passes (localhost cookies add up). Over it the app refuses a head that
    # arrives whole (431) and h11 one still incomplete past the bound (400), whichever sees it first.
    for size, end, expected in ((20_000, b"\r\n\r\n", (b"200",)), (70_000, b"\r\n\r\n", (b"431", b"400")),
                               (100_000, b"", (b"400",))):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nX-Big: "
                         + b"a" * size + end)
            answer = _read_until_closed(sock)
        assert answer[9:12] in expected, (size, answer[:200])
    assert httpx.head(server.base_url + "/health", timeout=30).status_code == 200


def test_an_allowed_origin_gets_cors_a_preflight_and_a_stream(server: LiveServer) -> None:
    with httpx.Client(base_url=server.base_url, timeout=300) as c:
        for origin in (PAGE, APP):
            pre = c.options("/v1/chat/completions", headers={
                "Origin": origin, "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type,x-stainless-os"})
            assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == origin
            assert "POST" in pre.headers["access-control-allow-methods"]
            assert {"authorization", "content-type", "x-stainless-os"} <= {
                h.strip() for h in pre.headers["access-control-allow-headers"].split(",")}
        headers = {"Origin": PAGE, "Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors"}
        with c.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}, headers=headers) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            assert r.headers["access-control-allow-origin"] == PAGE and "Origin" in r.headers["vary"]
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and len(lines) >= 2
    oa = openai.OpenAI(base_url=server.v1, api_key="none", default_headers={"Origin": APP}, max_retries=0)
    raw = oa.chat.completions.with_raw_response.create(
        model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert raw.headers["access-control-allow-origin"] == APP and raw.parse().choices[0].message.content is not None


def test_the_gunicorn_worker_applies_the_same_guard_and_limits(tmp_path: Path) -> None:
    port = free_port()
    cmd = [str(Path(sys.executable).parent / "gunicorn"), "-k", "gmlx_server.gunicorn_worker.UvicornWorker", "-w", "1",
           "-b", f"127.0.0.1:{port}", "gmlx_server.asgi:app"]
    env = production_env({"PYTHONUNBUFFERED": "1", "GMLX_HEADER_TIMEOUT_S": "1"})
    with open(tmp_path / "gunicorn.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        r = httpx.get(base + "/v1/models", headers={"Host": f"evil.example:{port}"}, timeout=30)
        assert r.status_code == 403 and r.json()["error"]["type"] == "host_not_allowed"
        r = httpx.post(base + "/v1/cache/reset", headers={"Origin": EVIL}, timeout=30)
        assert r.status_code == 403 and r.json()["error"]["type"] == "origin_not_allowed"
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
            assert _read_until_closed(sock) == b""
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


# --- a real browser (Debian's headless chromium), when installed -----------------------------------

EVIL_PAGE = """<script>
const api = "API", out = {};
async function attempt(name, path, opts) {
  try { out[name] = "status " + (await fetch(api + path, opts)).status; } catch (e) { out[name] = "blocked"; }
}
(async () => {
  await attempt("plain", "/v1/cache/reset?page=evil-plain", {method: "POST", body: "{}"});
  await attempt("nocors", "/v1/chat/completions?page=evil-nocors", {method: "POST", mode: "no-cors", body: "BODY"});
  await attempt("json", "/v1/chat/completions?page=evil-json",
                {method: "POST", headers: {"Content-Type": "application/json"}, body: "BODY"});
  await fetch("/report", {method: "POST", body: JSON.stringify(out)});
})();
</script>"""
GOOD_PAGE = """<script>
(async () => {
  let out;
  try {
    const r = await fetch("API/v1/chat/completions?page=good", {method: "POST", body: "BODY",
      headers: {"Content-Type": "application/json", "Authorization": "Bearer none"}});
    const text = await r.text();
    out = {status: r.status, done: text.includes("[DONE]")};  // readable at all: CORS let it through
  } catch (e) { out = {error: String(e)}; }
  await fetch("/report", {method: "POST", body: JSON.stringify(out)});
})();
</script>"""


class Pages(http.server.ThreadingHTTPServer):
    """Serves the two pages on 127.0.0.1 and collects what each posts back to /report."""

    def __init__(self, api: str) -> None:
        body = json.dumps({**CHAT, "stream": True}).replace('"', '\\"')
        self.pages = {"/evil": EVIL_PAGE, "/good": GOOD_PAGE}
        self.pages = {k: v.replace("API", api).replace("BODY", body) for k, v in self.pages.items()}
        self.reports: list[dict[str, object]] = []
        super().__init__(("127.0.0.1", 0), _PageHandler)


class _PageHandler(http.server.BaseHTTPRequestHandler):
    server: Pages

    def do_GET(self) -> None:
        page = self.server.pages.get(self.path)
        self.send_response(200 if page else 404)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write((page or "").encode())

    def do_POST(self) -> None:
        self.server.reports.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _browse(url: str, profile: Path, done: Callable[[], bool]) -> None:
    """Open `url` in headless chromium (evil.example and rebind.example resolve to 127.0.0.1) until `done()`."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium is not None
    proc = subprocess.Popen([chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                             "--host-resolver-rules=MAP evil.example 127.0.0.1, MAP rebind.example 127.0.0.1",
                             url], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300  # a bound on a hang: the good page loads the model first
        while not done() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait(timeout=30)


@pytest.mark.skipif(shutil.which("chromium") is None and shutil.which("chromium-browser") is None,
                    reason="chromium is not installed (optional: apt-get install chromium)")
def test_a_real_browser_is_refused_cross_site_and_served_from_an_allowed_origin(
        server: LiveServer, tmp_path: Path) -> None:
    pages = Pages(server.base_url)
    threading.Thread(target=pages.serve_forever, daemon=True).start()
    port = pages.server_address[1]
    try:
        _browse(f"http://evil.example:{port}/evil", tmp_path / "evil", lambda: len(pages.reports) == 1)
        assert pages.reports[0] == {"plain": "blocked", "nocors": "status 0", "json": "blocked"}
        _browse(f"http://localhost:{port}/good", tmp_path / "good", lambda: len(pages.reports) == 2)
        assert pages.reports[1] == {"status": 200, "done": True}
        _browse(f"http://rebind.example:{_port(server)}/health?page=rebind", tmp_path / "rebind",
                lambda: "GET /health?page=rebind" in server.log())
    finally:
        pages.shutdown()
    log = server.log()
    for line in ('"POST /v1/cache/reset?page=evil-plain HTTP/1.1" 403',
                 '"POST /v1/chat/completions?page=evil-nocors HTTP/1.1" 403',
                 '"OPTIONS /v1/chat/completions?page=evil-json HTTP/1.1" 403',  # the preflight, refused
                 '"OPTIONS /v1/chat/completions?page=good HTTP/1.1" 204',
                 '"POST /v1/chat/completions?page=good HTTP/1.1" 200',
                 '"GET /health?page=rebind HTTP/1.1" 403'):
        assert line in log, line
    assert "POST /v1/chat/completions?page=evil-json" not in log  # the browser never sent it
