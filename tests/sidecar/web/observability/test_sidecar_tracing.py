"""Traces: the real sidecar exports to local receivers (OTLP, Azure Monitor's ingestion) and to
a file; its spans continue the caller's traceparent and hold the request's phases, never text.
Unconfigured, it imports no OpenTelemetry SDK and contacts nobody."""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import SecretStr

from scripts.run import services
from sidecar.settings import Settings
from sidecar.web.observability.record import RequestRecord
from sidecar.web.observability.telemetry import Tracing, exporters
from tests.sidecar.support import predict, request_line
from tests.support.receivers import (
    FAST_EXPORT,
    INSTRUMENTATION_KEY,
    UNREACHABLE_CONNECTION_STRING,
    AzureIngestion,
    OtlpReceiver,
    Span,
    forbid_connections,
    run_untraced,
    spans_in_file,
    wait_for,
)

MARKER = "okapi-marker-5521"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
PHASES = {"admission", "prefill", "decode"}


@pytest.fixture(scope="module")
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def azure() -> Iterator[AzureIngestion]:
    with AzureIngestion() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def traced_sidecar(
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    otlp: OtlpReceiver,
    azure: AzureIngestion,
) -> Iterator[tuple[services.Service, Path]]:
    """The sidecar sending its spans to all three destinations at once."""
    folder = tmp_path_factory.mktemp("traces")
    with services.sidecar(
        tiny_model_dir,
        folder / "sidecar.log",
        env={
            **FAST_EXPORT,
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url,
            "APPLICATIONINSIGHTS_CONNECTION_STRING": azure.connection_string(),
            "TRACES_FILE": str(folder / "traces.jsonl"),
        },
    ) as service:
        yield service, folder / "traces.jsonl"


def traced_predict(url: str, body: dict[str, Any], rid: str) -> httpx.Response:
    headers = {"traceparent": TRACEPARENT, "x-request-id": rid}
    return httpx.post(url + "/predict", json=body, headers=headers, timeout=60)


def of_request(spans: list[Span], rid: str) -> dict[str, Span]:
    """The request's server span ("server") and its phase spans, by name."""
    (server,) = [
        s for s in spans if s.attributes.get("phi3.request_id") == rid and s.kind == "SERVER"
    ]
    found = {"server": server}
    found |= {s.name: s for s in spans if s.parent_id == server.span_id}
    return found


def complete(rid: str) -> Any:
    def ready(spans: list[Span]) -> bool:
        servers = [s for s in spans if s.attributes.get("phi3.request_id") == rid]
        return bool(servers) and set(of_request(spans, rid)) >= PHASES

    return ready


def test_spans_continue_the_callers_trace_with_the_phases(
    traced_sidecar: tuple[services.Service, Path], otlp: OtlpReceiver
) -> None:
    service, _ = traced_sidecar
    response = traced_predict(
        service.url, {"input_text": f"Hi {MARKER}", "max_new_tokens": 6}, "trace-1"
    )
    assert response.status_code == 200
    line = request_line(service, "trace-1")
    spans = of_request(wait_for(otlp.spans, complete("trace-1")), "trace-1")
    server = spans["server"]
    assert (server.name, server.trace_id, server.parent_id) == (
        "POST /predict",
        TRACE_ID,
        PARENT_ID,
    )
    assert server.attributes["http.response.status_code"] == "200"
    for name in PHASES:
        assert spans[name].trace_id == TRACE_ID
        assert spans[name].attributes["phi3.request_id"] == "trace-1"
    admission, prefill, decode = spans["admission"], spans["prefill"], spans["decode"]
    assert admission.end_ns <= prefill.start_ns + 1000  # the same instant, rounding aside
    assert prefill.end_ns <= decode.start_ns + 1000
    assert server.start_ns <= admission.start_ns and decode.end_ns <= server.end_ns
    assert int(prefill.attributes["gen_ai.usage.input_tokens"]) == line["prompt_tokens"]
    assert int(decode.attributes["gen_ai.usage.output_tokens"]) == line["generated_tokens"]
    assert decode.attributes["phi3.outcome"] == line["outcome"]
    assert MARKER.encode() not in otlp.raw() and response.text.encode() not in otlp.raw()


def test_probes_make_no_spans_and_a_refusal_only_its_server_span(
    traced_sidecar: tuple[services.Service, Path], otlp: OtlpReceiver
) -> None:
    service, _ = traced_sidecar
    for path in ("/healthz", "/readyz", "/metrics"):
        httpx.get(service.url + path, headers={"traceparent": TRACEPARENT}, timeout=10)
    refused = traced_predict(service.url, {"input_text": " "}, "trace-refused")
    assert refused.status_code == 422

    def server_seen(spans: list[Span]) -> bool:
        return any(s.attributes.get("phi3.request_id") == "trace-refused" for s in spans)

    spans = wait_for(otlp.spans, server_seen)
    assert of_request(spans, "trace-refused").keys() == {"server"}
    assert not [s for s in spans if str(s.attributes.get("url.path")) in ("/healthz", "/readyz")]


def test_the_file_holds_the_same_spans_as_otlp_json_lines(
    traced_sidecar: tuple[services.Service, Path],
) -> None:
    service, path = traced_sidecar
    assert traced_predict(
        service.url, {"input_text": "Hi", "max_new_tokens": 3}, "file-1"
    ).is_success
    spans = of_request(wait_for(lambda: spans_in_file(path), complete("file-1")), "file-1")
    assert spans["server"].trace_id == TRACE_ID
    assert spans["server"].service == "phi3-sidecar"
    for line in path.read_text().splitlines():
        assert set(json.loads(line)) == {"resourceSpans"}


def test_azure_monitor_gets_a_request_and_its_phases(
    traced_sidecar: tuple[services.Service, Path], azure: AzureIngestion
) -> None:
    service, _ = traced_sidecar
    assert traced_predict(
        service.url, {"input_text": MARKER, "max_new_tokens": 3}, "az-1"
    ).is_success

    def of_request() -> list[dict[str, Any]]:
        items = [i for i in azure.items() if i["tags"].get("ai.operation.id") == TRACE_ID]
        requests = [
            i
            for i in items
            if i["data"]["baseType"] == "RequestData"
            and i["data"]["baseData"]["properties"].get("phi3.request_id") == "az-1"
        ]
        phases = [
            i
            for i in items
            if i["data"]["baseData"].get("properties", {}).get("phi3.request_id") == "az-1"
            and i["data"]["baseType"] != "RequestData"
        ]
        return requests + phases

    deadline = time.monotonic() + 20
    while len(of_request()) < 4:
        assert time.monotonic() < deadline, azure.items()
        time.sleep(0.05)
    request, *phases = of_request()
    assert request["data"]["baseData"]["name"] == "POST /predict"
    assert request["tags"]["ai.cloud.role"] == "phi3-sidecar"  # its role on the application map
    assert request["data"]["baseData"]["responseCode"] == "200"
    assert {p["data"]["baseData"]["name"] for p in phases} == PHASES
    assert {p["tags"]["ai.operation.parentId"] for p in phases} == {
        request["data"]["baseData"]["id"]
    }
    assert MARKER.encode() not in azure.raw()


def test_the_azure_exporter_is_built_from_a_connection_string_without_contacting_anyone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    forbid_connections(monkeypatch)
    settings = Settings(
        model_path=tmp_path,
        applicationinsights_connection_string=SecretStr(UNREACHABLE_CONNECTION_STRING),
    )
    (exporter,) = exporters(settings)
    assert type(exporter).__name__ == "AzureMonitorTraceExporter"
    assert exporter._instrumentation_key == INSTRUMENTATION_KEY  # type: ignore[attr-defined]
    exporter.shutdown()


def test_phase_spans_follow_the_record() -> None:
    """The phases come from the record's times: a refused request has admission only, one cut
    off during its prefill has no decode."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing = Tracing(provider)
    server = tracing.tracer.start_span("POST /predict")
    now = time.monotonic()
    whole = RequestRecord("r1", "POST", "/predict", prompt_tokens=9, generated_tokens=3)
    whole.queued_at, whole.admitted_at = now - 3, now - 2
    whole.piece_times = [now - 1, now - 0.5, now]
    tracing.request_spans(server, whole)
    refused = RequestRecord("r2", "POST", "/predict")
    refused.queued_at, refused.admitted_at = now - 1, now
    tracing.request_spans(server, refused)
    cut = RequestRecord("r3", "POST", "/predict", prompt_tokens=9, outcome="cancelled")
    cut.queued_at, cut.admitted_at = now - 1, now
    tracing.request_spans(server, cut)
    by_request: dict[str, list[str]] = {}
    for span in memory.get_finished_spans():
        assert (
            span.parent is not None
            and span.attributes is not None
            and span.parent.span_id == server.get_span_context().span_id
        )
        by_request.setdefault(str(span.attributes["phi3.request_id"]), []).append(span.name)
    assert by_request == {
        "r1": ["admission", "prefill", "decode"],
        "r2": ["admission"],
        "r3": ["admission", "prefill"],
    }
    decode = memory.get_finished_spans()[2]
    assert decode.end_time is not None and decode.start_time is not None
    assert decode.end_time - decode.start_time == pytest.approx(1e9, rel=1e-3)
    assert trace.get_tracer_provider() is not provider  # no global provider was set


def test_untraced_by_default(tiny_model_dir: Path) -> None:
    """Without a destination the web process loads no OpenTelemetry SDK, exporter or Azure
    code, sets no tracer provider, and opens no connection while serving a generation."""
    probe = textwrap.dedent(
        f"""
        import json, socket, sys, time
        opened = []
        real_connect = socket.socket.connect
        def connect(sock, address):
            opened.append(str(address))
            return real_connect(sock, address)
        socket.socket.connect = connect
        from fastapi.testclient import TestClient
        from opentelemetry import trace
        from sidecar.settings import Settings
        from sidecar.web.app import create_app
        app = create_app(Settings(model_path={str(tiny_model_dir)!r}))
        with TestClient(app, base_url="http://localhost") as client:
            while client.get("/readyz").status_code != 200:
                time.sleep(0.05)
            reply = client.post("/predict", json={{"input_text": "Hi", "max_new_tokens": 3}})
            assert reply.status_code == 200
        loaded = [m for m in sys.modules if m.startswith(("opentelemetry.sdk",
            "opentelemetry.exporter", "opentelemetry.instrumentation", "azure"))]
        provider = type(trace.get_tracer_provider()).__name__
        print(json.dumps({{"loaded": loaded, "provider": provider, "opened": opened}}))
        """
    )
    result = run_untraced(probe, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {
        "loaded": [],
        "provider": "ProxyTracerProvider",
        "opened": [],
    }


def test_the_untraced_service_connects_nowhere(sidecar_service: services.Service) -> None:
    """The real process, as tests start it by default: after a generation, its only TCP
    connections are on its own port (its listener, the client's)."""
    assert predict(sidecar_service.url, {"input_text": "Hi", "max_new_tokens": 3}).is_success
    port = int(sidecar_service.url.rsplit(":", 1)[1])
    web = psutil.Process(sidecar_service.process.pid)
    for process in (web, *web.children(recursive=True)):
        for connection in process.net_connections(kind="inet"):
            assert connection.laddr.port == port, (process.name(), connection)
