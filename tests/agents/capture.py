"""A recording reverse proxy: forwards loopback traffic to a gmlx server and writes each exchange as JSON.

`python tests/agents/capture.py --upstream http://127.0.0.1:8000 --port 9000 --out DIR` records what a
real agent client sends (method, path, headers, body) and the status it got; bench/agents.py replays it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

_HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


def make_handler(upstream: str, out: Path) -> type[BaseHTTPRequestHandler]:
    target = urlsplit(upstream)
    counter = iter(range(1_000_000))
    lock = threading.Lock()

    class Recorder(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _exchange(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=3600)
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in _HOP:
                    self.send_header(k, v)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            chunks = []
            while chunk := resp.read1(65536):
                chunks.append(chunk)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self._record(headers, body, resp.status, b"".join(chunks))

        def _record(self, headers: dict[str, str], body: bytes, status: int, reply: bytes) -> None:
            with lock:
                n = next(counter)
            entry: dict[str, Any] = {"seq": n, "method": self.command, "path": self.path, "status": status,
                                     "headers": {k: v for k, v in headers.items() if "key" not in k.lower()
                                                 and "authorization" not in k.lower()}}
            try:
                entry["body"] = json.loads(body) if body else None
            except ValueError:
                entry["body_text"] = body.decode(errors="replace")
            entry["reply"] = reply.decode(errors="replace")[:200_000]
            (out / f"{n:03d}.json").write_text(json.dumps(entry, indent=1))

        do_GET = do_POST = do_PUT = do_DELETE = _exchange

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Recorder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(args.upstream, args.out)).serve_forever()


if __name__ == "__main__":
    main()
