"""A stand-in for App Service's front end, as far as ARR affinity goes: it forwards each request
to the app, answers a browser that has no `ARRAffinity` cookie with one (HttpOnly, as ARR sets
it: the page's scripts cannot add it themselves), and records the method, path and Cookie
header of every request it forwards, which is what ARR reads to pick the instance.

Responses are streamed through as they come (the chat's NDJSON), each connection closed after
one answer (HTTP/1.0), which ends a body that had no length.
"""

from __future__ import annotations

import http.client
import secrets
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

AFFINITY = "ARRAffinity"
# Hop-by-hop headers (RFC 9110): not forwarded in either direction.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"}


@dataclass(frozen=True)
class Forwarded:
    method: str
    path: str
    cookie: str  # the Cookie header as the browser sent it ("" if none)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._forward()

    def do_HEAD(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        self._forward()

    def _forward(self) -> None:
        front = self.server.front
        cookie = self.headers.get("Cookie", "")
        front.record(Forwarded(self.command, self.path, cookie))
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        backend = http.client.HTTPConnection(front.host, front.port, timeout=60)
        try:
            backend.request(self.command, self.path, body=body, headers=headers)
            answer = backend.getresponse()
            self.send_response(answer.status, answer.reason)
            for name, value in answer.getheaders():
                if name.lower() not in HOP_BY_HOP:
                    self.send_header(name, value)
            if f"{AFFINITY}=" not in cookie:
                self.send_header("Set-Cookie", f"{AFFINITY}={front.instance}; Path=/; HttpOnly")
            self.end_headers()
            while chunk := answer.read1(65536):
                self.wfile.write(chunk)
                self.wfile.flush()
        finally:
            backend.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    front: FrontEnd


class FrontEnd:
    """Use as a context manager; `url` is what the browser opens, `requests` what it sent."""

    def __init__(self, backend_url: str) -> None:
        backend = urlsplit(backend_url)
        self.host, self.port = backend.hostname or "127.0.0.1", backend.port or 80
        self.instance = secrets.token_hex(32)  # ARR's value names the instance: opaque here
        self._requests: list[Forwarded] = []
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.front = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )

    def record(self, forwarded: Forwarded) -> None:
        with self._lock:
            self._requests.append(forwarded)

    @property
    def requests(self) -> list[Forwarded]:
        with self._lock:
            return list(self._requests)

    def __enter__(self) -> FrontEnd:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
