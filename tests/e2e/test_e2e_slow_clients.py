"""Slow and idle clients cannot take either service offline: with connections that stall
mid-headers, send headers a byte a second, stall mid-body or send a chunked body that never
ends, /healthz and a chat are answered, and every slow connection is closed by the server after
a bounded time (the headers deadline, the body deadline; generous bounds, no timing claims)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.bench import slow_clients
from scripts.run import services
from tests.e2e.conftest import AppFactory


def test_two_hundred_slow_clients(live_app: services.Service) -> None:
    result = slow_clients.measure(live_app.url, idle=150, drip=50, seconds=10)
    assert result.health_failures == 0 and result.health_ms
    assert max(result.health_ms) < 2000
    assert result.chat_s is not None and result.chat_s < 2
    assert result.still_open == {"idle": 0, "drip": 0, "stalled_body": 0, "endless_body": 0}
    assert len(result.held_s["idle"]) == 150 and len(result.held_s["drip"]) == 50
    assert max(result.held_s["idle"] + result.held_s["drip"]) < 15


def _every_body_closed(result: slow_clients.Result, count: int) -> None:
    assert result.health_failures == 0 and result.health_ms
    assert result.chat_s is not None
    assert result.still_open["stalled_body"] == 0 and result.still_open["endless_body"] == 0
    assert len(result.held_s["stalled_body"]) == count
    assert len(result.held_s["endless_body"]) == count
    # The defaults: a body within 10 s, then (app) up to 5 s of draining before the close.
    assert max(result.held_s["stalled_body"] + result.held_s["endless_body"]) < 25


def test_stalled_and_endless_bodies_are_closed_by_the_app(live_app: services.Service) -> None:
    result = slow_clients.measure(
        live_app.url, seconds=20, stalled_body=60, endless_body=60, idle=20
    )
    _every_body_closed(result, 60)
    assert len(result.held_s["idle"]) == 20


def test_slow_clients_are_closed_by_the_sidecar(sidecar_service: services.Service) -> None:
    result = slow_clients.measure(
        sidecar_service.url,
        idle=60,
        drip=20,
        seconds=20,
        stalled_body=60,
        endless_body=60,
        sidecar=True,
    )
    _every_body_closed(result, 60)
    assert len(result.held_s["idle"]) == 60 and len(result.held_s["drip"]) == 20
    assert result.still_open["idle"] == 0 and result.still_open["drip"] == 0
    assert max(result.held_s["idle"] + result.held_s["drip"]) < 15


def _answer(url: str, request: bytes) -> tuple[str, dict[str, object]]:
    """Send `request` and read until the server closes: (status line, JSON body)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        chunks = []
        while data := sock.recv(65536):
            chunks.append(data)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode(), json.loads(body)


@pytest.fixture(scope="module")
def quick_sidecar(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    log = tmp_path_factory.mktemp("logs") / "sidecar-quick.log"
    with services.sidecar(tiny_model_dir, log, REQUEST_BODY_TIMEOUT_S="1") as service:
        yield service


@pytest.fixture(scope="module")
def quick_app(quick_sidecar: services.Service, start_app: AppFactory) -> Iterator[services.Service]:
    with start_app(quick_sidecar.url, REQUEST_BODY_TIMEOUT="1") as app:
        yield app


def test_a_stalled_body_is_a_408_in_the_apps_envelope(quick_app: services.Service) -> None:
    status, body = _answer(quick_app.url, slow_clients.stalled_body("/chat"))
    assert status.upper() == "HTTP/1.1 408 REQUEST TIMEOUT"
    assert body == {
        "error": {
            "message": "The request did not arrive within 1 seconds.",
            "type": "request_timeout",
        }
    }
    lines = [json.loads(line) for line in quick_app.log_lines() if '"status"' in line]
    assert any(line.get("status") == 408 for line in lines)


@pytest.mark.parametrize("path", ["/predict", "/v1/chat/completions"])
def test_a_stalled_body_is_a_408_from_the_sidecar(
    quick_sidecar: services.Service, path: str
) -> None:
    status, body = _answer(quick_sidecar.url, slow_clients.stalled_body(path))
    assert status.upper() == "HTTP/1.1 408 REQUEST TIMEOUT"
    error = body["error"]
    assert isinstance(error, dict)
    assert error["message"] == "the request body did not arrive within 1 s"
    if path == "/predict":
        assert error["type"] == "request_timeout"
    else:
        assert error["code"] == "request_timeout" and error["type"] == "invalid_request_error"
    lines = [json.loads(line) for line in quick_sidecar.log_lines() if '"path"' in line]
    assert any(line.get("status") == 408 and line.get("path") == path for line in lines)
