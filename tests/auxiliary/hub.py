"""A loopback stand-in for the Hugging Face Hub: what huggingface_hub's snapshot_download asks (repo info, the
file tree, each file by HEAD and GET), served from memory on 127.0.0.1, with two failure modes a test can
turn on per repo: `hold` (file bodies wait for an event: the download is 'in progress') and `cut` (a file
sends half its bytes and closes: a download that fails midway)."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

SHA = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Repo:
    files: dict[str, bytes]
    hold: threading.Event | None = None  # set it to let file bodies through
    cut: bool = False

    @classmethod
    def from_dir(cls, path: Path, **kw: object) -> Repo:
        return cls({str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()},
                   **kw)  # type: ignore[arg-type]


@dataclass
class Hub:
    repos: dict[str, Repo] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    url: str = ""


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _json(self, body: object, status: int = 200) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _route(self) -> None:
            path = unquote(urlparse(self.path).path)
            hub.requests.append(f"{self.command} {path}")
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 6:
                return self._api(parts)
            if len(parts) >= 5 and parts[2] == "resolve":
                return self._file("/".join(parts[:2]), "/".join(parts[4:]))
            return self._json({"error": "not found"}, 404)

        def _api(self, parts: list[str]) -> None:
            repo = hub.repos.get("/".join(parts[2:4]))
            if repo is None:
                self.send_response(404)
                self.send_header("X-Error-Code", "RepoNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if parts[4] == "revision":
                return self._json({"id": "/".join(parts[2:4]), "sha": SHA,
                                   "siblings": [{"rfilename": f} for f in repo.files]})
            return self._json([{"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                               for f, b in repo.files.items()])

        def _file(self, repo_id: str, name: str) -> None:
            repo = hub.repos.get(repo_id)
            data = repo.files.get(name) if repo else None
            if repo is None or data is None:
                return self._json({"error": "entry not found"}, 404)
            self.send_response(200)
            self.send_header("X-Repo-Commit", SHA)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command == "HEAD":
                return
            if repo.hold is not None:
                repo.hold.wait(60)
            if repo.cut:
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(data)

        do_GET = do_HEAD = _route

    return Handler


@contextmanager
def running_hub(hub: Hub) -> Iterator[Hub]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        for repo in hub.repos.values():
            if repo.hold is not None:
                repo.hold.set()
        server.shutdown()
        server.server_close()
