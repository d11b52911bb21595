"""Helpers for the sidecar tests: calling /predict, reading the service's log and metrics, and
running the model worker's own loop in a thread."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from multiprocessing import Pipe
from typing import TYPE_CHECKING, Any

import httpx

# The log lines' home is scripts/run/services.py (the benchmarks read them too); re-exported here.
from scripts.run.services import request_line as request_line
from scripts.run.services import request_lines as request_lines

if TYPE_CHECKING:
    from sidecar.model.engine import Engine

JSON_HEADERS = {"content-type": "application/json"}


def predict(url: str, body: dict[str, Any], timeout: float = 60.0) -> httpx.Response:
    return httpx.post(url + "/predict", json=body, timeout=timeout)


def one_after_another(
    url: str, bodies: dict[str, dict[str, Any]], delay: float
) -> dict[str, httpx.Response]:
    """POST /predict two bodies (keyed by their X-Request-Id), the second `delay` seconds after
    the first, while the first's reply is still running; both responses."""
    results: dict[str, httpx.Response] = {}

    def send(request_id: str) -> None:
        headers = {"X-Request-Id": request_id}
        results[request_id] = httpx.post(
            url + "/predict", json=bodies[request_id], headers=headers, timeout=120
        )

    first, second = bodies
    thread = threading.Thread(target=send, args=(first,))
    thread.start()
    time.sleep(delay)
    send(second)
    thread.join()
    return results


def passages_read(url: str, timeout: float = 60.0) -> None:
    """Until the idle worker has read every run the passage store was sent or wanted (a wait,
    not a timing: model/kv/passages.py)."""
    waited = time.monotonic() + timeout
    while time.monotonic() < waited:
        counts = metrics(url)
        if not counts["sidecar_passage_store_warming"] + counts["sidecar_passage_store_wanted"]:
            return
        time.sleep(0.1)


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


_WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa")


def words(count: int, seed: int) -> str:
    """`count` words starting at the `seed`th of a small list: long prompts that differ."""
    return " ".join(_WORDS[(seed + i) % len(_WORDS)] for i in range(count))


def worker_idle_until(engine: Engine, done: Callable[[], bool]) -> None:
    """Run the worker's own loop (worker.Scheduler, in a thread over real pipes) with no
    request until `done()` (at most 120 s: a wait for its idle work, not a timing); it must
    answer a ping meanwhile."""
    from sidecar import ipc  # here: the web tests that import this module never load the model
    from sidecar.model.worker import Scheduler

    inbox, to_worker = Pipe(duplex=False)
    from_worker, outbox = Pipe(duplex=False)
    worker = threading.Thread(target=Scheduler(engine, inbox, outbox).run, daemon=True)
    worker.start()
    try:
        to_worker.send(ipc.Ping())
        # Its gauges (ipc.CacheStats) may come first: sent when a piece of idle work ends
        answer: object = None
        while not isinstance(answer, ipc.Pong):
            assert from_worker.poll(60)
            answer = from_worker.recv()
        waited = time.monotonic() + 120
        while not done() and time.monotonic() < waited:
            time.sleep(0.02)
    finally:
        to_worker.send(ipc.Stop())
        worker.join(60)
