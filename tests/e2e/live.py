"""Helpers for tests that talk to the real services over HTTP."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx

from scripts.run import services


def chat(url: str, messages: list[dict[str, str]], **options: Any) -> list[dict[str, Any]]:
    """POST /chat and return every NDJSON object of the reply (raises on a non-200)."""
    response = httpx.post(url + "/chat", json={"messages": messages, **options}, timeout=60)
    response.raise_for_status()
    assert response.headers["content-type"] == "application/x-ndjson; charset=utf-8"
    assert response.text.endswith("\n")
    return [json.loads(line) for line in response.text.split("\n")[:-1]]


def text_of(objs: list[dict[str, Any]]) -> str:
    return "".join(obj["delta"] for obj in objs if "delta" in obj)


def lines(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        yield json.loads(line)


def first_delta(objs: Iterator[dict[str, Any]]) -> str:
    """Read up to the first delta. Keep `objs` referenced: dropping the last reference to an
    httpx line iterator closes the response, which would look like a browser that left."""
    for obj in objs:
        if "delta" in obj:
            return str(obj["delta"])
    raise AssertionError("the reply ended before its first delta")


def metric(sidecar: services.Service, name: str, **labels: str) -> float:
    """One value from the sidecar's GET /metrics (Prometheus text)."""
    text = httpx.get(sidecar.url + "/metrics", timeout=5).text
    label = ",".join(f'{k}="{v}"' for k, v in labels.items())
    series = re.escape(f"{name}{{{label}}}" if label else name)
    match = re.search(rf"^{series} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} {labels} not in /metrics"
    return float(match.group(1))


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def request_logs(sidecar: services.Service) -> list[dict[str, Any]]:
    """The sidecar's per-request log records for /predict (JSON lines)."""
    records = []
    for line in sidecar.log_lines():
        with_braces = line.strip()
        if with_braces.startswith("{") and '"/predict"' in with_braces:
            record = json.loads(with_braces)
            if record.get("msg") == "request":
                records.append(record)
    return records


def chat_logs(app: services.Service) -> list[dict[str, Any]]:
    """The app's one log record per POST /chat (JSON lines, logger chatapp.request)."""
    records = []
    for line in app.log_lines():
        if line.startswith("{") and '"chatapp.request"' in line:
            record = json.loads(line)
            if record.get("logger") == "chatapp.request":
                records.append(record)
    return records
