"""The app's /metrics under gunicorn (two worker processes, added up): relay duration by how a
chat ended, failures of the hop to the sidecar by type, replies streaming now."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from flask import Flask

from scripts.run import services
from tests.chatapp import fake_sidecar as fs
from tests.chatapp.fake_sidecar import FakeSidecar, Handler
from tests.sidecar.support import metrics

CHAT = {"messages": [{"role": "user", "content": "Hi"}]}
BUSY = {"error": {"message": "queue full", "type": "overloaded"}}


@pytest.fixture(scope="module")
def module_fake() -> Iterator[FakeSidecar]:
    with FakeSidecar() as fake:
        yield fake


@pytest.fixture(scope="module")
def app(
    module_fake: FakeSidecar, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    log = tmp_path_factory.mktemp("logs") / "chatapp.log"
    with services.chatapp(
        module_fake.url, log, HEARTBEAT_INTERVAL="0.2", WEB_CONCURRENCY="2"
    ) as service:
        yield service


def chat(app: services.Service) -> httpx.Response:
    return httpx.post(app.url + "/chat", json=CHAT, timeout=10)


def test_chats_are_counted_by_ending_across_workers(
    module_fake: FakeSidecar, app: services.Service
) -> None:
    before = metrics(app.url)
    module_fake.predict = lambda h: fs.reply(h, ["Hello"])
    for _ in range(4):
        assert chat(app).status_code == 200
    module_fake.predict = lambda h: fs.refuse(h, 503, BUSY, {"Retry-After": "2"})
    assert chat(app).status_code == 503
    module_fake.predict = lambda h: fs.reply(h, ["Half"], end=False)
    assert '"upstream_disconnected"' in chat(app).text
    # Whichever worker answers the scrape, it reports both workers' chats.
    for _ in range(4):
        after = metrics(app.url)
        done = 'chatapp_relay_duration_seconds_count{outcome="done"}'
        assert after[done] - before.get(done, 0) == 4
        busy = 'chatapp_relay_duration_seconds_count{outcome="busy"}'
        assert after[busy] - before.get(busy, 0) == 1
        for kind in ("busy", "upstream_disconnected"):
            name = f'chatapp_upstream_errors_total{{type="{kind}"}}'
            assert after[name] - before.get(name, 0) == 1
        assert after["chatapp_open_streams"] == 0


def test_a_reply_streaming_now_is_an_open_stream(
    module_fake: FakeSidecar, app: services.Service
) -> None:
    release = threading.Event()

    def held(h: Handler) -> None:
        fs.start_events(h)
        fs.write_text(h, "First")
        release.wait(10)
        fs.write_done(h, 1)

    module_fake.predict = held
    with httpx.stream("POST", app.url + "/chat", json=CHAT, timeout=10) as response:
        lines = response.iter_lines()
        next(lines)
        assert metrics(app.url)["chatapp_open_streams"] == 1
        release.set()
        assert '"done"' in list(lines)[-1]
    # The server closes the stream (and counts it) just after its last line went out.
    deadline = time.monotonic() + 10
    while metrics(app.url)["chatapp_open_streams"] != 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_options_and_other_methods_are_no_chats(app: services.Service) -> None:
    # OPTIONS /chat ran the relay's hooks: a fake chat line each, and -1 open stream (issue 25).
    lines_before = len(app.log_lines())
    for method in ("OPTIONS", "OPTIONS", "OPTIONS", "GET", "PUT"):
        assert httpx.request(method, app.url + "/chat", timeout=10).status_code in (200, 405)
    after = metrics(app.url)
    assert after["chatapp_open_streams"] == 0
    new_lines = [json.loads(line) for line in app.log_lines()[lines_before:]]
    assert [line for line in new_lines if line.get("msg") == "chat"] == []
    assert chat(app).status_code == 200  # while a real chat is one line, once its stream ends

    def chat_lines() -> int:
        new_lines = [json.loads(line) for line in app.log_lines()[lines_before:]]
        return len([line for line in new_lines if line.get("msg") == "chat"])

    deadline = time.monotonic() + 10
    while chat_lines() != 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_metrics_can_be_switched_off(make_app: Callable[..., Flask]) -> None:
    assert make_app().test_client().get("/metrics").status_code == 200
    response = make_app(METRICS=False).test_client().get("/metrics")
    assert response.status_code == 404
    assert response.json is not None and response.json["error"]["type"] == "not_found"


def test_gunicorns_master_loads_neither_flask_nor_prometheus_client() -> None:
    """The config and its hooks module load nothing that must come after them: Flask and
    requests after the gevent worker patched the standard library, prometheus-client after
    on_starting chose its folder (it picks its mode when imported)."""
    probe = (
        "import json, runpy, sys; runpy.run_module('chatapp.gunicorn_conf'); "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('flask', 'requests', 'urllib3', 'prometheus_client', 'opentelemetry'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(result.stdout) == []
