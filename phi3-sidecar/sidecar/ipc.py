"""Messages between the web process and the model worker process (pickled over pipes).

Web -> worker: Generate, Cancel, Stop. Per-request messages carry the request's `key`.
Worker -> web: Phase (load progress), then per request either Rejected, or Started, any number
of Piece, and one End.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["system", "user", "assistant"]
PhaseName = Literal["starting", "downloading", "loading", "warming_up", "ready", "failed"]
Finish = Literal["eos", "length", "cancelled", "error"]


@dataclass(frozen=True, slots=True)
class Generate:
    request_id: str  # for log lines
    messages: tuple[tuple[Role, str], ...]
    max_new_tokens: int
    min_new_tokens: int = 0
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    key: int = 0  # unique per request (X-Request-Id may repeat); the web process sets it


@dataclass(frozen=True, slots=True)
class Cancel:
    key: int
    # time.monotonic() (one clock for all processes) right after the web process noticed the
    # disconnect and queued this message; the worker counts tokens it finished after that.
    noticed_at: float


@dataclass(frozen=True, slots=True)
class Stop:
    pass


@dataclass(frozen=True, slots=True)
class Phase:
    name: PhaseName
    reason: str | None = None
    context_length: int | None = None


@dataclass(frozen=True, slots=True)
class Rejected:
    key: int
    status: int
    kind: str
    message: str
    limit_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Started:
    key: int
    prompt_tokens: int
    dropped_messages: int
    max_new_tokens: int


@dataclass(frozen=True, slots=True)
class Piece:
    key: int
    text: str


@dataclass(frozen=True, slots=True)
class End:
    key: int
    finish: Finish
    generated_tokens: int
    tokens_per_s: float | None
    tokens_after_cancel: int | None = None


ToWorker = Generate | Cancel | Stop
FromWorker = Phase | Rejected | Started | Piece | End
