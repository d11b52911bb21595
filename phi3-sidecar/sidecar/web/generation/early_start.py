"""A stream that starts before its reply does (STREAM_START_AFTER_S).

Clients that read a stream with a timeout (App Service's tutorial apps: 30 s, httpx's default:
5 s) fail when no byte comes while their request waits in the queue, or while the worker has
not started it. So a streamed /v1 request that has not started within STREAM_START_AFTER_S gets
its 200, its headers and the format's head at once, then the format's keepalive after each
STREAM_KEEPALIVE_S of silence, until its reply starts: from then on it is the ReplyResponse
the pipeline made (generation/reply.py), writing into the same Outbox. A refusal that comes after
the start (the queue, not_ready, the worker's Rejected) is the format's `refused` ending: an error
event, never an HTTP status. The headers that come from the worker's start (X-Prompt-Tokens, ...)
are not sent: they are not known yet; the usage chunk says the same.

The client leaving is watched the whole time: a request still queued leaves the queue, one the
worker has started is cancelled there.

A request for a model that must load first (MODELS_FILE, web/models/pool.py) starts its stream
at once, and says so: the format's `loading` event ({"model", "seconds", "seconds_left"}) first
and in place of each keepalive, until the model is ready.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sidecar.web.errors import ApiError
from sidecar.web.generation.reply import Outbox, ReplyFormat, ReplyResponse, wait_for_disconnect
from sidecar.web.observability.record import RequestRecord

log = logging.getLogger("sidecar.web.early_start")  # the name its log lines always had


class EarlyStart(Response):
    def __init__(
        self,
        begin: asyncio.Future[ReplyResponse],
        record: RequestRecord,
        reply_format: ReplyFormat,
        keepalive_s: float,
        loading: Callable[[], dict[str, Any] | None] | None = None,
    ) -> None:
        self.status_code = 200
        self.background = None
        self.media_type = reply_format.media_type
        self._begin = begin  # the pipeline's admission and start, still running
        self._record = record
        self._format = reply_format
        self._keepalive_s = keepalive_s
        self._loading = loading  # the model asked for, while it loads (web/models/pool.py)
        self.init_headers({"cache-control": "no-store", "x-accel-buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        begin = self._begin
        outbox = Outbox(send, self._keepalive, self._keepalive_s)
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await outbox.write(self._format.head() + self._said_loading())
        gone = asyncio.ensure_future(wait_for_disconnect(receive))
        try:
            await outbox.wait(begin, gone)
        except asyncio.CancelledError:  # the server is stopping: end the stream as incomplete
            begin.cancel()
            self._record.outcome = "cancelled"
            return
        finally:
            gone.cancel()
        if not begin.done():  # the client left first
            begin.cancel()
            self._record.outcome = "cancelled"
            return
        try:
            response = begin.result()
        except ApiError as error:
            await self._refuse(outbox, error)
            return
        except Exception as exc:  # as errors.py's handler would: logged by type, said in general
            fields = {"request_id": self._record.request_id, "error_type": type(exc).__name__}
            log.error("unexpected error", exc_info=exc, extra={"fields": fields})
            await self._refuse(outbox, ApiError("internal_error", "internal error; see the log"))
            return
        await response.stream(scope, receive, send, outbox)

    def _said_loading(self) -> bytes:
        """The format's `loading` event while the model loads (b"": none)."""
        event = self._loading() if self._loading is not None else None
        return self._format.loading(event) if event is not None else b""

    def _keepalive(self) -> bytes:
        return self._said_loading() or self._format.keepalive()

    async def _refuse(self, outbox: Outbox, error: ApiError) -> None:
        self._record.outcome = "rejected"  # as the same refusal before the start
        self._record.error_type = error.kind
        await outbox.write(self._format.refused(error), more=False)
