"""The app as production runs it (gunicorn, gthread) in its own process, against a fake sidecar:
replies are relayed as they arrive, and a browser that leaves releases the sidecar at once."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from scripts.run import services
from tests.chatapp import fake_sidecar as fs
from tests.chatapp.fake_sidecar import FakeSidecar, Handler

CHAT = {"messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeSidecar]:
    with FakeSidecar() as fake:
        yield fake


@pytest.fixture(scope="module")
def app(fake: FakeSidecar, tmp_path_factory: pytest.TempPathFactory) -> Iterator[services.Service]:
    log = tmp_path_factory.mktemp("logs") / "chatapp.log"
    with services.chatapp(fake.url, log, HEARTBEAT_INTERVAL="0.2") as service:
        yield service


@pytest.fixture(autouse=True)
def reset(fake: FakeSidecar) -> None:
    fake.requests.clear()
    fake.client_gone.clear()


def test_pieces_are_relayed_as_they_arrive(fake: FakeSidecar, app: services.Service) -> None:
    release = threading.Event()

    def held(h: Handler) -> None:
        fs.start_events(h)
        fs.write_text(h, "Première ")
        release.wait(10)  # the second piece waits until the test saw the first one
        fs.write_text(h, "partie")
        fs.write_done(h, 2)

    fake.predict = held
    with httpx.stream("POST", app.url + "/chat", json=CHAT, timeout=10) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/x-ndjson; charset=utf-8"
        lines = response.iter_lines()
        assert json.loads(next(lines)) == {"delta": "Première "}
        release.set()
        rest = [json.loads(line) for line in lines]
    assert {"delta": "partie"} in rest
    assert rest[-1]["done"] is True


def test_leaving_during_a_silent_prefill_releases_the_sidecar(
    fake: FakeSidecar, app: services.Service
) -> None:
    def silent_prefill(handler: fs.Handler) -> None:
        fs.start_events(handler)
        fs.wait_until_client_closes(handler, 15)

    fake.predict = silent_prefill
    with httpx.stream("POST", app.url + "/chat", json=CHAT, timeout=10) as response:
        assert response.status_code == 200
        assert json.loads(next(response.iter_lines())) == {"ping": True}
    left = time.monotonic()
    # Heartbeats every 0.2 s: the failed write shows the client left, the relay hangs up.
    assert fake.client_gone.wait(5), app.log()
    assert time.monotonic() - left < 3


def test_sidecar_dying_mid_reply_ends_with_an_error_line(
    fake: FakeSidecar, app: services.Service
) -> None:
    fake.predict = lambda h: fs.reply(h, ["Half ", "a reply"], end=False)
    response = httpx.post(app.url + "/chat", json=CHAT, timeout=10)
    objs = [json.loads(line) for line in response.text.splitlines()]
    assert "".join(o.get("delta", "") for o in objs) == "Half a reply"
    assert objs[-1]["error"]["type"] == "upstream_disconnected"


def test_errors_are_json(app: services.Service) -> None:
    response = httpx.post(app.url + "/chat", content=b"hi", timeout=10)
    assert response.status_code == 415
    assert response.json()["error"]["type"] == "unsupported_media_type"
    response = httpx.get(app.url + "/missing", timeout=10)
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found"


def test_development_server(fake: FakeSidecar, tmp_path: Path) -> None:
    fake.predict = lambda h: fs.reply(h, ["dev"])
    with services.chatapp(fake.url, tmp_path / "dev.log", gunicorn=False) as dev:
        assert httpx.get(dev.url + "/", timeout=10).status_code == 200
        response = httpx.post(dev.url + "/chat", json=CHAT, timeout=10)
        assert json.loads(response.text.splitlines()[0]) == {"delta": "dev"}


def test_the_start_says_whether_a_key_goes_to_the_model_service(
    fake: FakeSidecar, app: services.Service, tmp_path: Path
) -> None:
    # One line from gunicorn's master at start (issue 25), never the key itself.
    def access_lines(service: services.Service) -> list[dict[str, object]]:
        lines = [json.loads(line) for line in service.log_lines() if line.startswith("{")]
        return [line for line in lines if line.get("msg") == "access"]

    (line,) = access_lines(app)
    loopback = "localhost,127.0.0.1,[::1]"  # ALLOWED_HOSTS unset (issue 58)
    assert (line["upstream_key"], line["allowed_hosts"], line["metrics"]) == (
        "unset",
        loopback,
        True,
    )
    env = {"UPSTREAM_API_KEY": "s3cret-key", "ALLOWED_HOSTS": "chat.example.com,127.0.0.1"}
    with services.chatapp(fake.url, tmp_path / "keyed.log", env=env) as keyed:
        (line,) = access_lines(keyed)
        assert (line["upstream_key"], line["allowed_hosts"]) == (
            "set",
            "chat.example.com,127.0.0.1",
        )
        assert "s3cret-key" not in keyed.log()
