"""The connection cap (MAX_CONNECTIONS) and the HTTP protocol that keeps it.

Every client connection holds a file descriptor until it closes, and a kept-alive connection
whose client sends a request every few seconds never reaches REQUEST_HEADERS_TIMEOUT_S. Without
a cap, 200 such clients under an open-files limit of 160 took every descriptor: /readyz could
not even be accepted (App Service replaces an instance whose probes fail). So `Connections`
admits at most `limit` connections: MAX_CONNECTIONS, or fewer where the open-files limit
leaves less (`connection_limit`: the limit less FD_RESERVE, kept for the process's own files,
about a dozen, and for the answers below). A connection that opens at the cap:

- first closes the connection idle longest: a kept-alive one that finished a response and has
  sent nothing since. Its client reconnects when it next sends, as after a keep-alive timeout
  (HTTP clients check a pooled connection before reusing it); nginx does the same with its
  "reusable" connections when it runs out of worker_connections. So idle clients cannot crowd
  out new ones, and one that opened and has not sent its request yet is never closed for
  another;
- if none is idle (every admitted connection is mid-request), it is over the cap: its one
  request is answered, then the connection is closed. /healthz, /readyz and /metrics are
  answered as usual, so probes keep working; anything else gets 503 too_many_connections in
  the route's error shape with `Retry-After` and `Connection: close`. No log line per refusal
  (under a flood that would be the flood): /metrics counts them, and a warning at most every
  LOG_INTERVAL_S says how many since the last.

And a write deadline (WRITE_TIMEOUT_S): a client that stops reading fills the socket's buffers
(the kernel's: SEND_BUFFER_KB, set on each connection, else autotuned up to 4 MiB; then the
transport's 64 KiB), asyncio pauses writing, and the response waits for it forever, holding
the buffers and generating a reply nobody reads.
The protocol starts a timer when writing is paused and stops it when the client reads enough
for writing to resume; if it fires and the client has taken no byte since it started (the
transport's buffer is no smaller: nothing is added to it while writing is paused), the
connection is aborted (closed without flushing what is
buffered), which the route sees as the client leaving: its reply is cancelled in the model
worker. The request's log line says `closed: write_timeout`, `sidecar_write_timeouts_total`
counts it, and a warning at most every LOG_INTERVAL_S says how many since the last.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
from collections import Counter
from typing import Any, Protocol, cast

import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from sidecar.web.errors import RETRY_OVERLOADED_S, ApiError
from sidecar.web.guards.access import PROBES

log = logging.getLogger("sidecar.web.connections")  # the name its log lines always had

# Descriptors kept out of the cap: the process's own (the listening socket, the model worker's
# pipes, stderr: about a dozen) and room for connections over the cap to be answered.
FD_RESERVE = 64
# The most often a repeating warning (connections over the cap, accept errors) is written.
LOG_INTERVAL_S = 10.0


def connection_limit(max_connections: int, nofile: int) -> int:
    """MAX_CONNECTIONS, or what the soft open-files limit `nofile` leaves (at least 1)."""
    if nofile == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, nofile - FD_RESERVE))


class ThrottledLog:
    """A warning for an event that can repeat thousands of times a second: the first is
    written at once, then at most one line per `interval_s`, with how many of each kind
    happened since the previous line (a timer writes the last ones when the events stop)."""

    def __init__(self, logger: logging.Logger, msg: str, interval_s: float = LOG_INTERVAL_S):
        self._log = logger
        self._msg = msg
        self._interval_s = interval_s
        self._counts: Counter[str] = Counter()
        self._fields: dict[str, Any] = {}
        self._next_at = float("-inf")  # event loop time
        self._timer: asyncio.TimerHandle | None = None

    def note(self, kind: str, **fields: Any) -> None:
        """Count one event of `kind` (called on the event loop); `fields` go on the next line."""
        self._counts[kind] += 1
        self._fields.update(fields)
        loop = asyncio.get_running_loop()
        if loop.time() >= self._next_at:
            self._write(loop)
        elif self._timer is None:
            self._timer = loop.call_at(self._next_at, self._flush, loop)

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        if self._counts:
            self._write(loop)

    def _write(self, loop: asyncio.AbstractEventLoop) -> None:
        fields = {**self._fields, **self._counts, "interval_s": self._interval_s}
        self._log.warning(self._msg, extra={"fields": fields})
        self._counts.clear()
        self._fields = {}
        self._next_at = loop.time() + self._interval_s


class Sheddable(Protocol):
    def shed(self) -> None: ...


class Connections:
    """The connections open, which are admitted and which idle, and the counts /metrics shows."""

    def __init__(self, limit: int, write_timeout_s: float = 30.0, send_buffer: int = 0) -> None:
        self.limit = limit
        self.write_timeout_s = write_timeout_s  # WRITE_TIMEOUT_S
        self.send_buffer = send_buffer  # SEND_BUFFER_KB, in bytes; 0: the kernel's own
        self._admitted: set[Sheddable] = set()
        self._idle: dict[Sheddable, None] = {}  # in the order they became idle: oldest first
        self._over: set[Sheddable] = set()  # over the cap: one request, then closed
        self.refused = 0  # requests answered 503 too_many_connections
        self.idle_closed = 0  # idle connections closed to admit a new one
        # accept() failures (out of descriptors or memory): guards/listener.py
        self.accept_errors = 0
        self.write_timeouts = 0  # connections closed because their client stopped reading
        self._full_log = ThrottledLog(log, "connection limit reached")
        self._write_log = ThrottledLog(log, "client stopped reading: connection closed")
        self.accept_log = ThrottledLog(log, "accepting a connection failed")

    @property
    def open(self) -> int:
        return len(self._admitted) + len(self._over)

    def opened(self, conn: Sheddable) -> bool:
        """Admit a new connection, closing the one idle longest if the cap is reached; False:
        none was idle, the connection is over the cap."""
        if len(self._admitted) >= self.limit:
            if not self._idle:
                self._over.add(conn)
                return False
            oldest = next(iter(self._idle))
            self.closed(oldest)
            oldest.shed()
            self.idle_closed += 1
            self._full_log.note("idle_closed", limit=self.limit)
        self._admitted.add(conn)
        return True

    def busy(self, conn: Sheddable) -> None:
        self._idle.pop(conn, None)

    def idle(self, conn: Sheddable) -> None:
        if conn in self._admitted:
            self._idle.pop(conn, None)
            self._idle[conn] = None

    def closed(self, conn: Sheddable) -> None:
        self._admitted.discard(conn)
        self._idle.pop(conn, None)
        self._over.discard(conn)

    def refusing(self) -> None:
        self.refused += 1
        self._full_log.note("refused", limit=self.limit)

    def write_timed_out(self) -> None:
        self.write_timeouts += 1
        self._write_log.note("write_timeouts", write_timeout_s=self.write_timeout_s)

    def accept_failed(self, error: str) -> None:
        self.accept_errors += 1
        self.accept_log.note("errors", error=error, open_connections=self.open)


def too_many_connections() -> ApiError:
    return ApiError(
        "too_many_connections",
        "too many connections are open to the model service; retry later",
        headers={"Retry-After": str(RETRY_OVERLOADED_S), "Connection": "close"},
    )


def over_the_cap(app: ASGIApp, connections: Connections) -> ASGIApp:
    """What a connection over the cap gets: probes answered as usual, anything else 503; the
    response says `Connection: close`, so h11 closes the connection after it."""

    async def answer(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        if scope["path"] in PROBES:

            async def send_closing(message: Message) -> None:
                if message["type"] == "http.response.start":
                    headers = [*message.get("headers", []), (b"connection", b"close")]
                    message = {**message, "headers": headers}
                await send(message)

            await app(scope, receive, send_closing)
            return
        connections.refusing()
        await too_many_connections().response(scope["path"])(scope, receive, send)

    return answer


class _CappedProtocol(H11Protocol):
    """uvicorn's h11 protocol that reports to `connections` when it opens, works, idles and
    closes; the class protocol() makes sets `cap`."""

    cap: Connections  # not `connections`: uvicorn's own attribute (the set of all)
    _write_timer: asyncio.TimerHandle | None = None
    _write_left = 0  # bytes buffered when the write timer was armed

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if self.cap.send_buffer and sock is not None and sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.cap.send_buffer)
        if not self.cap.opened(self):
            self.app = cast(Any, over_the_cap(cast(ASGIApp, self.app), self.cap))

    def data_received(self, data: bytes) -> None:
        self.cap.busy(self)
        super().data_received(data)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start the next pipelined request
        if self._idle():
            self.cap.idle(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.cap.closed(self)
        self._stop_write_timer()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        """The transport's buffer is full: the client is not reading what was sent."""
        super().pause_writing()
        if self._write_timer is None:
            self._arm_write_timer()

    def _arm_write_timer(self) -> None:
        # While writing is paused nothing is added to the buffer (the response waits to
        # drain), so the buffer shrinking means the client took bytes.
        self._write_left = self.transport.get_write_buffer_size()
        self._write_timer = self.loop.call_later(self.cap.write_timeout_s, self._write_timed_out)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stop_write_timer()

    def _stop_write_timer(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_timed_out(self) -> None:
        self._write_timer = None
        if self.transport.is_closing():
            return
        if self.transport.get_write_buffer_size() < self._write_left:
            self._arm_write_timer()  # it reads, more slowly than the reply is written
            return
        cycle = self.cycle
        record = cycle.scope.get("state", {}).get("record") if cycle is not None else None
        if record is not None:
            record.closed = "write_timeout"
        self.cap.write_timed_out()
        # Not close(): it would wait to flush the buffer the client is not reading.
        self.transport.abort()

    def _idle(self) -> bool:
        """Between requests, with no byte of the next one received."""
        return (
            not self.transport.is_closing()
            and self.conn.our_state is h11.IDLE
            and self.conn.their_state is h11.IDLE
            and not self.conn.trailing_data[0]
        )

    def shed(self) -> None:
        """Close this idle connection for a new one, as uvicorn's keep-alive timeout does."""
        self.timeout_keep_alive_handler()


def protocol(base: type[H11Protocol], connections: Connections) -> type[H11Protocol]:
    """`base` (deadlines.protocol(settings)) that keeps `connections`' cap."""
    return type("CappedH11Protocol", (_CappedProtocol, base), {"cap": connections})
