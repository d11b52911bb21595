"""A chat waiting in the sidecar's queue gets heartbeat lines (issue 25): the sidecar answers a
queued request only when it gets a slot, so the app starts its stream anyway and writes pings,
and a browser that leaves while queued takes its request out of the sidecar's queue."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from scripts.run import services
from tests.e2e.conftest import AppFactory
from tests.support.engines import paced


@pytest.fixture(scope="module")
def queueing_sidecar(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    """One generation at a time, others wait in the queue; 0.05 s a token."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-queue.log"
    with services.sidecar(
        tiny_model_dir, log, MAX_CONCURRENCY="1", QUEUE_SIZE="4", env=paced(0.05)
    ) as service:
        yield service


@pytest.fixture(scope="module")
def queueing_app(
    queueing_sidecar: services.Service, start_app: AppFactory
) -> Iterator[services.Service]:
    with start_app(queueing_sidecar.url, QUEUED_STREAM_AFTER="0.5") as app:  # pings: 0.2 s
        yield app


LONG = {"messages": [{"role": "user", "content": "Tell me a story."}]}


def test_a_queued_chat_gets_pings_while_it_waits(queueing_app: services.Service) -> None:
    first_running = threading.Event()
    first_done = threading.Event()

    def first() -> None:
        body = {**LONG, "max_new_tokens": 200, "min_new_tokens": 200}  # 10 s of tokens
        with httpx.stream("POST", queueing_app.url + "/chat", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if '"delta"' in line:
                    first_running.set()
        first_done.set()

    runner = threading.Thread(target=first)
    runner.start()
    assert first_running.wait(30)
    body = {**LONG, "max_new_tokens": 4}
    with httpx.stream("POST", queueing_app.url + "/chat", json=body, timeout=60) as response:
        assert response.status_code == 200
        objs = (json.loads(line) for line in response.iter_lines() if line)
        assert next(objs) == {"ping": True}
        assert not first_done.is_set()  # the ping came while the chat waited for its slot
        rest = list(objs)
    assert rest[-1]["done"] is True
    runner.join(30)


def test_a_browser_that_leaves_while_queued_leaves_the_queue(
    queueing_app: services.Service, queueing_sidecar: services.Service
) -> None:
    first_running = threading.Event()

    def first() -> None:
        body = {**LONG, "max_new_tokens": 200, "min_new_tokens": 200}
        with httpx.stream("POST", queueing_app.url + "/chat", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if '"delta"' in line:
                    first_running.set()

    runner = threading.Thread(target=first)
    runner.start()
    assert first_running.wait(30)
    headers = {"X-Request-Id": "queued-and-gone"}
    with httpx.stream(
        "POST", queueing_app.url + "/chat", json=LONG, headers=headers, timeout=60
    ) as response:
        assert json.loads(next(response.iter_lines())) == {"ping": True}
    # The app notices at its next ping and drops the request: the sidecar logs it cancelled
    # while the first chat still runs.
    deadline = time.monotonic() + 30
    while True:
        lines = [json.loads(x) for x in queueing_sidecar.log_lines() if "queued-and-gone" in x]
        if any(line.get("msg") == "request" for line in lines):
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    (line,) = [line for line in lines if line.get("msg") == "request"]
    assert line["outcome"] == "cancelled" and line.get("generated_tokens", 0) == 0
    runner.join(30)
