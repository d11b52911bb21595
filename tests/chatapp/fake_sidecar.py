"""A scripted stand-in for the sidecar, only for faults the real one cannot produce on demand.

Each test sets `fake.predict` to a function that writes the whole raw HTTP answer to
`POST /predict` (helpers below: `reply`, `refuse`). It speaks what the real sidecar answers the
chat app (which asks for `Accept: application/x-ndjson`): NDJSON events, `{"text"}` lines then
one `{"done": true, ...}` line with the model's counts (phi3-sidecar/sidecar/web/predict/api.py,
`Events`). `plain` is a sidecar from before events (text/plain), for the fallback's own tests.

The fake records request bodies and headers, and notices when the client (the relay) closes
the connection, which is how tests check that the relay drops its upstream request.
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
        fake.gets.append(self.path)
        if self.path == "/readyz":
            status, body = fake.readyz
            refuse(self, status, body)
        elif self.path == "/v1/models":  # an OpenAI-compatible server's model list
            status, body = fake.models
            refuse(self, status, body)
        elif self.path in fake.files:  # e.g. an encoder's tokenizer.json (documents/sizing.py)
            data = fake.files[self.path]
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            refuse(self, 404, {"error": {"message": "not found", "type": "not_found"}})

    def do_POST(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        fake.raw_bodies.append(body)
        fake.paths.append(self.path)
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
        self.paths: list[str] = []
        self.gets: list[str] = []  # the paths of GET requests, in order
        self.models: tuple[int, Any] = (200, {"object": "list", "data": [{"id": "fake-model"}]})
        self.headers: list[Message] = []
        self.files: dict[str, bytes] = {}  # GET path: the bytes answered
        self.client_gone = threading.Event()
        # The real sidecar's /readyz body (phi3-sidecar/sidecar/web/probes.py).
        self.readyz: tuple[int, dict[str, Any]] = (200, READY)
        self.predict: Callable[[Handler], object] = lambda h: reply(h, ["ok"])
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


def _start(handler: Handler, content_type: str) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    handler.wfile.flush()


def start_events(handler: Handler) -> None:
    """The head of the real sidecar's event stream: 200, application/x-ndjson, chunked."""
    _start(handler, "application/x-ndjson")


def write_chunk(handler: Handler, data: bytes) -> None:
    handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
    handler.wfile.flush()


def end_chunks(handler: Handler) -> None:
    """The terminating chunk: the answer is complete."""
    handler.wfile.write(b"0\r\n\r\n")
    handler.wfile.flush()


def event_line(event: dict[str, Any]) -> bytes:
    """One event as the sidecar writes it: compact JSON, UTF-8, a newline."""
    return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def write_text(handler: Handler, text: str) -> None:
    """One `{"text"}` event in its own HTTP chunk."""
    write_chunk(handler, event_line({"text": text}))


def done_event(
    generated_tokens: int,
    *,
    finish_reason: str = "stop",
    prompt_tokens: int = 12,
    cached_tokens: int = 0,
    dropped_messages: int = 0,
    passage_cached_tokens: int = 0,
) -> dict[str, Any]:
    """The last event of a complete reply, every field the real sidecar sends."""
    return {
        "done": True,
        "finish_reason": finish_reason,
        "generated_tokens": generated_tokens,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "passage_cached_tokens": passage_cached_tokens,
        "dropped_messages": dropped_messages,
    }


def write_done(handler: Handler, generated_tokens: int, **counts: Any) -> None:
    """The `done` event, then the end of the answer."""
    write_chunk(handler, event_line(done_event(generated_tokens, **counts)))
    end_chunks(handler)


def reply(
    handler: Handler,
    texts: list[str],
    *,
    tokens: int | None = None,
    delay: float = 0.0,
    end: bool = True,
    split: int | None = None,
    **counts: Any,
) -> None:
    """A whole reply as the real sidecar streams it: a `{"text"}` event per piece, each in its
    own HTTP chunk, then the `done` event that counts `tokens` generated tokens (default: one
    per piece; a fast model's piece can carry several) and the `counts` given.

    end=False drops the connection before the `done` event (a sidecar that died mid-reply).
    split=N sends the body in HTTP chunks of N bytes instead, cutting lines and characters."""
    start_events(handler)
    done = event_line(done_event(len(texts) if tokens is None else tokens, **counts))
    if split is not None:
        body = b"".join(event_line({"text": text}) for text in texts) + done
        for i in range(0, len(body), split):
            write_chunk(handler, body[i : i + split])
        end_chunks(handler)
        return
    for text in texts:
        write_text(handler, text)
        time.sleep(delay)
    if end:
        write_chunk(handler, done)
        end_chunks(handler)
    else:
        drop(handler)


def plain(handler: Handler, pieces: list[bytes], *, end: bool = True) -> None:
    """A sidecar from before events: `pieces` as text/plain HTTP chunks, which the app still
    reads (chatapp/relay/upstream_predict.py, the fallback). end=False drops the connection
    instead of the terminating chunk."""
    _start(handler, "text/plain; charset=utf-8")
    for piece in pieces:
        write_chunk(handler, piece)
    if end:
        end_chunks(handler)
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


def chunk(content: str | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    """A chat.completion.chunk as OpenAI-compatible servers stream it."""
    delta = {} if content is None else {"content": content}
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"id": "c1", "object": "chat.completion.chunk", "choices": [choice], **extra}


USAGE = {
    "prompt_tokens": 12,
    "completion_tokens": 5,  # more than the three pieces of REPLY: the model's count wins
    "total_tokens": 17,
    "prompt_tokens_details": {"cached_tokens": 8},
}


def sse(
    handler: Handler,
    events: list[Any],
    *,
    done: bool = True,
    comments: bool = False,
    delay: float = 0.0,
) -> None:
    """Stream server-sent events, each `data: <json>` (or a raw bytes line), then `data: [DONE]`
    unless done=False; comments=True puts keep-alive comment lines between them."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    for event in events:
        if comments:
            write_chunk(handler, b": keep-alive\n\n")
        data = event if isinstance(event, bytes) else json.dumps(event).encode()
        write_chunk(handler, b"data: " + data + b"\n\n")
        time.sleep(delay)
    if done:
        write_chunk(handler, b"data: [DONE]\n\n")
    handler.wfile.write(b"0\r\n\r\n")
    handler.wfile.flush()
