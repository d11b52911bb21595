"""What the app tells about itself besides its log lines: /metrics always (metrics.py),
and traces (OpenTelemetry) only when a destination is configured; else no OpenTelemetry SDK or
exporter is even imported.

Destinations, any together: OTLP/HTTP (`OTEL_EXPORTER_OTLP_ENDPOINT` or `_TRACES_ENDPOINT`),
Azure Monitor (`APPLICATIONINSIGHTS_CONNECTION_STRING`), a file of OTLP JSON lines
(`TRACES_FILE`); the sidecar has the same rules
(phi3-sidecar/sidecar/web/observability/telemetry.py). The SDK reads OpenTelemetry's other
standard variables itself (`OTEL_TRACES_SAMPLER`, ...).

The trace of a chat: a server span for the browser's request, made by OpenTelemetry's WSGI
middleware, which ends it after the last line of the stream (Flask's own instrumentation ends
it at Flask's teardown, before a streamed body is sent); the requests instrumentation's client
span for the call to the sidecar, which carries W3C `traceparent` to it (and ends when the
sidecar's headers arrive: the sidecar's own spans cover its reply). The server span is named
by the route, never the raw path, and holds the request id and how the chat ended; no span
ever holds message text. Works under gunicorn's gthread and gevent workers alike: a request's
context lives in its thread or greenlet, and a response is iterated where it was made.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from flask import Flask, has_request_context, request

from chatapp.observability.metrics import ChatMetrics

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter


# Polled by health checks and scrapers: no spans.
UNTRACED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
# What ChatRecord.finish reports: (status, outcome, seconds).
ChatObserver = Callable[[int, str, float], None]


class Telemetry:
    """The relay's reports (ChatRecord.finish, relay/chat.py) go to the metrics and the trace."""

    def __init__(self, metrics: ChatMetrics, provider: TracerProvider | None = None) -> None:
        self.metrics = metrics
        self.provider = provider

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Telemetry:
        return cls(ChatMetrics(), tracer_provider(config))

    def install(self, app: Flask) -> None:
        """Wrap the app in the tracing middleware and trace calls to the sidecar (if traced)."""
        if self.provider is None:
            return
        # HTTP attributes by OpenTelemetry's stable conventions, as the sidecar's FastAPI spans
        # have them (the instrumentations read this once, at their first use).
        os.environ.setdefault("OTEL_SEMCONV_STABILITY_OPT_IN", "http")
        from opentelemetry.instrumentation.requests import RequestsInstrumentor
        from opentelemetry.instrumentation.wsgi import OpenTelemetryMiddleware

        plain = app.wsgi_app
        traced = OpenTelemetryMiddleware(
            plain, response_hook=_name_span, tracer_provider=self.provider
        )

        def wsgi_app(environ: dict[str, Any], start_response: Any) -> Any:
            if environ.get("PATH_INFO") in UNTRACED_PATHS:
                return plain(environ, start_response)
            return traced(environ, start_response)

        app.wsgi_app = wsgi_app  # type: ignore[method-assign]
        instrumentor = RequestsInstrumentor()
        if not instrumentor.is_instrumented_by_opentelemetry:  # one patch per process
            # The health route's polls of /readyz make no spans.
            instrumentor.instrument(tracer_provider=self.provider, excluded_urls="/readyz$")

    def chat_observer(self, request_id: str) -> ChatObserver:
        """For a new chat's record (relay/chat.py): what ChatRecord.finish reports to. Made while
        the chat's server span is the current one; the stream ends outside of it."""
        span = None
        if self.provider is not None:
            from opentelemetry import trace

            span = trace.get_current_span()
            span.set_attribute("phi3.request_id", request_id)

        def finished(status: int, outcome: str, seconds: float) -> None:
            self.metrics.chat_finished(status, outcome, seconds)
            if span is not None:
                from opentelemetry.trace import StatusCode

                span.set_attribute("phi3.outcome", outcome)
                # A server error, or a stream that broke off (a client's mistake is no error).
                broke_off = status == 200 and outcome not in ("done", "client_gone")
                if status >= 500 or broke_off:
                    span.set_status(StatusCode.ERROR, outcome)

        return finished

    def stream_opened(self) -> None:
        self.metrics.stream_opened()

    def upstream_error(self, type: str) -> None:
        self.metrics.upstream_error(type)


def _name_span(span: Any, environ: Any, status: str, headers: Any) -> None:
    """At start_response, inside Flask's request: the route names the span (a bounded name,
    where the middleware's default has the raw path)."""
    if not span.is_recording() or not has_request_context():
        return
    rule = request.url_rule
    span.update_name(f"{request.method} {rule.rule}" if rule else request.method)
    if rule:
        span.set_attribute("http.route", rule.rule)


def tracer_provider(config: Mapping[str, Any]) -> TracerProvider | None:
    """A provider sending spans where the config says; None when it names no destination."""
    exporters = span_exporters(config)
    if not exporters:
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # Flushed at exit (each gunicorn worker is a process of its own).
    provider = TracerProvider(
        resource=Resource.create({"service.name": config["OTEL_SERVICE_NAME"]})
    )
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def span_exporters(config: Mapping[str, Any]) -> list[SpanExporter]:
    """One exporter per destination in the config (the sidecar's rules:
    web/observability/telemetry.py)."""
    if config["OTEL_SDK_DISABLED"]:
        return []
    found: list[SpanExporter] = []
    endpoint = config["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    if endpoint is None and config["OTEL_EXPORTER_OTLP_ENDPOINT"] is not None:
        endpoint = config["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"
    if endpoint is not None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        found.append(OTLPSpanExporter(endpoint=endpoint))
    if config["APPLICATIONINSIGHTS_CONNECTION_STRING"] is not None:
        found.append(azure_exporter(config["APPLICATIONINSIGHTS_CONNECTION_STRING"]))
    if config["TRACES_FILE"] is not None:
        from opentelemetry.exporter.otlp.json.file import FileSpanExporter

        found.append(FileSpanExporter(config["TRACES_FILE"]))
    return found


def azure_exporter(connection_string: str) -> SpanExporter:
    """Azure Monitor's exporter, sending spans only: its own usage statistics to Microsoft
    (statsbeat) and its remote configuration (OneSettings) stay off unless the environment
    turns them on."""
    os.environ.setdefault("APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL", "true")
    os.environ.setdefault("APPLICATIONINSIGHTS_CONTROLPLANE_DISABLED", "true")
    from azure.monitor.opentelemetry.exporter import AzureMonitorTraceExporter

    exporter: SpanExporter = AzureMonitorTraceExporter(connection_string=connection_string)
    return exporter
