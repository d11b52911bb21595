"""The listening socket and the open-files limit: what keeps the sidecar accepting, and its log
readable, when descriptors run out.

- `raise_nofile()`: the soft RLIMIT_NOFILE up to the hard limit, once at start (container
  runtimes often set the soft one to 1,024 with a far higher hard one); the model worker,
  spawned later, inherits it. The start line `connections` says both and the cap that follows
  (guards/connections.py).
- `Listener`: at most ACCEPTS_PER_TICK connections a tick. asyncio accepts up to `backlog`
  connections in one go before any of them reaches the protocol, so 200 clients connecting at
  once took every descriptor before the cap (guards/connections.py) could close an idle connection
  or answer one over it; the next tick accepts the next ones. And CPython 3.11's accept loop
  (`BaseSelectorEventLoop._accept_connection`) does not return after EMFILE: it tries again up
  to `backlog` times (2,048 under uvicorn) in the same tick, reports each failure to the loop's
  exception handler (by default a traceback each) and schedules a retry a second later for
  each, so the retries multiply: 469,000 lines (240 MB) in 30 s under 200 clients. After an
  out-of-resource error, Listener.accept says "nothing to accept" (BlockingIOError, which ends
  asyncio's loop) until the next tick; asyncio has already stopped reading the socket and
  retries once, a second later (ACCEPT_RETRY_DELAY).
- `accept_errors(connections)`, the loop's exception handler: each such error is counted
  (`sidecar_accept_errors_total`) and logged at most once per LOG_INTERVAL_S with the count;
  any other report goes to asyncio's default handler.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
from collections.abc import Callable
from typing import Any

import uvicorn

from sidecar.settings import Settings
from sidecar.web.guards.connections import Connections

log = logging.getLogger("sidecar.web.listener")  # the name its log lines always had

# What accept() reports when the process or the system is out of descriptors or memory: the
# errors asyncio backs off from (the others are the client's: it left before being accepted).
OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

# Accepted connections reach the cap two ticks later (asyncio makes the transport in a task,
# which calls connection_made in the next tick): so at most about 2 x 8 descriptors are held by
# connections the cap has not seen yet, well inside connections.FD_RESERVE.
ACCEPTS_PER_TICK = 8

ExceptionHandler = Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]


def raise_nofile() -> tuple[int, int, int]:
    """Raise the soft open-files limit to the hard one; (soft before, soft now, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:  # an unlimited hard limit Linux will not take
            log.warning("open-files limit not raised", extra={"fields": {"error": str(exc)}})
    return soft, resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard


def log_limits(nofile: tuple[int, int, int], settings: Settings, connections: Connections) -> None:
    """One line at start: the open-files limits and the connection cap, and what set the cap."""
    before, soft, hard = nofile
    by_files = connections.limit < settings.max_connections
    fields = {
        "nofile_soft_at_start": before,
        "nofile_soft": soft,
        "nofile_hard": hard,
        "max_connections": settings.max_connections,
        "connection_limit": connections.limit,
        "limited_by": "open_files" if by_files else "MAX_CONNECTIONS",
    }
    # Lowered by the limit: the operator should raise the hard limit (ulimit -n, --ulimit).
    (log.warning if by_files else log.info)("connections", extra={"fields": fields})


class Listener(socket.socket):
    """A listening socket whose accept() ends asyncio's accept loop for this tick after
    ACCEPTS_PER_TICK connections or an out-of-resource error (see the module's docstring)."""

    _accepted = 0  # in this tick
    _backing_off = False

    @classmethod
    def from_config(cls, config: uvicorn.Config) -> Listener:
        """uvicorn's own socket for `config` (bound, logged as uvicorn logs it), as a Listener."""
        sock = config.bind_socket()
        listener = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        listener.set_inheritable(False)  # as uvicorn's own listener; the worker is spawned
        return listener

    def accept(self) -> tuple[socket.socket, Any]:
        # BlockingIOError is "nothing more to accept" to asyncio: its loop ends for this tick.
        if self._backing_off:
            raise BlockingIOError(errno.EAGAIN, "backing off after an out-of-resource error")
        if self._accepted >= ACCEPTS_PER_TICK:
            raise BlockingIOError(errno.EAGAIN, "the rest next tick")
        try:
            conn = super().accept()
        except OSError as exc:
            if exc.errno in OUT_OF_RESOURCES:
                self._backing_off = True
                self._next_tick()
            raise
        self._accepted += 1
        if self._accepted == 1:
            self._next_tick()
        if self.family in (socket.AF_INET, socket.AF_INET6):
            # asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and uvicorn's
            # bound socket says 0: without it a response's body waited for the client's
            # delayed ACK of its headers (Nagle), 40 ms on every keep-alive request.
            conn[0].setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _next_tick(self) -> None:
        """Start counting afresh in the next tick: after asyncio's loop of this one has ended
        (call_soon from a callback runs in the next iteration). asyncio has stopped reading the
        socket after an out-of-resource error and reads it again a second later; after
        ACCEPTS_PER_TICK it keeps reading, so the next tick accepts the next ones."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not under an event loop (a plain accept): nothing to count
            self._accepted = 0
            self._backing_off = False
            return
        loop.call_soon(self._resume)

    def _resume(self) -> None:
        self._accepted = 0
        self._backing_off = False


def accept_errors(connections: Connections) -> ExceptionHandler:
    """The event loop's exception handler: accept errors counted and throttled, the rest as
    asyncio reports them."""

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if (
            isinstance(exc, OSError)
            and exc.errno in OUT_OF_RESOURCES
            and str(context.get("message", "")).startswith("socket.accept()")
        ):
            connections.accept_failed(errno.errorcode.get(exc.errno or 0, str(exc.errno)))
            return
        loop.default_exception_handler(context)

    return handle
