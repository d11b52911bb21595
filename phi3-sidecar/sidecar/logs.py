"""JSON log lines, and one structured line per request (with its X-Request-Id).

Prompt and reply text never appear in the logs unless LOG_PROMPTS=1.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sidecar.metrics import Metrics

request_log = logging.getLogger("sidecar.request")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
_QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})  # probes: debug level only


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            data.update(fields)
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, ensure_ascii=False, default=str)


class _DropDeliberateAbort(logging.Filter):
    """uvicorn reports a stream we end on purpose (see ReplyResponse); our line says it better."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("ASGI callable returned without completing")


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(_DropDeliberateAbort())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True


@dataclass
class RequestRecord:
    """What the one log line of a request says; routes fill in what they know."""

    request_id: str
    method: str
    path: str
    status: int | None = None
    stream: bool | None = None  # /v1/chat/completions only: false = one JSON body at the end
    outcome: str | None = None  # eos, length, cancelled, error, rejected, ok
    error_type: str | None = None
    prompt_tokens: int | None = None
    dropped_messages: int | None = None
    generated_tokens: int | None = None
    ttft_ms: float | None = None
    tokens_per_s: float | None = None
    tokens_after_disconnect: int | None = None
    duration_ms: float | None = None
    prompt: Any = None  # only with LOG_PROMPTS=1
    reply: str | None = None  # only with LOG_PROMPTS=1
    started_at: float = field(default_factory=time.monotonic, repr=False)

    def fields(self) -> dict[str, Any]:
        data = asdict(self)
        del data["started_at"]
        return {k: v for k, v in data.items() if v is not None}


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
        rid = incoming if _REQUEST_ID.match(incoming) else uuid.uuid4().hex[:16]
        record = RequestRecord(rid, scope["method"], scope["path"])
        scope.setdefault("state", {})["record"] = record

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            record.duration_ms = round((time.monotonic() - record.started_at) * 1000, 1)
            if record.outcome is None:
                ok = record.status is not None and record.status < 400
                record.outcome = "ok" if ok else "rejected"
            self.metrics.observe(record)
            level = logging.DEBUG if scope["path"] in _QUIET_PATHS else logging.INFO
            request_log.log(level, "request", extra={"fields": record.fields()})
