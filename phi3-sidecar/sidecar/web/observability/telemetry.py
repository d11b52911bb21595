"""Traces (OpenTelemetry), only when a destination is configured: else nothing here runs and
no OpenTelemetry SDK or exporter is even imported.

Destinations, any together: OTLP/HTTP (OTEL_EXPORTER_OTLP_ENDPOINT or _TRACES_ENDPOINT),
Azure Monitor (APPLICATIONINSIGHTS_CONNECTION_STRING), a file of OTLP JSON lines (TRACES_FILE).
The SDK reads OpenTelemetry's other standard variables itself (OTEL_TRACES_SAMPLER,
OTEL_RESOURCE_ATTRIBUTES, OTEL_EXPORTER_OTLP_HEADERS, OTEL_BSP_*, ...).

FastAPI's own instrumentation makes each request's server span, continuing the caller's W3C
`traceparent`; the probes are left out. `TraceRequest` names the request id on it and, when the
request is over, adds its phases as child spans from the times the request record kept:
`admission` (the queue wait), `prefill` (from the slot to the first token, with the prompt's
token counts) and `decode` (first to last token, with the generated count and the outcome).
The first and last token times are the model worker's own (ipc.Piece.at). No span or attribute
ever holds prompt or reply text.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from fastapi.telemetry import TelemetryConfig
from opentelemetry import trace
from starlette.types import ASGIApp, Receive, Scope, Send

from sidecar.settings import Settings
from sidecar.web.observability.record import RequestRecord

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

# The probes make no spans: they are polled every few seconds and say nothing about a reply.
UNTRACED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


class Tracing:
    """The service's tracer provider and the spans it adds to FastAPI's."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("sidecar")

    @classmethod
    def from_settings(cls, settings: Settings) -> Tracing | None:
        """The tracing the settings ask for; None when they name no destination."""
        if not settings.tracing:
            return None
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(
            resource=Resource.create({"service.name": settings.otel_service_name}),
            shutdown_on_exit=False,  # the app's lifespan shuts it down (flushes the last spans)
        )
        for exporter in exporters(settings):
            provider.add_span_processor(BatchSpanProcessor(exporter))
        return cls(provider)

    def fastapi_config(self) -> TelemetryConfig:
        """FastAPI(telemetry=...): its server spans, on this provider, nothing else."""
        return {
            "tracing": True,
            "tracer_provider": self.provider,
            "metrics": False,  # /metrics has them (web/observability/metrics.py)
            "logs": False,
            "operation_spans": False,
            "exclude": lambda scope: scope.get("path") in UNTRACED_PATHS,
        }

    def shutdown(self) -> None:
        self.provider.shutdown()

    def request_spans(self, server: trace.Span, record: RequestRecord) -> None:
        """The request's phases as children of its server span, once it is over."""
        clock = _Clock()
        parent = trace.set_span_in_context(server)
        ids = {"phi3.request_id": record.request_id}
        if record.queued_at is not None and record.admitted_at is not None:
            self._span("admission", parent, clock, record.queued_at, record.admitted_at, ids)
        if record.admitted_at is None or record.prompt_tokens is None:
            return  # refused, or never reached the model
        times = record.piece_times
        first = times[0] if times else time.monotonic()
        prompt = {
            **ids,
            "gen_ai.usage.input_tokens": record.prompt_tokens,
            "phi3.cached_tokens": record.cached_tokens or 0,
            "phi3.dropped_messages": record.dropped_messages or 0,
        }
        self._span("prefill", parent, clock, record.admitted_at, first, prompt)
        if times:
            reply = {
                **ids,
                "gen_ai.usage.output_tokens": record.generated_tokens or 0,
                "phi3.outcome": record.outcome or "unknown",
            }
            if record.tokens_per_s is not None:
                reply["phi3.tokens_per_s"] = record.tokens_per_s
            span = self._span("decode", parent, clock, times[0], times[-1], reply)
            if record.outcome == "error":
                span.set_status(trace.StatusCode.ERROR)

    def _span(
        self,
        name: str,
        parent: Any,
        clock: _Clock,
        start: float,
        end: float,
        attributes: dict[str, Any],
    ) -> trace.Span:
        span = self.tracer.start_span(
            name, context=parent, start_time=clock.ns(start), attributes=attributes
        )
        span.end(end_time=clock.ns(end))
        return span


class TraceRequest:
    """ASGI middleware inside RequestLogMiddleware (which makes the request's record): the
    request id on the server span, then the phase spans when the request is over."""

    def __init__(self, app: ASGIApp, tracing: Tracing) -> None:
        self.app = app
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = trace.get_current_span()
        if scope["type"] != "http" or not server.is_recording():
            await self.app(scope, receive, send)
            return
        record: RequestRecord = scope["state"]["record"]
        server.set_attribute("phi3.request_id", record.request_id)
        try:
            await self.app(scope, receive, send)
        finally:
            self.tracing.request_spans(server, record)


class _Clock:
    """time.monotonic() seconds to the epoch nanoseconds spans are stamped with."""

    def __init__(self) -> None:
        self._offset = time.time_ns() - time.monotonic_ns()

    def ns(self, monotonic: float) -> int:
        return int(monotonic * 1e9) + self._offset


def exporters(settings: Settings) -> list[SpanExporter]:
    """One exporter per destination the settings name (the chat app has the same rules:
    chatapp/observability/telemetry.py)."""
    found: list[SpanExporter] = []
    endpoint = settings.otel_exporter_otlp_traces_endpoint
    if endpoint is None and settings.otel_exporter_otlp_endpoint is not None:
        endpoint = settings.otel_exporter_otlp_endpoint.rstrip("/") + "/v1/traces"
    if endpoint is not None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        found.append(OTLPSpanExporter(endpoint=endpoint))
    if settings.applicationinsights_connection_string is not None:
        found.append(azure_exporter(settings.applicationinsights_connection_string))
    if settings.traces_file is not None:
        from opentelemetry.exporter.otlp.json.file import FileSpanExporter

        found.append(FileSpanExporter(settings.traces_file))
    return found


def azure_exporter(connection_string: Any) -> SpanExporter:
    """Azure Monitor's exporter, sending spans only: its own usage statistics to Microsoft
    (statsbeat) and its remote configuration (OneSettings) stay off unless the environment
    turns them on, as ORT_DISABLE_TELEMETRY does for onnxruntime."""
    os.environ.setdefault("APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL", "true")
    os.environ.setdefault("APPLICATIONINSIGHTS_CONTROLPLANE_DISABLED", "true")
    from azure.monitor.opentelemetry.exporter import AzureMonitorTraceExporter

    exporter: SpanExporter = AzureMonitorTraceExporter(
        connection_string=connection_string.get_secret_value()
    )
    return exporter
