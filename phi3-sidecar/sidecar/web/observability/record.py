"""What the one log line of a request says (RequestLogMiddleware writes it, Metrics counts it)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Timings kept for /metrics and the trace (web/observability/metrics.py,
# web/observability/telemetry.py), not logged.
_NOT_LOGGED = (
    "started_at",
    "queued_at",
    "admitted_at",
    "piece_times",
    "decode_steps",
    "cleanups",
)


@dataclass
class RequestRecord:
    """What the one log line of a request says; routes fill in what they know."""

    request_id: str
    method: str
    path: str
    status: int | None = None
    stream: bool | None = None  # /v1/chat/completions only: false = one JSON body at the end
    # /v1/chat/completions only: what the reply was held to (json_object, json_schema, tools)
    structured: str | None = None
    outcome: str | None = None  # eos, stop, length, time_limit, cancelled, error, ...
    error_type: str | None = None
    closed: str | None = None  # the sidecar closed the connection: "write_timeout"
    # outcome "error" from a fault of this reply's own step (ipc.End.fault): its exception's
    # type, never its message
    fault: str | None = None
    prompt_tokens: int | None = None
    # a request with images (images/decoding.py): how many, and the prompt tokens that stand for
    # them (of prompt_tokens); never their bytes or URLs
    images: int | None = None
    image_tokens: int | None = None
    cached_tokens: int | None = None  # of prompt_tokens, read from the conversation cache
    passage_cached_tokens: int | None = None  # of prompt_tokens, from the passage store
    model: str | None = None  # with MODELS_FILE: the model that answered (its id)
    cache_reason: str | None = None  # why (model/kv/prompt_cache.py, REASONS)
    # where those came from: ram (its KV slot), compact (compact RAM), disk (the disk tier);
    # and the time it took to put them back into a KV slot (model/kv/tiers.py)
    cache_tier: str | None = None
    restore_ms: float | None = None
    embedding_inputs: int | None = None  # /v1/embeddings: inputs (prompt_tokens: their tokens)
    dropped_messages: int | None = None
    # Building the prompt (model/prompt/process.py): characters tokenized (0: none, the
    # tokens were kept) and the time it took; the time the request waited for room under the
    # KV bound (KV_MEMORY_MB) before it started
    tokenized_chars: int | None = None
    prepare_ms: float | None = None
    kv_wait_ms: float | None = None
    # its start moving kept conversations down a tier for its room: the time, and how many
    # it compacted and wrote to the disk tier
    room_ms: float | None = None
    room_compacted: int | None = None
    room_spilled: int | None = None
    kv_paused_ms: float | None = None  # once started, waiting for room to grow (kv/bound.py)
    # A refusal by the model worker: the time its side spent on the request before refusing
    # it, and true when the byte bound refused it before any tokenization (issue 46)
    refusal_ms: float | None = None
    byte_bound: bool | None = None
    generated_tokens: int | None = None
    queue_wait_ms: float | None = None  # from asking for a generation slot to getting one
    ttft_ms: float | None = None
    tokens_per_s: float | None = None
    tokens_after_disconnect: int | None = None
    # PROMPT_LOOKUP_TOKENS: draft tokens checked and accepted, tokens per model call
    draft_tokens: int | None = None
    accepted_draft_tokens: int | None = None
    tokens_per_step: float | None = None
    decode_steps: int | None = field(default=None, repr=False)  # for /metrics
    duration_ms: float | None = None
    prompt: Any = None  # only with LOG_PROMPTS=1
    reply: str | None = None  # only with LOG_PROMPTS=1
    # time.monotonic() (one clock for both processes): arrival, asking for a slot, getting it,
    # and when the model worker made each piece of text (ipc.Piece.at).
    started_at: float = field(default_factory=time.monotonic, repr=False)
    queued_at: float | None = field(default=None, repr=False)
    admitted_at: float | None = field(default=None, repr=False)
    piece_times: list[float] = field(default_factory=list, repr=False)
    # What to give back when the request is over, however it ended (image memory:
    # images/decoding.py)
    cleanups: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def on_end(self, cleanup: Callable[[], None]) -> None:
        self.cleanups.append(cleanup)

    def ended(self) -> None:
        """The request is over (RequestLogMiddleware): run its cleanups, once."""
        cleanups, self.cleanups = self.cleanups, []
        for cleanup in cleanups:
            cleanup()

    def admitted(self, queued_at: float) -> None:
        """The request asked for a slot at `queued_at` and got it now."""
        self.queued_at, self.admitted_at = queued_at, time.monotonic()
        self.queue_wait_ms = round((self.admitted_at - queued_at) * 1000, 1)

    def fields(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {k: v for k, v in data.items() if v is not None and k not in _NOT_LOGGED}
