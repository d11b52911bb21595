"""Counters for GET /metrics (Prometheus text format)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sidecar import ipc

if TYPE_CHECKING:
    from sidecar.web.record import RequestRecord


# The routes that generate; their requests are counted (whichever way they end).
GENERATION_PATHS = frozenset({"/predict", "/v1/chat/completions"})


@dataclass
class Gauges:
    ready: bool
    active: int
    waiting: int
    worker_restarts: int
    cache: ipc.CacheStats  # the model worker's latest report (a new worker starts empty)


class Metrics:
    def __init__(self, *, prompt_cache: bool) -> None:
        self.outcomes: Counter[str] = Counter()
        self.generated_tokens = 0
        self.prompt_tokens = 0
        self.tokens_after_disconnect = 0
        self.prompt_cache = prompt_cache  # hits and misses mean something only when it is on
        self.cached_prompt_tokens = 0
        self.cache_hits = 0
        self.cache_misses = 0

    def observe(self, record: RequestRecord) -> None:
        if record.path not in GENERATION_PATHS:
            return
        self.outcomes[record.outcome or "unknown"] += 1
        self.generated_tokens += record.generated_tokens or 0
        self.prompt_tokens += record.prompt_tokens or 0
        self.tokens_after_disconnect += record.tokens_after_disconnect or 0
        if record.cached_tokens is not None:  # the request reached the model
            self.cached_prompt_tokens += record.cached_tokens
            if self.prompt_cache:
                if record.cached_tokens:
                    self.cache_hits += 1
                else:
                    self.cache_misses += 1

    def render(self, gauges: Gauges) -> str:
        lines = [
            "# HELP sidecar_requests_total Finished generation requests (/predict and "
            "/v1/chat/completions together) by outcome.",
            "# TYPE sidecar_requests_total counter",
        ]
        for outcome in ("eos", "stop", "length", "cancelled", "error", "rejected"):
            self.outcomes.setdefault(outcome, 0)
        for outcome, count in sorted(self.outcomes.items()):
            lines.append(f'sidecar_requests_total{{outcome="{outcome}"}} {count}')
        for name, kind, help_text, value in (
            ("generated_tokens_total", "counter", "Tokens generated.", self.generated_tokens),
            ("prompt_tokens_total", "counter", "Prompt tokens processed.", self.prompt_tokens),
            (
                "tokens_after_disconnect_total",
                "counter",
                "Tokens generated after a client disconnect was noticed.",
                self.tokens_after_disconnect,
            ),
            (
                "worker_restarts_total",
                "counter",
                "Model worker restarts.",
                gauges.worker_restarts,
            ),
            (
                "cached_prompt_tokens_total",
                "counter",
                "Prompt tokens not read again: the conversation cache held them.",
                self.cached_prompt_tokens,
            ),
            (
                "prompt_cache_hits_total",
                "counter",
                "Requests that continued a cached generator.",
                self.cache_hits,
            ),
            (
                "prompt_cache_misses_total",
                "counter",
                "Requests that read their whole prompt (cache on).",
                self.cache_misses,
            ),
            (
                "prompt_cache_evictions_total",
                "counter",
                "Cached generators dropped to make room (since the model worker started).",
                gauges.cache.evictions,
            ),
            (
                "prompt_cache_bytes",
                "gauge",
                "KV-cache bytes of the generators the conversation cache holds.",
                gauges.cache.bytes,
            ),
            (
                "prompt_cache_entries",
                "gauge",
                "Generators the conversation cache holds.",
                gauges.cache.entries,
            ),
            ("ready", "gauge", "1 when the model is ready.", int(gauges.ready)),
            ("active_generations", "gauge", "Generations running.", gauges.active),
            ("queue_depth", "gauge", "Requests waiting for a slot.", gauges.waiting),
        ):
            lines += [
                f"# HELP sidecar_{name} {help_text}",
                f"# TYPE sidecar_{name} {kind}",
                f"sidecar_{name} {value}",
            ]
        return "\n".join(lines) + "\n"
