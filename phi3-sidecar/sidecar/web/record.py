"""What the one log line of a request says (RequestLogMiddleware writes it, Metrics counts it)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any


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
