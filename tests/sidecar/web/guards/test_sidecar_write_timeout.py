"""A client that stops reading (web/guards/connections.py, WRITE_TIMEOUT_S): its connection is
closed once the sidecar could not write to it for the timeout, its reply is cancelled in the model
worker, and the request's log line and /metrics say so. A client that reads slowly is not cut.
Counts, not timings: the log line's outcome and reason, the tokens generated, the counter."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.run import services
from scripts.run.services import Service, request_line
from tests.sidecar.support import metrics
from tests.support.engines import paced

pytestmark = pytest.mark.slow  # a paced reply of hundreds of tokens, three times

MAX_TOKENS = 2000
SEND_BUFFER_KB = 64
# More than the socket's buffers hold (SEND_BUFFER_KB, doubled by Linux, the client's smallest
# receive buffer and the transport's 64 KiB), so that a client that reads nothing stops the
# sidecar's writes.
LEAST_BYTES = 2 * (2 * SEND_BUFFER_KB * 1024 + 64 * 1024)


def request(prompt: str) -> dict[str, Any]:
    """A greedy reply with 20 alternatives a token."""
    return {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "logprobs": True,
        "top_logprobs": 20,
    }


@pytest.fixture(scope="module")
def impatient(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    log = tmp_path_factory.mktemp("logs") / "sidecar-write-timeout.log"
    # 20 ms a token: the reply is still being written when its client has stopped reading
    # for WRITE_TIMEOUT_S (the tiny model alone writes it whole within that second).
    with services.sidecar(
        tiny_model_dir,
        log,
        WRITE_TIMEOUT_S="1",
        SEND_BUFFER_KB=str(SEND_BUFFER_KB),
        env=paced(0.02),
    ) as service:
        yield service


@pytest.fixture(scope="module")
def bulky(impatient: Service) -> tuple[str, int]:
    """A prompt whose streamed reply takes more than LEAST_BYTES (read whole here, by a client
    that reads), and its tokens."""
    prompt = "hello world"
    headers = {"X-Request-Id": "read-whole"}
    with httpx.stream(
        "POST",
        impatient.url + "/v1/chat/completions",
        json=request(prompt),
        headers=headers,
        timeout=120,
    ) as response:
        size = sum(len(chunk) for chunk in response.iter_bytes())
    assert size > LEAST_BYTES
    return prompt, request_line(impatient, "read-whole")["generated_tokens"]


def bulky_stream(service: Service, prompt: str, request_id: str) -> socket.socket:
    """That reply, streamed, asked on a socket with the smallest receive buffer; nothing is
    read from it here."""
    body = json.dumps(request(prompt)).encode()
    host, port = service.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.connect((host, int(port)))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\nX-Request-Id: %s\r\nContent-Length: %d\r\n\r\n%s"
        % (request_id.encode(), len(body), body)
    )
    return sock


def test_a_client_that_stops_reading_is_closed_and_its_reply_cancelled(
    impatient: Service, bulky: tuple[str, int]
) -> None:
    prompt, whole = bulky
    before = metrics(impatient.url).get("sidecar_write_timeouts_total", 0)
    with bulky_stream(impatient, prompt, "stopped-reading") as sock:
        line = request_line(impatient, "stopped-reading", timeout=120)
        assert line["outcome"] == "cancelled"
        assert line["closed"] == "write_timeout"
        assert 0 < line["generated_tokens"] < whole  # stopped in the worker
        # the sidecar dropped what it had buffered: the client reads a cut stream, then EOF
        sock.settimeout(10)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        assert received.startswith(b"HTTP/1.1 200") and b"data: [DONE]" not in received
    assert metrics(impatient.url)["sidecar_write_timeouts_total"] == before + 1


def test_a_client_that_reads_slowly_is_not_cut(impatient: Service, bulky: tuple[str, int]) -> None:
    """It takes a couple of KB (its receive buffer) every 10 ms: slower than the reply is
    written, so the sidecar's buffer stays full, but each byte taken restarts the count."""
    before = metrics(impatient.url).get("sidecar_write_timeouts_total", 0)
    with bulky_stream(impatient, bulky[0], "reads-slowly") as sock:
        received = b""
        while chunk := sock.recv(256 * 1024):
            received += chunk
            time.sleep(0.01)
            if received.endswith(b"data: [DONE]\n\n") or received.endswith(b"0\r\n\r\n"):
                break
    line = request_line(impatient, "reads-slowly", timeout=120)
    assert line.get("closed") is None and line["generated_tokens"] == bulky[1]
    assert b"data: [DONE]" in received
    assert metrics(impatient.url)["sidecar_write_timeouts_total"] == before
