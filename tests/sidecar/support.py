"""Helpers for the sidecar tests: calling /predict, and reading the service's log and metrics."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx

from scripts.services import Service

JSON_HEADERS = {"content-type": "application/json"}


def predict(url: str, body: dict[str, Any], timeout: float = 60.0) -> httpx.Response:
    return httpx.post(url + "/predict", json=body, timeout=timeout)


def request_lines(service: Service) -> list[dict[str, Any]]:
    """The per-request log lines the service has written so far."""
    lines = []
    for line in service.log_lines():
        if line.startswith("{"):
            data = json.loads(line)
            if data.get("logger") == "sidecar.request":
                lines.append(data)
    return lines


def request_line(service: Service, request_id: str, timeout: float = 30.0) -> dict[str, Any]:
    """Wait for the log line of one request (it is written when the request is over)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in request_lines(service):
            if line["request_id"] == request_id:
                return line
        time.sleep(0.05)
    raise AssertionError(f"no log line for request {request_id}:\n{service.log()[-3000:]}")


def metrics(url: str) -> dict[str, float]:
    """GET /metrics as {'name{labels}': value}."""
    text = httpx.get(url + "/metrics", timeout=10).text
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def assert_error(response: httpx.Response, status: int, kind: str | None = None) -> str:
    """The response is `status` with the one error envelope; returns the message."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}, body
    assert {"message", "type"} <= set(body["error"]), body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if kind is not None:
        assert body["error"]["type"] == kind, body
    assert not re.search(r"Traceback|File \"|Error\(", response.text)
    return str(body["error"]["message"])
