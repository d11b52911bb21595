"""A client that goes away stops its generation within one token (within one chunk of the prompt
during a prefill), proven by the service's own counts (tokens generated, and tokens finished
after it noticed the disconnect), not by timing."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from scripts.run.services import Service
from tests.sidecar import reference
from tests.sidecar.support import metrics, predict, request_line


def wait_until(condition: object, timeout: float = 30.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_a_disconnect_mid_reply_stops_the_generation_within_one_token(
    paced_small_service: Service, small_model_dir: Path
) -> None:
    service = paced_small_service
    prompt = reference.long_reply_prompt(small_model_dir, 300)
    body = {"input_text": prompt, "max_new_tokens": 3000}
    before = metrics(service.url)
    with httpx.stream("POST", service.url + "/predict", json=body, timeout=60) as response:
        rid = response.headers["x-request-id"]
        received = 0
        for chunk in response.iter_raw():
            received += len(chunk)
            if received >= 20:
                break  # leaving the block closes the connection: the browser's Stop
    line = request_line(service, rid)
    assert line["outcome"] == "cancelled"
    assert line["tokens_after_disconnect"] <= 1
    assert line["generated_tokens"] < 300  # stopped long before the reply's end
    after = metrics(service.url)
    assert after['sidecar_requests_total{outcome="cancelled"}'] == (
        before['sidecar_requests_total{outcome="cancelled"}'] + 1
    )
    assert (
        after["sidecar_tokens_after_disconnect_total"]
        - before["sidecar_tokens_after_disconnect_total"]
        == line["tokens_after_disconnect"]
    )
    # The worker is free for the next request at once.
    assert after["sidecar_active_generations"] == 0
    next_reply = predict(service.url, {"input_text": "Hi", "max_new_tokens": 5})
    assert next_reply.status_code == 200


def test_a_disconnect_during_the_prefill_stops_it_before_any_token(small_service: Service) -> None:
    # The prompt (~3,300 tokens) is read in chunks of PREFILL_CHUNK (64 by default), about 50
    # worker steps; the cancellation is read between two of them, so not one token is made.
    body = {"input_text": "The quick brown fox jumps over the lazy dog. " * 300}
    with httpx.stream("POST", small_service.url + "/predict", json=body, timeout=60) as response:
        assert response.status_code == 200  # headers: the worker has started the prefill
        rid = response.headers["x-request-id"]
    line = request_line(small_service, rid)
    assert line["outcome"] == "cancelled"
    assert line["prompt_tokens"] > 3000
    assert line["generated_tokens"] == 0
    assert line["tokens_after_disconnect"] == 0
    assert "ttft_ms" not in line and "tokens_per_s" not in line
    assert metrics(small_service.url)["sidecar_active_generations"] == 0
    # The slot is free again, and the next request is served.
    next_reply = predict(small_service.url, {"input_text": "Hi", "max_new_tokens": 5})
    assert next_reply.status_code == 200


def test_a_client_that_leaves_the_queue_is_never_generated_for(small_service: Service) -> None:
    long_prompt = {"input_text": "The quick brown fox jumps over the lazy dog. " * 300}
    with httpx.stream(
        "POST", small_service.url + "/predict", json=long_prompt, timeout=60
    ) as running:
        assert running.status_code == 200  # holds the only slot (its prefill takes a while)
        with queued_request(small_service, "queued-then-gone"):
            wait_until(lambda: metrics(small_service.url)["sidecar_queue_depth"] == 1)
        # the socket is closed: the client left while waiting
        wait_until(lambda: metrics(small_service.url)["sidecar_queue_depth"] == 0)
    line = request_line(small_service, "queued-then-gone")
    assert line["outcome"] == "cancelled"
    assert "prompt_tokens" not in line and "generated_tokens" not in line


@contextlib.contextmanager
def queued_request(service: Service, request_id: str) -> Iterator[socket.socket]:
    """A /predict request on a raw socket, closed (without reading) when the block ends."""
    body = json.dumps({"input_text": "Hi"}).encode()
    host, port = service.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /predict HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"X-Request-Id: %s\r\nContent-Length: %d\r\n\r\n%s"
            % (request_id.encode(), len(body), body)
        )
        yield sock
