"""Logs: JSON lines, and one structured line per `POST /chat` joined to the sidecar's by its id.

Every line is one JSON object: `ts` (ISO-8601 UTC, milliseconds), `level`, `logger`, `msg`,
then the fields passed as `extra={"fields": {...}}`; the sidecar's lines have the same shape
(phi3-sidecar/sidecar/jsonlog.py). Each chat gets a request id: the browser's `X-Request-Id` when
it is a sane token (the sidecar's rule), else a new one. The app sends it to the sidecar and
back to the browser, and logs one `chatapp.request` line when the chat ends (`ChatRecord`).
Message and reply text are never logged, nor images (the line counts them), nor an exception's
message (it may quote them): a traceback shows each exception's type and frames
(without_messages, as the sidecar's).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

request_log = logging.getLogger("chatapp.request")

# What the sidecar takes as X-Request-Id (its web/observability/request_log.py;
# tests/test_contracts.py keeps them equal), so both services log the same id.
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


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


def configure_logging(level: str) -> None:
    """JSON lines on stderr for every logger, from `level` up (the servers call this)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def request_id(incoming: str | None) -> str:
    """The caller's id when it is a sane token, else a new one."""
    if incoming and REQUEST_ID.fullmatch(incoming):
        return incoming
    return uuid.uuid4().hex[:16]


@dataclass
class ChatRecord:
    """What the one line of a chat says; the route and the relay fill in what they learn."""

    request_id: str
    model: str | None = None  # the model the chat named (POST /chat's `model`)
    messages: int | None = None
    images: int | None = None  # how many the chat carried (never their bytes)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    dropped_messages: int | None = None
    pieces: int = 0  # text pieces relayed: a piece may carry several tokens
    generated_tokens: int | None = None  # the model service's count, when it gives one
    ttft_ms: float | None = None
    tokens_per_s: float | None = None
    # A grounded turn (`"documents": true`): its library search and prompt building, part of
    # ttft_ms, and the passages it was given
    grounding_ms: float | None = None
    passages: int | None = None
    passage_cached_tokens: int | None = None  # of prompt_tokens, from the passage store
    started: float = field(default_factory=time.monotonic)
    # Told (status, outcome, seconds) when the chat ends: /metrics and the trace (telemetry.py).
    observer: Callable[[int, str, float], None] | None = field(default=None, repr=False)
    _logged: bool = field(default=False, repr=False)

    @property
    def tokens(self) -> int:
        """The reply's length in tokens: the model service's count, else the pieces relayed."""
        return self.pieces if self.generated_tokens is None else self.generated_tokens

    def finish(self, status: int, outcome: str) -> None:
        """Log the line: `status` as sent, `outcome` `done`, an error type or `client_gone`.
        Only the first call logs."""
        if self._logged:
            return
        self._logged = True
        seconds = time.monotonic() - self.started
        if self.observer is not None:
            self.observer(status, outcome, seconds)
        fields: dict[str, Any] = {
            "request_id": self.request_id,
            "status": status,
            "outcome": outcome,
            "model": self.model,
            "messages": self.messages,
            "images": self.images,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "finish_reason": self.finish_reason,
            "dropped_messages": self.dropped_messages,
            "pieces": self.pieces,
            "generated_tokens": self.generated_tokens,
            "ttft_ms": self.ttft_ms,
            "tokens_per_s": self.tokens_per_s,
            "grounding_ms": self.grounding_ms,
            "passages": self.passages,
            "passage_cached_tokens": self.passage_cached_tokens,
            "duration_ms": round(seconds * 1000, 1),
        }
        known = {k: v for k, v in fields.items() if v is not None}
        request_log.info("chat", extra={"fields": known})
