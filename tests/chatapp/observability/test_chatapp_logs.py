"""Logs: JSON lines, and exactly one `chatapp.request` line per chat, joined to the sidecar's by
X-Request-Id, with timings and counts but never the conversation's text."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from flask import Flask
from flask.testing import FlaskClient

from chatapp.observability.logs import JsonFormatter, configure_logging
from scripts.run import services
from tests.chatapp import fake_sidecar as fs
from tests.chatapp.fake_sidecar import FakeSidecar, Handler

SECRET = "Zorglub-7431"  # in every message and reply: must never reach a log line
CONVERSATION = {
    "messages": [
        {"role": "system", "content": f"Be brief, {SECRET}."},
        {"role": "user", "content": f"Bonjour {SECRET} 😀"},
        {"role": "assistant", "content": f"Oui {SECRET}."},
        {"role": "user", "content": f"Encore, {SECRET} ?"},
    ]
}
TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00")
GENERATED_ID = re.compile(r"[0-9a-f]{16}")


class Logs:
    """Every record the app logged during a test, as the JSON lines they become."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self._caplog = caplog

    def json_lines(self) -> list[dict[str, Any]]:
        formatter = JsonFormatter()
        lines = [formatter.format(record) for record in self._caplog.records]
        for line in lines:
            assert "\n" not in line
            assert SECRET not in line
        return [json.loads(line) for line in lines]

    def chats(self) -> list[dict[str, Any]]:
        return [line for line in self.json_lines() if line["logger"] == "chatapp.request"]

    def one_chat(self) -> dict[str, Any]:
        chats = self.chats()
        assert len(chats) == 1, chats
        assert chats[0]["level"] == "info" and chats[0]["msg"] == "chat"
        return chats[0]


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Logs:
    caplog.set_level(logging.INFO, logger="chatapp")
    return Logs(caplog)


@contextlib.contextmanager
def root_logger_restored() -> Iterator[None]:
    """Undo configure_logging within the test (pytest's capture handlers live on the root)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def with_counts(h: Handler) -> None:
    """A reply of three pieces and five tokens, with the sidecar's prompt counts and text the
    log must not hold."""
    pieces = ["Salut ", SECRET, " !"]
    fs.reply(
        h, pieces, tokens=5, delay=0.01, prompt_tokens=42, cached_tokens=30, dropped_messages=1
    )


# The formatter and the configuration


def test_a_record_is_one_json_object_on_one_line() -> None:
    record = logging.LogRecord(
        "chatapp.relay", logging.WARNING, __file__, 1, "silent for %s s\nhanging up", (5,), None
    )
    record.fields = {"request_id": "abc", "pieces": 3}
    line = JsonFormatter().format(record)
    assert "\n" not in line
    data = json.loads(line)
    assert list(data) == ["ts", "level", "logger", "msg", "request_id", "pieces"]
    assert TS.fullmatch(data["ts"])
    assert data["level"] == "warning" and data["logger"] == "chatapp.relay"
    assert data["msg"] == "silent for 5 s\nhanging up"
    assert data["request_id"] == "abc" and data["pieces"] == 3


def test_an_exception_stays_on_the_line_without_its_message() -> None:
    """Its type, cause and frames; not its message, which may quote a message or a reply."""
    first, second = f"cannot read {SECRET}", f"boom {SECRET}"  # the raise lines are logged
    try:
        try:
            raise ValueError(first)
        except ValueError as exc:
            raise RuntimeError(second) from exc
    except RuntimeError:
        record = logging.LogRecord(
            "chatapp", logging.ERROR, __file__, 1, "unhandled error", (), sys.exc_info()
        )
    data = json.loads(JsonFormatter().format(record))
    assert data["level"] == "error"
    assert "builtins.ValueError" in data["exc"] and "builtins.RuntimeError" in data["exc"]
    assert "direct cause" in data["exc"] and "test_chatapp_logs.py" in data["exc"]
    assert SECRET not in data["exc"]


def test_configure_logging_writes_json_from_the_level_up(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with root_logger_restored():
        configure_logging("warning")
        logging.getLogger("chatapp.test").info("not shown")
        logging.getLogger("chatapp.test").warning("shown", extra={"fields": {"n": 1}})
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    data = json.loads(lines[0])
    assert data["msg"] == "shown" and data["n"] == 1 and data["level"] == "warning"


# One line per chat, under the test client


def test_one_line_for_a_complete_reply(client: FlaskClient, fake: FakeSidecar, logs: Logs) -> None:
    fake.predict = with_counts
    with client.post("/chat", json=CONVERSATION, headers={"X-Request-Id": "tab-7:msg.3"}) as r:
        done = list(fs.ndjson(r.get_data()))[-1]
        assert r.headers["X-Request-Id"] == "tab-7:msg.3"
    assert fake.headers[0]["X-Request-Id"] == "tab-7:msg.3"
    line = logs.one_chat()
    assert list(line)[4:] == [
        "request_id",
        "status",
        "outcome",
        "messages",
        "prompt_tokens",
        "cached_tokens",
        "finish_reason",
        "dropped_messages",
        "pieces",
        "generated_tokens",
        "ttft_ms",
        "tokens_per_s",
        "duration_ms",
    ]
    assert line["request_id"] == "tab-7:msg.3"
    assert line["status"] == 200 and line["outcome"] == "done"
    assert line["messages"] == 4
    assert line["prompt_tokens"] == 42 and line["dropped_messages"] == 1
    assert line["cached_tokens"] == 30 and line["finish_reason"] == "stop"
    assert line["pieces"] == 3
    assert line["generated_tokens"] == done["tokens"] == 5  # the model's count, not the pieces
    assert line["ttft_ms"] == done["ttft_ms"] and line["tokens_per_s"] == done["tokens_per_s"]
    assert line["duration_ms"] >= line["ttft_ms"]


@pytest.mark.parametrize(
    "incoming", [None, "", "has space", "x" * 65, "semi;colon", "ünïcode", "a\tb"]
)
def test_an_unusable_request_id_is_replaced(
    client: FlaskClient, fake: FakeSidecar, logs: Logs, incoming: str | None
) -> None:
    headers = {} if incoming is None else {"X-Request-Id": incoming}
    with client.post("/chat", json=CONVERSATION, headers=headers) as response:
        response.get_data()
    rid = response.headers["X-Request-Id"]
    assert GENERATED_ID.fullmatch(rid)
    assert fake.headers[0]["X-Request-Id"] == rid
    assert logs.one_chat()["request_id"] == rid


def test_each_chat_gets_its_own_id(client: FlaskClient, logs: Logs) -> None:
    for _ in range(3):
        with client.post("/chat", json=CONVERSATION) as response:
            response.get_data()
    ids = [line["request_id"] for line in logs.chats()]
    assert len(ids) == 3 and len(set(ids)) == 3


def test_one_line_when_the_sidecar_is_down(
    make_app: Callable[..., Flask], down_url: str, logs: Logs
) -> None:
    client = make_app(SIDECAR_URL=down_url).test_client()
    response = client.post("/chat", json=CONVERSATION, headers={"X-Request-Id": "r1"})
    assert response.status_code == 503
    assert response.headers["X-Request-Id"] == "r1"
    line = logs.one_chat()
    assert line["request_id"] == "r1"
    assert line["status"] == 503 and line["outcome"] == "upstream_unavailable"
    assert line["messages"] == 4 and line["pieces"] == 0 and line["duration_ms"] >= 0
    assert "prompt_tokens" not in line and "ttft_ms" not in line
    # The sidecar client's warning is a JSON line too.
    assert any(entry["level"] == "warning" for entry in logs.json_lines())


@pytest.mark.parametrize(
    ("send", "status", "outcome"),
    [
        (lambda c: c.post("/chat", data=SECRET, content_type="text/plain"), 415, None),
        (lambda c: c.post("/chat", data="{" + SECRET, content_type="application/json"), 400, None),
        (lambda c: c.post("/chat", json={"messages": [{"role": "user"}]}), 400, None),
        (lambda c: c.post("/chat", json={"messages": [{"content": SECRET * 20_000}]}), 413, None),
        (lambda c: c.post("/chat", json=CONVERSATION), 503, "busy"),
    ],
)
def test_one_line_for_a_refused_chat(
    client: FlaskClient,
    fake: FakeSidecar,
    logs: Logs,
    send: Callable[[FlaskClient], Any],
    status: int,
    outcome: str | None,
) -> None:
    fake.predict = lambda h: fs.refuse(
        h, 503, {"error": {"message": "full", "type": "overloaded"}}, {"Retry-After": "3"}
    )
    response = send(client)
    assert response.status_code == status
    line = logs.one_chat()
    assert line["status"] == status
    assert line["outcome"] == response.get_json()["error"]["type"]
    assert outcome is None or line["outcome"] == outcome
    assert line["request_id"] == response.headers["X-Request-Id"]


def test_one_line_for_a_reply_cut_off(client: FlaskClient, fake: FakeSidecar, logs: Logs) -> None:
    fake.predict = lambda h: fs.reply(h, ["Half ", SECRET], end=False)
    with client.post("/chat", json=CONVERSATION) as response:
        assert list(fs.ndjson(response.get_data()))[-1]["error"]["type"] == "upstream_disconnected"
    line = logs.one_chat()
    assert line["status"] == 200 and line["outcome"] == "upstream_disconnected"
    assert line["pieces"] == 2 and line["ttft_ms"] >= 0


def test_one_line_for_a_sidecar_that_stalls(
    make_app: Callable[..., Flask], fake: FakeSidecar, logs: Logs
) -> None:
    def stall(h: Handler) -> None:
        fs.start_events(h)
        fs.write_text(h, "The start")
        fs.wait_until_client_closes(h, 10)

    fake.predict = stall
    client = make_app(SIDECAR_READ_TIMEOUT=0.6, HEARTBEAT_INTERVAL=0.2).test_client()
    with client.post("/chat", json=CONVERSATION) as response:
        response.get_data()
    line = logs.one_chat()
    assert line["outcome"] == "upstream_timeout" and line["pieces"] == 1


def endless(h: Handler) -> None:
    fs.start_events(h)
    while True:
        fs.write_text(h, SECRET)
        time.sleep(0.02)


def test_one_line_when_the_browser_leaves(
    client: FlaskClient, fake: FakeSidecar, logs: Logs
) -> None:
    fake.predict = endless
    response = client.post("/chat", json=CONVERSATION, buffered=False)
    chunks = iter(response.response)
    next(chunks)
    next(chunks)
    assert logs.chats() == []  # not over yet
    response.close()
    assert fake.client_gone.wait(2)
    line = logs.one_chat()
    assert line["status"] == 200 and line["outcome"] == "client_gone"
    assert line["pieces"] >= 2 and line["ttft_ms"] >= 0
    response.close()  # a second close logs nothing more
    logs.one_chat()


def test_one_line_when_the_response_is_closed_at_once(
    client: FlaskClient, fake: FakeSidecar, logs: Logs
) -> None:
    fake.predict = endless
    client.post("/chat", json=CONVERSATION, buffered=False).close()
    line = logs.one_chat()
    # The test client reads the first line itself (under gunicorn: test_under_gunicorn...).
    assert line["outcome"] == "client_gone" and line["pieces"] <= 1


def test_other_routes_log_no_chat_line(client: FlaskClient, logs: Logs) -> None:
    assert client.get("/").status_code == 200
    assert client.get("/chat").status_code == 405
    assert "X-Request-Id" not in client.get("/").headers
    assert logs.chats() == []


# The app as production runs it: gunicorn's lines and the app's, all JSON, one per chat


@pytest.fixture(scope="module")
def gunicorn_fake() -> Iterator[FakeSidecar]:
    with FakeSidecar() as fake:
        yield fake


@pytest.fixture(scope="module")
def gunicorn_app(
    gunicorn_fake: FakeSidecar, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    log = tmp_path_factory.mktemp("logs") / "chatapp.log"
    with services.chatapp(gunicorn_fake.url, log, HEARTBEAT_INTERVAL="0.2") as service:
        yield service


def chat_lines(app: services.Service) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in app.log_lines()]
    return [record for record in records if record["logger"] == "chatapp.request"]


def wait_for_chat_line(app: services.Service, request_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        found = [line for line in chat_lines(app) if line["request_id"] == request_id]
        if found:
            assert len(found) == 1, found
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no chat line for {request_id}:\n{app.log()}")


def test_under_gunicorn_every_line_is_json_and_each_chat_has_one(
    gunicorn_fake: FakeSidecar, gunicorn_app: services.Service, tmp_path: Path
) -> None:
    url = gunicorn_app.url + "/chat"
    gunicorn_fake.predict = with_counts
    done = httpx.post(url, json=CONVERSATION, headers={"X-Request-Id": "g-done"}, timeout=10)
    assert done.headers["X-Request-Id"] == "g-done"
    assert gunicorn_fake.headers[-1]["X-Request-Id"] == "g-done"
    refused = httpx.post(url, content=SECRET, headers={"X-Request-Id": "g-415"}, timeout=10)
    assert refused.status_code == 415 and refused.headers["X-Request-Id"] == "g-415"

    def silent_until_closed(h: Handler) -> None:
        fs.start_events(h)
        fs.wait_until_client_closes(h, 15)

    gunicorn_fake.predict = silent_until_closed
    headers = {"X-Request-Id": "g-gone"}
    with httpx.stream("POST", url, json=CONVERSATION, headers=headers, timeout=10) as response:
        assert json.loads(next(response.iter_lines())) == {"ping": True}

    gone = wait_for_chat_line(gunicorn_app, "g-gone")
    assert gone["status"] == 200 and gone["outcome"] == "client_gone" and gone["pieces"] == 0
    line = wait_for_chat_line(gunicorn_app, "g-done")
    assert line["outcome"] == "done" and line["pieces"] == 3 and line["prompt_tokens"] == 42
    assert line["generated_tokens"] == 5
    line = wait_for_chat_line(gunicorn_app, "g-415")
    assert line["status"] == 415 and line["outcome"] == "unsupported_media_type"

    lines = gunicorn_app.log_lines()
    records = [json.loads(line) for line in lines]  # gunicorn's own lines too: no access log
    assert all(TS.fullmatch(record["ts"]) for record in records)
    assert any(record["logger"] == "gunicorn.error" for record in records)
    assert len(chat_lines(gunicorn_app)) == 3
    assert SECRET not in gunicorn_app.log()
