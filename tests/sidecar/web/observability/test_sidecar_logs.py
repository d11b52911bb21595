"""One structured log line per request, no prompt text unless LOG_PROMPTS=1; /metrics."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from scripts.run.services import Service
from sidecar.settings import Settings
from sidecar.web.app import create_app
from tests.sidecar.support import assert_error, metrics, predict, request_line, request_lines

MARKER = "zebra-marker-7781"


def test_one_line_per_request_without_prompt_text(sidecar_service: Service) -> None:
    response = predict(sidecar_service.url, {"input_text": f"Hi {MARKER}", "max_new_tokens": 5})
    rid = response.headers["x-request-id"]
    line = request_line(sidecar_service, rid)
    assert line["msg"] == "request" and line["level"] == "info"
    assert line["outcome"] in ("eos", "length")
    for field in ("prompt_tokens", "generated_tokens", "ttft_ms", "duration_ms", "status"):
        assert isinstance(line[field], int | float), field
    assert "tokens_per_s" in line or line["generated_tokens"] < 2
    assert [x["request_id"] for x in request_lines(sidecar_service)].count(rid) == 1
    assert MARKER not in sidecar_service.log()


def test_a_sane_incoming_request_id_is_kept(sidecar_service: Service) -> None:
    ok = predict_with_id(sidecar_service, "relay-42.a")
    assert ok.headers["x-request-id"] == "relay-42.a"
    bad = predict_with_id(sidecar_service, "no spaces <allowed>")
    assert bad.headers["x-request-id"] != "no spaces <allowed>"
    assert bad.status_code == ok.status_code == 422


def predict_with_id(service: Service, rid: str) -> httpx.Response:
    body = {"input_text": ""}
    return httpx.post(service.url + "/predict", json=body, headers={"x-request-id": rid})


def test_rejected_requests_are_logged_too(sidecar_service: Service) -> None:
    response = predict(sidecar_service.url, {"input_text": " "})
    line = request_line(sidecar_service, response.headers["x-request-id"])
    assert (line["status"], line["outcome"], line["error_type"]) == (
        422,
        "rejected",
        "invalid_request",
    )


def test_metrics_count_requests_and_tokens(sidecar_service: Service) -> None:
    before = metrics(sidecar_service.url)
    response = predict(sidecar_service.url, {"input_text": "Hi", "max_new_tokens": 4})
    line = request_line(sidecar_service, response.headers["x-request-id"])
    after = metrics(sidecar_service.url)
    outcome = f'sidecar_requests_total{{outcome="{line["outcome"]}"}}'
    assert after[outcome] == before[outcome] + 1
    generated = after["sidecar_generated_tokens_total"] - before["sidecar_generated_tokens_total"]
    assert generated == line["generated_tokens"]
    assert (after["sidecar_ready"], after["sidecar_queue_depth"]) == (1, 0)


@pytest.fixture
def prompt_logging_client(tiny_model_dir: Path) -> Iterator[TestClient]:
    settings = Settings(model_path=tiny_model_dir, log_prompts=True)
    with TestClient(create_app(settings), base_url="http://localhost") as client:
        deadline = time.monotonic() + 60
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        yield client


def test_log_prompts_puts_prompt_and_reply_in_the_line(
    prompt_logging_client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="sidecar.request"):
        response = prompt_logging_client.post(
            "/predict", json={"input_text": f"Hi {MARKER}", "max_new_tokens": 6}
        )
    assert response.status_code == 200
    (record,) = [r for r in caplog.records if r.name == "sidecar.request"]
    fields = record.fields  # type: ignore[attr-defined]
    assert fields["prompt"] == (("user", f"Hi {MARKER}"),)
    assert fields["reply"] == response.text


def test_the_openai_routes_log_no_prompt_text(sidecar_service: Service) -> None:
    """/v1/completions and /v1/responses (whose stored responses keep text in memory only)."""
    url = sidecar_service.url
    bodies = {
        "/v1/completions": {"prompt": f"Hi {MARKER}", "max_tokens": 3},
        "/v1/responses": {"input": f"Hi {MARKER}", "instructions": MARKER, "max_output_tokens": 3},
    }
    for path, body in bodies.items():
        response = httpx.post(url + path, json=body, timeout=60)
        assert response.status_code == 200, response.text
        assert request_line(sidecar_service, response.headers["x-request-id"])["path"] == path
    assert MARKER not in sidecar_service.log()


def test_log_prompts_puts_a_plain_prompt_in_the_line(
    prompt_logging_client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="sidecar.request"):
        response = prompt_logging_client.post(
            "/v1/completions", json={"prompt": f"Hi {MARKER}", "max_tokens": 3}
        )
    assert response.status_code == 200
    (record,) = [r for r in caplog.records if r.name == "sidecar.request"]
    assert record.fields["prompt"] == f"Hi {MARKER}"  # type: ignore[attr-defined]


def test_a_prompt_the_tokenizer_cannot_take_is_a_400_that_logs_no_prompt_text(
    sidecar_service: Service,
) -> None:
    """A lone surrogate in a tool's parameters reached the tokenizer inside the rendered
    prompt: a 500 whose log line held the whole prompt (issue 38). Refused before the
    tokenizer, and no part of the prompt is logged."""
    tool = {
        "type": "function",
        "function": {
            "name": "open_door",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "pin \ud800"}},
            },
        },
    }
    body = {
        "messages": [
            {"role": "system", "content": f"The door code is {MARKER}."},
            {"role": "user", "content": "What is the door code, zebra?"},
        ],
        "tools": [tool],
        "max_tokens": 8,
    }
    response = httpx.post(
        sidecar_service.url + "/v1/chat/completions",
        content=json.dumps(body),  # ASCII: the lone surrogate as the escape \ud800
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert_error(response, 400, "invalid_request_error")
    line = request_line(sidecar_service, response.headers["x-request-id"])
    assert line["status"] == 400
    log = sidecar_service.log()
    assert MARKER not in log and "door code" not in log and "open_door" not in log
