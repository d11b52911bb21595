"""A scripted stand-in for the sidecar, only for faults the real one cannot produce on demand.

Each test sets `fake.predict` to a function that writes the whole raw HTTP answer to
`POST /predict` (helpers below: `chunked`, `refuse`). The fake records request bodies and
headers, and notices when the client (the relay) closes the connection, which is how tests
check that the relay drops its upstream request.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

READY = {
    "ready": True,
    "phase": "ready",
    "reason": None,
    "phase_seconds": 1.0,
    "model": None,
    "max_length": 4096,
}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        fake = self.server.fake
        if self.path == "/readyz":
            status, body = fake.readyz
            refuse(self, status, body)
        else:
            refuse(self, 404, {"error": {"message": "not found", "type": "not_found"}})

    def do_POST(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        fake.raw_bodies.append(body)
        fake.headers.append(self.headers)
        fake.requests.append(json.loads(body or b"null"))
        try:
            fake.predict(self)
        except OSError:  # the client went away while we wrote
            fake.client_gone.set()
        self.close_connection = True


class Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeSidecar


class FakeSidecar:
    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.raw_bodies: list[bytes] = []
        self.headers: list[Message] = []
        self.client_gone = threading.Event()
        # The real sidecar's /readyz body (phi3-sidecar/sidecar/web/probes.py).
        self.readyz: tuple[int, dict[str, Any]] = (200, READY)
        self.predict: Callable[[Handler], object] = lambda h: chunked(h, [b"ok"])
        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.fake = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )

    def __enter__(self) -> FakeSidecar:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def refuse(handler: Handler, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(data)


def start_chunked(handler: Handler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/plain; charset=utf-8")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    handler.wfile.flush()


def write_chunk(handler: Handler, data: bytes) -> None:
    handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
    handler.wfile.flush()


def chunked(handler: Handler, pieces: list[bytes], *, delay: float = 0.0, end: bool = True) -> None:
    """Send `pieces` as separate HTTP chunks; end=False drops the connection instead of the
    terminating chunk (a sidecar that dies, or aborts the stream on an error, mid-reply)."""
    start_chunked(handler)
    for piece in pieces:
        write_chunk(handler, piece)
        time.sleep(delay)
    if end:
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()
    else:
        drop(handler)


def drop(handler: Handler) -> None:
    """End the TCP connection without finishing the HTTP answer, like a process that died."""
    with contextlib.suppress(OSError):
        handler.connection.shutdown(socket.SHUT_RDWR)


def wait_until_client_closes(handler: Handler, timeout: float) -> bool:
    """Stay silent until the client closes its end (True) or `timeout` passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        readable, _, _ = select.select([handler.connection], [], [], 0.05)
        if readable:
            try:
                if not handler.connection.recv(1024):
                    handler.server.fake.client_gone.set()
                    return True
            except OSError:
                handler.server.fake.client_gone.set()
                return True
    return False


def ndjson(lines: bytes) -> Iterator[dict[str, Any]]:
    """Parse an NDJSON body, splitting on "\\n" only, as the page does."""
    assert lines.endswith(b"\n"), "an NDJSON body ends with a newline"
    for line in lines.decode("utf-8").split("\n")[:-1]:
        yield json.loads(line)
