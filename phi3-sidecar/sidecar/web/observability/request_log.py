"""One structured log line per request, with its X-Request-Id.

Prompt and reply text never appear in the logs unless LOG_PROMPTS=1.
"""

from __future__ import annotations

import logging
import re
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sidecar.web.observability.metrics import Metrics
from sidecar.web.observability.record import RequestRecord

request_log = logging.getLogger("sidecar.request")

# A caller's X-Request-Id is kept when it is a sane token (the chat app applies the same rule).
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})  # probes: debug level only


class DropDeliberateAbort(logging.Filter):
    """uvicorn reports a stream we end on purpose (see ReplyResponse); our line says it better."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("ASGI callable returned without completing")


class RequestLogMiddleware:
    """Gives every request an id (X-Request-Id, taken from the caller when it is sane) and logs
    one line when the request is over, streamed replies included."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        rid = incoming if REQUEST_ID.fullmatch(incoming) else uuid.uuid4().hex[:16]
        record = RequestRecord(rid, scope["method"], scope["path"])
        scope.setdefault("state", {})["record"] = record

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except BaseException:
            # Starlette's outermost handler answers 500 after us: the line still says so.
            if record.status is None:
                record.status = 500
                record.outcome = record.outcome or "error"
            raise
        finally:
            record.ended()
            record.duration_ms = round((time.monotonic() - record.started_at) * 1000, 1)
            if record.outcome is None:
                ok = record.status is not None and record.status < 400
                record.outcome = "ok" if ok else "rejected"
            self.metrics.observe(record)
            level = logging.DEBUG if scope["path"] in _QUIET_PATHS else logging.INFO
            request_log.log(level, "request", extra={"fields": record.fields()})
