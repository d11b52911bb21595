"""Deadlines for reading a request, so that a slow or stalled client cannot hold a socket forever.

uvicorn has none: a client that sends half a request's headers, or complete headers and then a
body that stalls (a Content-Length larger than what it sends, a chunked body that never ends),
keeps its connection for as long as it likes. Two parts, one per layer:

- `BodyDeadline` (ASGI middleware): the route reading a body gets it within
  REQUEST_BODY_TIMEOUT_S of the request's headers, else 408 `request_timeout` (errors.REFUSALS,
  in the route's error shape, logged like any refusal) with `Connection: close`.
- `protocol(settings)` (the uvicorn HTTP protocol, h11 with two timers): a request's headers
  must arrive within REQUEST_HEADERS_TIMEOUT_S of the connection opening, or of the previous
  response ending, else the connection is closed; a body still arriving
  REQUEST_BODY_TIMEOUT_S + BODY_GRACE_S after its headers (one nobody reads: after a 413, or
  to a route that takes none) is closed too. uvicorn's keep-alive timer alone does not do it:
  any byte received cancels it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from sidecar.settings import Settings
from sidecar.web.errors import ApiError

# The polite 408 (BodyDeadline) goes first; the protocol closes what is still sending after it.
BODY_GRACE_S = 2.0


def request_timeout(seconds: float) -> ApiError:
    return ApiError(
        "request_timeout",
        f"the request body did not arrive within {seconds:g} s",
        headers={"Connection": "close"},
    )


class BodyDeadline:
    """Raises ApiError("request_timeout") from `receive` once the body is late."""

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self.seconds
        body_done = False

        async def receive_in_time() -> Message:
            nonlocal body_done
            if body_done:  # later receives wait for the client leaving: no deadline
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise request_timeout(self.seconds) from None
            body_done = message["type"] != "http.request" or not message.get("more_body")
            return message

        await self.app(scope, receive_in_time, send)


class _DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a timer on whatever the client still owes."""

    headers_timeout_s = 5.0
    body_timeout_s = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting_for: object = None  # h11.IDLE (headers), h11.SEND_BODY, or None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._follow()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        super().connection_lost(exc)

    def _follow(self) -> None:
        """Keep one timer for what the client owes now: headers, a body, or nothing."""
        state = self.conn.their_state
        waiting_for = state if state in (h11.IDLE, h11.SEND_BODY) else None
        if waiting_for is self._waiting_for:
            return
        self._cancel()
        self._waiting_for = waiting_for
        if waiting_for is h11.IDLE:
            self._timer = self.loop.call_later(self.headers_timeout_s, self._expire)
        elif waiting_for is h11.SEND_BODY:
            self._timer = self.loop.call_later(self.body_timeout_s + BODY_GRACE_S, self._expire)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if not self.transport.is_closing():
            self.transport.close()


def protocol(settings: Settings) -> type[H11Protocol]:
    """The HTTP protocol class for uvicorn.run(http=...), with these settings' deadlines."""
    return type(
        "DeadlineH11Protocol",
        (_DeadlineProtocol,),
        {
            "headers_timeout_s": settings.request_headers_timeout_s,
            "body_timeout_s": settings.request_body_timeout_s,
        },
    )
