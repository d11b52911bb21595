"""scripts/run/smoke_test.py against a local stub of the deployed app (the real local pair is
checked in tests/containers/): it passes a good stream and names each kind of failure in one
sentence with exit status 1."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from scripts.run import smoke_test

REPO = Path(__file__).resolve().parents[2]
READY = {"status": "ok", "sidecar": {"reachable": True, "ready": True}}
GOOD = [
    {"delta": "Bonjour, "},
    {"ping": True},
    {"delta": "こんにちは 👋"},
    {"done": True, "tokens": 2},
]


class Stub(BaseHTTPRequestHandler):
    health: ClassVar[tuple[int, Any]] = (200, READY)
    chat: ClassVar[tuple[int, str, list[Any] | bytes]] = (200, "application/x-ndjson", GOOD)
    requests: ClassVar[list[Any]] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        status, body = self.health
        self._send(status, "application/json", json.dumps(body).encode())

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        type(self).requests.append(json.loads(self.rfile.read(length)))
        status, content_type, body = self.chat
        if isinstance(body, list):
            data = b"".join(json.dumps(line).encode() + b"\n" for line in body)
        else:
            data = body
        self._send(status, content_type, data)

    def _send(self, status: int, content_type: str, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def stub() -> Iterator[str]:
    Stub.health, Stub.chat, Stub.requests = (200, READY), (200, "application/x-ndjson", GOOD), []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def run(url: str, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    status = smoke_test.main([url, "--timeout", "5", *extra])
    out, err = capsys.readouterr()
    return status, out, err


def test_passes_a_streamed_reply_with_a_done_line(
    stub: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(stub + "/", capsys)
    assert (status, err) == (0, "")
    assert out.startswith(f"ok: {stub} answered ") and "こんにちは 👋" in out
    assert Stub.requests[0]["messages"][-1]["role"] == "user"


@pytest.mark.parametrize(
    ("chat", "expected"),
    [
        ((200, "application/x-ndjson", GOOD[:-1]), "ended without a done line"),
        (
            (200, "application/x-ndjson", [{"delta": "x"}, {"error": {"message": "It broke."}}]),
            "broke off with an error: It broke.",
        ),
        ((200, "application/x-ndjson", b'{"delta": "x"}\nnot json\n'), "Line 2 of the reply"),
        ((200, "text/html", b"<html>"), "not NDJSON"),
        (
            (503, "application/json", b'{"error": {"message": "Loading."}}'),
            "answered 503",
        ),
        ((200, "application/x-ndjson", [{"delta": " "}, {"done": True}]), "reply was empty"),
    ],
)
def test_names_a_broken_reply_in_one_sentence(
    stub: str,
    capsys: pytest.CaptureFixture[str],
    chat: tuple[int, str, list[Any] | bytes],
    expected: str,
) -> None:
    Stub.chat = chat
    status, out, err = run(stub, capsys)
    assert status == 1 and out == ""
    assert err.startswith("smoke test failed: ") and expected in err
    assert err.count("\n") == 1


def test_fails_when_healthz_fails(stub: str, capsys: pytest.CaptureFixture[str]) -> None:
    Stub.health = (500, {"status": "broken"})
    status, _, err = run(stub, capsys)
    assert status == 1 and "answered 500 instead of 200" in err


def test_waits_for_the_sidecar_and_gives_up_with_its_state(
    stub: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(smoke_test, "POLL_SECONDS", 0.05)
    Stub.health = (200, {"status": "ok", "sidecar": {"ready": False, "detail": "downloading"}})
    status, _, err = run(stub, capsys, "--wait", "0.3")
    assert status == 1 and "not ready after" in err and "downloading" in err


def test_unreachable_app(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run("http://127.0.0.1:9", capsys)
    assert status == 1 and err.startswith("smoke test failed: GET http://127.0.0.1:9/healthz")


def test_command_line(stub: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "scripts.run.smoke_test", stub],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "scripts.run.smoke_test", "example.com"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "not an http(s) URL" in bad.stderr
