"""One trace from the browser's request to the model's decode: the real app (gunicorn) and the
real sidecar both export to one local OTLP receiver; the app's traceparent reaches the sidecar.
Unconfigured, the app loads no OpenTelemetry SDK and sets no provider."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from chatapp import settings as app_settings
from chatapp.observability.telemetry import span_exporters
from scripts.run import services
from tests.support.receivers import (
    FAST_EXPORT,
    UNREACHABLE_CONNECTION_STRING,
    OtlpReceiver,
    Span,
    forbid_connections,
    run_untraced,
    wait_for,
)

MARKER = "narwhal-marker-9034"


@pytest.fixture(scope="module")
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def traced_pair(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, otlp: OtlpReceiver
) -> Iterator[services.Service]:
    logs = tmp_path_factory.mktemp("logs")
    env = {**FAST_EXPORT, "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url}
    with (
        services.sidecar(tiny_model_dir, logs / "sidecar.log", env=env) as sidecar,
        services.chatapp(sidecar.url, logs / "app.log", env=env) as app,
    ):
        yield app


def test_one_trace_spans_the_app_and_the_sidecar(
    traced_pair: services.Service, otlp: OtlpReceiver
) -> None:
    body = {"messages": [{"role": "user", "content": f"Hi {MARKER}"}], "max_new_tokens": 5}
    response = httpx.post(traced_pair.url + "/chat", json=body, timeout=60)
    assert response.status_code == 200 and '"done"' in response.text
    rid = response.headers["x-request-id"]

    def whole(spans: list[Span]) -> bool:
        names = {(s.service, s.name) for s in spans if s.attributes.get("phi3.request_id") == rid}
        return {("phi3-chat-app", "POST /chat"), ("phi3-sidecar", "decode")} <= names

    spans = wait_for(otlp.spans, whole)
    (chat,) = [
        s for s in spans if s.name == "POST /chat" and s.attributes["phi3.request_id"] == rid
    ]
    trace = [s for s in spans if s.trace_id == chat.trace_id]
    by_id = {s.span_id: s for s in trace}

    def path(span: Span) -> list[str]:
        """The span's ancestors' names, root first."""
        names = [span.name]
        while span.parent_id:
            span = by_id[span.parent_id]
            names.insert(0, span.name)
        return names

    (decode,) = [s for s in trace if s.name == "decode"]
    assert path(decode) == ["POST /chat", "POST", "POST /predict", "decode"]
    services_by_name = {s.name: s.service for s in trace}
    assert services_by_name["POST"] == "phi3-chat-app"  # the call to the sidecar
    assert services_by_name["POST /predict"] == "phi3-sidecar"
    assert {s.name for s in trace} >= {"admission", "prefill", "decode"}
    # The app's span covers the whole stream, the sidecar's reply included.
    assert chat.start_ns <= decode.start_ns and decode.end_ns <= chat.end_ns
    assert chat.attributes["phi3.outcome"] == "done"
    (server,) = [s for s in trace if s.name == "POST /predict"]
    assert server.attributes["phi3.request_id"] == rid  # the same id in both services
    assert MARKER.encode() not in otlp.raw()


def test_the_apps_exporters_are_built_without_contacting_anyone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The same three destinations as the sidecar, from the app's settings."""
    forbid_connections(monkeypatch)
    config = {
        **app_settings.DEFAULTS,
        **app_settings.from_environ(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
                "APPLICATIONINSIGHTS_CONNECTION_STRING": UNREACHABLE_CONNECTION_STRING,
                "TRACES_FILE": str(tmp_path / "traces.jsonl"),
            }
        ),
    }
    exporters = span_exporters(config)
    assert [type(e).__name__ for e in exporters] == [
        "OTLPSpanExporter",
        "AzureMonitorTraceExporter",
        "FileSpanExporter",
    ]
    assert span_exporters({**config, "OTEL_SDK_DISABLED": True}) == []
    for exporter in exporters:
        exporter.shutdown()


def test_the_app_is_untraced_by_default() -> None:
    probe = textwrap.dedent(
        """
        import json, sys
        from opentelemetry import trace
        from chatapp import create_app
        client = create_app({"TESTING": True}).test_client()
        assert client.get("/").status_code == 200
        assert client.get("/metrics").status_code == 200
        loaded = [m for m in sys.modules if m.startswith(("opentelemetry.sdk",
            "opentelemetry.exporter", "opentelemetry.instrumentation", "azure"))]
        provider = type(trace.get_tracer_provider()).__name__
        print(json.dumps({"loaded": loaded, "provider": provider}))
        """
    )
    result = run_untraced(probe, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"loaded": [], "provider": "ProxyTracerProvider"}
