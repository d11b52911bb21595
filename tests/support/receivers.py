"""Local stand-ins for where traces go, so exporters are tested without a collector or Azure:
an OTLP/HTTP receiver (what an OpenTelemetry collector offers on port 4318) and an Application
Insights ingestion endpoint (what APPLICATIONINSIGHTS_CONNECTION_STRING's IngestionEndpoint
names). Both listen on loopback, keep what they receive in memory, and answer as the real ones
do. Spans read from either, or from a TRACES_FILE, become `Span`s. Also the two ways both
services' tests prove that nothing connects: `forbid_connections` in the test's own process,
`run_untraced` for a fresh interpreter with no tracing settings.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

# Faster than the SDK's 5 s batches: tests wait for spans.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "50"}
INSTRUMENTATION_KEY = "00000000-0000-0000-0000-000000000000"
# Application Insights nobody can reach: exporters are built from it, never connect to it.
UNREACHABLE_CONNECTION_STRING = (
    f"InstrumentationKey={INSTRUMENTATION_KEY};IngestionEndpoint=https://example.invalid/"
)
TRACING_SETTINGS = ("OTEL_", "APPLICATIONINSIGHTS_", "TRACES_FILE")


def forbid_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any socket connect in this process fails the test, with Azure Monitor's statsbeat and
    control plane left as a real deployment has them (the test setup turns them off)."""
    for name in (
        "APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL",
        "APPLICATIONINSIGHTS_CONTROLPLANE_DISABLED",
    ):
        monkeypatch.delenv(name, raising=False)

    def no_network(*args: object) -> None:
        raise AssertionError(f"connect{args}")

    monkeypatch.setattr(socket.socket, "connect", no_network)


def run_untraced(probe: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """`probe` in a fresh interpreter whose environment has no tracing setting."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(TRACING_SETTINGS)}
    return subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=timeout, env=clean
    )


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    kind: str
    trace_id: str  # hex, as in traceparent
    span_id: str
    parent_id: str  # "" for a root span
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]


def spans_from_otlp_json(resource_spans: Iterable[dict[str, Any]]) -> list[Span]:
    """Spans from OTLP's JSON form (the file exporter's lines, or a decoded protobuf body)."""
    found = []
    for resource in resource_spans:
        attributes = _attributes(resource["resource"].get("attributes", []))
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                found.append(
                    Span(
                        service=attributes["service.name"],
                        name=span["name"],
                        kind=_kind(span.get("kind", 0)),
                        trace_id=span["traceId"],
                        span_id=span["spanId"],
                        parent_id=span.get("parentSpanId", ""),
                        start_ns=int(span["startTimeUnixNano"]),
                        end_ns=int(span["endTimeUnixNano"]),
                        attributes=_attributes(span.get("attributes", [])),
                    )
                )
    return found


_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")


def _kind(kind: int | str) -> str:
    """SERVER, CLIENT, ...: OTLP JSON has the number, protobuf's dict the enum's name."""
    if isinstance(kind, int) or kind.isdigit():
        return _KINDS[int(kind)]
    return kind.removeprefix("SPAN_KIND_")


def spans_in_file(path: Path) -> list[Span]:
    if not path.exists():
        return []
    text = path.read_text()
    lines = text[: text.rfind("\n") + 1].splitlines()  # the last one may be half written
    return [s for line in lines for s in spans_from_otlp_json(json.loads(line)["resourceSpans"])]


def _attributes(items: list[dict[str, Any]]) -> dict[str, Any]:
    values = {}
    for item in items:
        ((_, value),) = item["value"].items()
        values[item["key"]] = value
    return values


def wait_for(spans: Callable[[], list[Span]], ready: Callable[[list[Span]], bool]) -> list[Span]:
    """The spans once `ready` says they are all there (exports come in batches)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = spans()
        if ready(found):
            return found
        time.sleep(0.05)
    raise AssertionError(f"spans never complete: {[(s.service, s.name) for s in spans()]}")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        status, answer, content_type = self.server.receiver.receive(self.path, body)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    receiver: Receiver


class Receiver:
    """A loopback HTTP server that keeps every body it is sent; `url` is its base."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, bytes]] = []  # (path, body), bodies unzipped
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.receiver = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,))
        self._thread.daemon = True

    def receive(self, path: str, body: bytes) -> tuple[int, bytes, str]:
        with self._lock:
            self.bodies.append((path, body))
        return 200, b"", "application/x-protobuf"

    def raw(self) -> bytes:
        with self._lock:
            return b"".join(body for _, body in self.bodies)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class OtlpReceiver(Receiver):
    """OTLP/HTTP with protobuf bodies at /v1/traces, as a collector takes them."""

    def spans(self) -> list[Span]:
        with self._lock:
            bodies = [body for path, body in self.bodies if path == "/v1/traces"]
        found = []
        for body in bodies:
            request = ExportTraceServiceRequest.FromString(body)
            data = MessageToDict(request)  # ids come out base64: turned to hex below
            found += spans_from_otlp_json(_hex_ids(data.get("resourceSpans", [])))
        return found


def _hex_ids(resource_spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for resource in resource_spans:
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return resource_spans


class AzureIngestion(Receiver):
    """Application Insights' ingestion endpoint (/v2.1/track): JSON envelopes, one per item."""

    def receive(self, path: str, body: bytes) -> tuple[int, bytes, str]:
        super().receive(path, body)
        items = self.items_in(body)
        answer = {"itemsReceived": len(items), "itemsAccepted": len(items), "errors": []}
        return 200, json.dumps(answer).encode(), "application/json"

    @staticmethod
    def items_in(body: bytes) -> list[dict[str, Any]]:
        text = body.decode()
        if text.lstrip().startswith("["):
            items: list[dict[str, Any]] = json.loads(text)
            return items
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def items(self) -> list[dict[str, Any]]:
        with self._lock:
            bodies = [body for path, body in self.bodies if path.endswith("/track")]
        return [item for body in bodies for item in self.items_in(body)]

    def connection_string(self) -> str:
        return f"InstrumentationKey={INSTRUMENTATION_KEY};IngestionEndpoint={self.url}/"
