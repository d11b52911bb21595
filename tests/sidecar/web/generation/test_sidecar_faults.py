"""Faults the real engine cannot produce on demand (tests/support/engines.py injects them):
an error after the first byte, a library error when a reply starts, and the model worker dying
mid-reply. None of them puts the text of the request (or of an exception, which may quote it)
in a log line unless LOG_PROMPTS=1."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import psutil
import pytest

from scripts.run import services
from scripts.run.services import Service
from tests.sidecar.support import assert_error, metrics, predict, request_line
from tests.support.engines import EXIT, RAISE, SECRET, START, faulty


def stream_until_broken(url: str, body: dict[str, object]) -> tuple[httpx.Response, bytes]:
    received = b""
    broken = pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read")
    with httpx.stream("POST", url + "/predict", json=body, timeout=60) as response, broken:
        for chunk in response.iter_raw():
            received += chunk
    return response, received


def test_an_error_after_the_first_byte_aborts_the_stream(faulty_service: Service) -> None:
    response, received = stream_until_broken(
        faulty_service.url, {"input_text": f"{RAISE} Tell me a story."}
    )
    assert response.status_code == 200
    assert received  # the first byte went out before the error
    assert SECRET.encode() not in received
    rid = response.headers["x-request-id"]
    line = request_line(faulty_service, rid)
    assert (line["status"], line["outcome"]) == (200, "error")
    assert line["fault"] == "RuntimeError"
    worker_lines = worker_log(faulty_service, "generation failed")
    assert [w["request_id"] for w in worker_lines] == [rid]
    # The exception's type, not its message (it may quote the prompt): LOG_PROMPTS is off
    assert worker_lines[0]["error_type"] == "RuntimeError" and "error" not in worker_lines[0]
    assert SECRET not in faulty_service.log() and "Tell me a story" not in faulty_service.log()
    # The service keeps serving.
    assert predict(faulty_service.url, {"input_text": "Hi"}).status_code == 200


def worker_log(service: Service, message: str) -> list[dict[str, object]]:
    return [
        json.loads(text)
        for text in service.log_lines()
        if text.startswith("{") and f'"{message}"' in text
    ]


def test_a_library_error_at_the_start_logs_its_type_not_the_prompt(
    faulty_service: Service,
) -> None:
    """onnxruntime-genai's tokenizer refuses text with a TypeError that quotes all of it (the
    whole rendered prompt, issue 38): a 500 whose log lines hold the type alone."""
    question = f"{START} my door code is 4471, what is yours?"
    response = predict(faulty_service.url, {"input_text": question})
    assert_error(response, 500, "internal_error")
    rid = response.headers["x-request-id"]
    assert request_line(faulty_service, rid)["status"] == 500
    (line,) = [w for w in worker_log(faulty_service, "starting a generation failed")]
    assert (line["request_id"], line["error_type"]) == (rid, "TypeError")
    assert "door code" not in faulty_service.log() and "Invoked with" not in faulty_service.log()


def test_log_prompts_puts_the_exception_message_in_the_line(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """LOG_PROMPTS=1 (debugging): the worker's line has the message too."""
    with services.sidecar(
        tiny_model_dir, tmp_path / "sidecar.log", env=faulty(), LOG_PROMPTS="1"
    ) as service:
        response, _ = stream_until_broken(service.url, {"input_text": f"{RAISE} Go on."})
        request_line(service, response.headers["x-request-id"])
        (line,) = worker_log(service, "generation failed")
        assert line["error_type"] == "RuntimeError"
        assert line["error"] == f"injected failure: {SECRET}"


def test_a_worker_that_dies_mid_reply_is_replaced(faulty_service: Service) -> None:
    restarts = metrics(faulty_service.url)["sidecar_worker_restarts_total"]
    response, received = stream_until_broken(
        faulty_service.url, {"input_text": f"{EXIT} Tell me a story."}
    )
    assert received
    line = request_line(faulty_service, response.headers["x-request-id"])
    assert line["outcome"] == "error"
    assert "exited unexpectedly (exit code 3)" in faulty_service.log()
    deadline = time.monotonic() + 60
    while httpx.get(faulty_service.url + "/readyz", timeout=10).status_code != 200:
        assert time.monotonic() < deadline, faulty_service.log()
        time.sleep(0.1)
    assert metrics(faulty_service.url)["sidecar_worker_restarts_total"] == restarts + 1
    assert predict(faulty_service.url, {"input_text": "Hi"}).status_code == 200


def test_the_worker_does_not_outlive_a_killed_web_process(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    with services.sidecar(tiny_model_dir, tmp_path / "sidecar.log") as service:
        worker = model_worker(service)
        service.process.kill()  # SIGKILL: no shutdown code runs
        service.process.wait()
        worker.wait(timeout=30)  # it noticed the closed pipe and exited by itself


def test_sigterm_to_the_process_group_shuts_down_cleanly(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # What services.stop does (`docker stop` signals the web process alone): the web process
    # shuts down gracefully and stops the worker, which the signal does not reach directly.
    with services.sidecar(tiny_model_dir, tmp_path / "sidecar.log") as service:
        worker = model_worker(service)
        assert os.getpgid(worker.pid) != os.getpgid(service.process.pid)
        os.killpg(service.process.pid, signal.SIGTERM)
        assert service.process.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises it
        worker.wait(timeout=30)
    assert "Traceback" not in service.log()


def model_worker(service: Service) -> psutil.Process:
    """The model worker among the children (multiprocessing also starts a resource tracker)."""
    (worker,) = [
        child
        for child in psutil.Process(service.process.pid).children()
        if any("spawn_main" in part for part in child.cmdline())
    ]
    return worker
