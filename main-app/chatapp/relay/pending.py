"""A reply the model service has not started yet: the sidecar holds a chat in its queue (its
answer's headers come only when a slot is free) while other replies run.

The relay waits `QUEUED_STREAM_AFTER` (3 s) for the answer to start. Most do (then nothing
changes: a refusal is still the HTTP status the page knows, with its retry countdown). Past
that, the relay starts its own stream
and reads this `PendingReply` like a reply: `next()` gives nothing while the request waits, so
the relay writes its `{"ping": true}` lines (a browser that left is noticed, and dropping the
request takes it out of the sidecar's queue); a refusal that comes later (busy, not ready, too
long) becomes the stream's last line as `Refused`, with its type.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import threading
from typing import Any

from chatapp.errors import ApiError
from chatapp.relay.upstream import Event, Refused, ReplyStream, Upstream, upstream_failed

# The name its log lines have always carried, not the module's path.
log = logging.getLogger("chatapp.pending")


class PendingReply:
    def __init__(self, upstream: Upstream, payload: dict[str, Any], request_id: str) -> None:
        self._started = threading.Event()
        self._reply: ReplyStream | None = None
        self._error: ApiError | None = None
        self._closed = False
        self._greenlet: Any = None
        # In this request's context: the trace's current span parents the call to the sidecar.
        args = (self._start, upstream, payload, request_id)
        context = contextvars.copy_context()
        if _gevent():  # gunicorn's gevent worker: a greenlet, which close() can interrupt
            import gevent

            self._greenlet = gevent.spawn(context.run, *args)
        else:
            threading.Thread(target=context.run, args=args, daemon=True).start()

    def _start(self, upstream: Upstream, payload: dict[str, Any], request_id: str) -> None:
        try:
            reply = upstream.start(payload, request_id)
        except ApiError as error:
            self._error = error
        except Exception:  # as a 500 would be in the route: logged, a generic sentence
            log.exception("starting the reply failed")
            self._error = upstream_failed()
        else:
            if self._closed:  # the browser left while the answer was on its way
                reply.close()
            self._reply = reply
        finally:
            self._started.set()

    def wait(self, timeout: float) -> bool:
        """Whether the model service answered (a reply or a refusal) within `timeout`."""
        return self._started.wait(timeout)

    def result(self) -> ReplyStream:
        """The reply; raises the model service's refusal as the ApiError it is."""
        if self._error is not None:
            raise self._error
        assert self._reply is not None
        return self._reply

    def next(self, timeout: float) -> Event | None:
        """As ReplyStream.next: None while the model service has not answered (a ping)."""
        if not self._started.is_set() and not self._started.wait(timeout):
            return None
        if self._error is not None:
            return Refused(self._error)
        if self._reply is None:  # interrupted by close()
            return None
        return self._reply.next(timeout)

    def close(self) -> None:
        self._closed = True
        if self._reply is not None:
            self._reply.close()
        elif self._greenlet is not None and not self._started.is_set():
            self._greenlet.kill(block=False)  # drops the request: the sidecar dequeues it


def _gevent() -> bool:
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and bool(monkey.is_module_patched("socket"))
