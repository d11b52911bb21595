"""A deadline on reading a request's body, so a stalled or endless body cannot hold a socket.

gunicorn's gevent worker reads a request's headers under the `keepalive` deadline
(REQUEST_HEADERS_TIMEOUT, gunicorn_conf.py) but a body as slowly as the client sends it: a
Content-Length larger than what arrives, or a chunked body that never ends, held its
connection forever. `BodyDeadline` reads the whole body, at most MAX_REQUEST_BYTES + 1 bytes,
within REQUEST_BODY_TIMEOUT seconds of the request reaching the app, before any route runs. A
late body is dropped and marked (`LATE`): `POST /chat` answers it 408 `request_timeout`
(relay/chat.py, logged like any refusal), and gunicorn closes the connection after draining it for
at most its keepalive deadline. The deadline is a gevent timeout: it applies where the socket
is gevent's (gunicorn's gevent worker, production); the development server (`python -m
chatapp`) reads as Flask does.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterable
from typing import Any
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LATE = "chatapp.body_late"  # in the WSGI environ: the seconds the body did not arrive within


class BodyDeadline:
    def __init__(self, app: WSGIApplication, seconds: float, max_bytes: int) -> None:
        self.app = app
        self.seconds = seconds
        self.max_bytes = max_bytes

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if _gevent_sockets() and _has_body(environ, self.max_bytes):
            import gevent

            stream: Any
            try:
                with gevent.Timeout(self.seconds):
                    body = _read(environ["wsgi.input"], self.max_bytes + 1)
            except gevent.Timeout:
                environ[LATE] = self.seconds
                body, stream = b"", io.BytesIO()
            except Exception as error:  # a garbage chunk size, a cut-off body: the route's 400
                body, stream = b"?", _Unreadable(error)  # a length, so that the route reads
            else:  # the route reads what arrived; over max_bytes it answers 413 as it would
                stream = io.BytesIO(body)
            environ["wsgi.input"] = stream
            environ["CONTENT_LENGTH"] = str(len(body))
            environ.pop("HTTP_TRANSFER_ENCODING", None)
            environ["wsgi.input_terminated"] = False
        return self.app(environ, start_response)


class _Unreadable(io.RawIOBase):
    """A body the server could not read: reading it raises what the server raised."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        raise OSError(f"the request body could not be read: {self.error}")


def _gevent_sockets() -> bool:
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and bool(monkey.is_module_patched("socket"))


def _has_body(environ: WSGIEnvironment, max_bytes: int) -> bool:
    """A body to read here: chunked, or a declared length the app would accept (a larger
    one is refused 413 by Flask without reading it)."""
    if environ.get("REQUEST_METHOD") not in BODY_METHODS:
        return False
    if "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
        return True
    declared = environ.get("CONTENT_LENGTH", "")
    return declared.isdigit() and 0 < int(declared) <= max_bytes


def _read(stream: Any, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = stream.read(min(8192, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
