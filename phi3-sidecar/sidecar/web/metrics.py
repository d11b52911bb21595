"""Counters for GET /metrics (Prometheus text format)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

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


class Metrics:
    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.generated_tokens = 0
        self.prompt_tokens = 0
        self.tokens_after_disconnect = 0

    def observe(self, record: RequestRecord) -> None:
        if record.path not in GENERATION_PATHS:
            return
        self.outcomes[record.outcome or "unknown"] += 1
        self.generated_tokens += record.generated_tokens or 0
        self.prompt_tokens += record.prompt_tokens or 0
        self.tokens_after_disconnect += record.tokens_after_disconnect or 0

    def render(self, gauges: Gauges) -> str:
        lines = [
            "# HELP sidecar_requests_total Finished generation requests (/predict and "
            "/v1/chat/completions together) by outcome.",
            "# TYPE sidecar_requests_total counter",
        ]
        for outcome in ("eos", "length", "cancelled", "error", "rejected"):
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
