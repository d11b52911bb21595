"""A bound on the large bodies (chats with images) one app process holds at once.

A text-only chat's body is at most `MAX_REQUEST_BYTES` (64 KiB); one with images may be up to
`chatapp.relay.images.body_limit` (about 28 MiB by default), held in memory from its upload to the
end of its reply (the body, its JSON, the request to the model service). Without a bound, a
few hundred such uploads at once (gunicorn's gevent worker takes `GUNICORN_CONNECTIONS`) would
take gigabytes. `LargeBodies` lets `MAX_IMAGE_CHATS` requests whose body may be larger than
`MAX_REQUEST_BYTES` (its declared length, or any chunked body) in at once per process; another
is not read: it is marked `FULL` and `POST /chat` answers 503 `busy` with `Retry-After`, which
the page waits out and sends again. Text-only chats never wait for a slot.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from chatapp.guards.body_deadline import BODY_METHODS

FULL = "chatapp.large_bodies_full"  # in the WSGI environ: no slot was free


class LargeBodies:
    def __init__(self, app: WSGIApplication, text_limit: int, slots: int) -> None:
        self.app = app
        self.text_limit = text_limit
        # gevent's semaphore under gunicorn's worker, which patches threading.
        self._slots = threading.BoundedSemaphore(slots)

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if not _large(environ, self.text_limit):
            return self.app(environ, start_response)
        if not self._slots.acquire(blocking=False):
            # Answered without reading the body (the server drains or drops it).
            environ[FULL] = True
            environ["wsgi.input"] = io.BytesIO()
            environ["CONTENT_LENGTH"] = "0"
            environ.pop("HTTP_TRANSFER_ENCODING", None)
            return self.app(environ, start_response)
        try:
            result = self.app(environ, start_response)
        except BaseException:
            self._slots.release()
            raise
        return _Releasing(result, self._slots.release)


def _large(environ: WSGIEnvironment, text_limit: int) -> bool:
    if environ.get("REQUEST_METHOD") not in BODY_METHODS:
        return False
    if "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
        return True
    declared = environ.get("CONTENT_LENGTH", "")
    return declared.isdigit() and int(declared) > text_limit


class _Releasing:
    """The response body; its slot is given back when the server closes it (the reply's end,
    or the client gone)."""

    def __init__(self, body: Iterable[bytes], release: Callable[[], Any]) -> None:
        self._body = body
        self._release: Callable[[], Any] | None = release

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            release, self._release = self._release, None
            if release is not None:
                release()
