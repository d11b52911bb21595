"""The log line format of both sidecar processes: one JSON object per line on stderr.

`ts` (ISO-8601 UTC, milliseconds), `level`, `logger`, `msg`, then the fields passed as
`extra={"fields": {...}}`. The chat app writes the same shape
(main-app/chatapp/observability/logs.py; a contract test keeps the two equal), so one query
reads both services' logs. A logged exception shows its type and frames, not its message (a
library's may quote the prompt), unless LOG_PROMPTS: the model worker passes it
(configure_logging's exception_messages).
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from datetime import UTC, datetime
from typing import Any


class JsonFormatter(logging.Formatter):
    """`exception_messages` False (the default): a logged exception shows its type and where it
    was raised, not its message (without_messages)."""

    def __init__(self, *, exception_messages: bool = False) -> None:
        super().__init__()
        self.exception_messages = exception_messages

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
            exc = record.exc_info
            shown = self.exception_messages or exc[1] is None
            data["exc"] = self.formatException(exc) if shown else without_messages(exc[1])
        return json.dumps(data, ensure_ascii=False, default=str)


_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def without_messages(exc: BaseException | None) -> str:
    """A traceback with each exception's type and frames (its cause and context too), without
    their messages and notes: a library's message may quote the text it was given (a
    tokenizer's "Invoked with: '<the whole prompt>'", a grammar library's last tokens)."""
    chain: list[BaseException] = []
    while exc is not None and all(exc is not seen for seen in chain):
        chain.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    lines: list[str] = []
    previous: BaseException | None = None
    for current in reversed(chain):  # the first one raised first, as Python prints them
        if previous is not None:
            lines.append(_CAUSE if current.__cause__ is previous else _CONTEXT)
        lines.append("Traceback (most recent call last):\n")
        lines.extend(traceback.format_tb(current.__traceback__))
        kind = type(current)
        lines.append(f"{kind.__module__}.{kind.__qualname__}: (message not logged)\n")
        previous = current
    return "".join(lines).rstrip("\n")


def configure_logging(
    level: str, *filters: logging.Filter, exception_messages: bool = False
) -> None:
    """JSON lines on stderr for every logger (uvicorn's included), from `level` up; exception
    messages only when `exception_messages` (LOG_PROMPTS: the model worker passes it; the web
    process's tracebacks never carry them)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(exception_messages=exception_messages))
    for log_filter in filters:
        handler.addFilter(log_filter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
