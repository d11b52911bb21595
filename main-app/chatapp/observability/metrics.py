"""GET /metrics (Prometheus text format, written by prometheus-client): the relay as the app
sees it. Label values come from fixed sets of the code only (never a request id, never text).

- `chatapp_relay_duration_seconds{outcome}`: a chat from its request to its last line;
  `outcome` is `done`, `client_gone`, or the error type the chat ended with;
- `chatapp_upstream_errors_total{type}`: failures of the hop to the sidecar (`loading`, `busy`,
  `upstream_unavailable`, `upstream_timeout`, `upstream_disconnected`, `reply_time_limit`,
  ...);
- `chatapp_open_streams`: replies being streamed now;
- `chatapp_indexer_restarts_total{cause}`: documents indexer processes gunicorn's master started
  again after one died (`killed`: a signal; `exited`: an exit code), counted by the master's
  supervisor (chatapp/documents/indexer/supervisor.py), not here, into the same folder.

Under gunicorn every worker process counts its own chats, so each writes its numbers into one
shared folder (prometheus-client's multiprocess mode) and /metrics adds them up: gunicorn's
hooks make the folder before the first worker starts (gunicorn_metrics.py), and the
master never imports this module: prometheus-client picks its mode when it is imported.
"""

from __future__ import annotations

import os

from flask import Blueprint, Response, current_app
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)

bp = Blueprint("metrics", __name__)

MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"  # set by gunicorn_metrics.on_starting
# What ended a chat without a problem on the sidecar's side (ChatRecord.finish's outcome).
_NOT_UPSTREAM = frozenset({"done", "client_gone"})
_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)


class ChatMetrics:
    def __init__(self) -> None:
        disable_created_metrics()  # no `_created` series (a process-wide switch; idempotent)
        # In multiprocess mode the numbers live in the folder's files, not in a registry.
        self._registry: CollectorRegistry | None = (
            None if os.environ.get(MULTIPROC_DIR) else CollectorRegistry()
        )
        registry = self._registry
        self.duration = Histogram(
            "chatapp_relay_duration_seconds",
            "A chat from its request to its last line, by how it ended.",
            ["outcome"],
            buckets=_DURATION_BUCKETS,
            registry=registry,
        )
        self.upstream_errors = Counter(
            "chatapp_upstream_errors",
            "Failures of the hop to the model service, by type.",
            ["type"],
            registry=registry,
        )
        self.open_streams = Gauge(
            "chatapp_open_streams",
            "Replies being streamed now.",
            registry=registry,
            multiprocess_mode="livesum",  # the live workers' streams, added up
        )

    def chat_finished(self, status: int, outcome: str, seconds: float) -> None:
        self.duration.labels(outcome).observe(seconds)
        if status == 200:  # /chat answers 200 only with a stream: it has ended
            self.open_streams.dec()
            if outcome not in _NOT_UPSTREAM:  # broke off mid-reply
                self.upstream_errors.labels(outcome).inc()

    def stream_opened(self) -> None:
        self.open_streams.inc()

    def upstream_error(self, type: str) -> None:
        self.upstream_errors.labels(type).inc()

    def render(self) -> bytes:
        registry = self._registry
        if registry is None:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)


@bp.get("/metrics")
def metrics_text() -> Response:
    metrics: ChatMetrics = current_app.extensions["telemetry"].metrics
    return Response(metrics.render(), mimetype="text/plain; version=0.0.4")
