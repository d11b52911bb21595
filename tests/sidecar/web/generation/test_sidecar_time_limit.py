"""REPLY_TIME_LIMIT_S: a reply ends cleanly before App Service's front end (230 s) would cut
the request, on both APIs, against a real sidecar whose engine is slowed to 50 ms a token
(tests/support/engines.py `paced()`) with a one-second limit. Counted, not timed: a reply of
1000 tokens would take 50 s; the limit ends it with a normal end far short of that."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from scripts.models.make_model import LONG_PROMPT
from scripts.run import services
from tests.sidecar.support import metrics, predict, request_line
from tests.support.engines import paced

LIMIT = 1000  # tokens asked for; the time limit ends every reply long before
BODY = {"messages": [{"role": "user", "content": LONG_PROMPT}], "max_tokens": LIMIT}


@pytest.fixture(scope="module")
def limited_sidecar(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    log = tmp_path_factory.mktemp("logs") / "sidecar-time-limit.log"
    with services.sidecar(
        tiny_model_dir, log, MAX_CONCURRENCY="2", REPLY_TIME_LIMIT_S="1", env=paced(0.05)
    ) as service:
        yield service


def test_a_completion_past_the_limit_ends_with_finish_reason_length(
    limited_sidecar: services.Service,
) -> None:
    before = metrics(limited_sidecar.url)
    response = httpx.post(limited_sidecar.url + "/v1/chat/completions", json=BODY, timeout=60)
    assert response.status_code == 200, response.text
    completion = response.json()
    assert completion["choices"][0]["finish_reason"] == "length"
    assert 0 < completion["usage"]["completion_tokens"] < LIMIT
    line = request_line(limited_sidecar, response.headers["x-request-id"])
    assert (line["status"], line["outcome"]) == (200, "time_limit")
    assert line["generated_tokens"] == completion["usage"]["completion_tokens"]
    after = metrics(limited_sidecar.url)
    series = 'sidecar_requests_total{outcome="time_limit"}'
    assert after[series] == before[series] + 1


def test_a_stream_past_the_limit_ends_with_its_final_chunk_and_done(
    limited_sidecar: services.Service,
) -> None:
    url = limited_sidecar.url + "/v1/chat/completions"
    with httpx.stream("POST", url, json={**BODY, "stream": True}, timeout=60) as response:
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert 1 < len(chunks) < LIMIT


def test_predict_past_the_limit_ends_with_its_done_line(limited_sidecar: services.Service) -> None:
    body = {"input_text": LONG_PROMPT, "max_new_tokens": LIMIT}
    headers = {"Accept": "application/x-ndjson"}
    response = httpx.post(limited_sidecar.url + "/predict", json=body, headers=headers, timeout=60)
    *pieces, done = [json.loads(line) for line in response.text.splitlines()]
    assert done["done"] is True and done["finish_reason"] == "length"
    assert 0 < done["generated_tokens"] < LIMIT
    assert all("text" in piece for piece in pieces)
    # text/plain has no end marker: the stream simply ends, complete (no cut-off chunk).
    plain = predict(limited_sidecar.url, body)
    assert plain.status_code == 200 and plain.text
    line = request_line(limited_sidecar, plain.headers["x-request-id"])
    assert line["outcome"] == "time_limit" and line["generated_tokens"] < LIMIT


def test_the_default_is_below_app_services_230_s_and_zero_turns_it_off() -> None:
    from sidecar.settings import Settings

    assert Settings().reply_time_limit_s == 210  # below App Service's 230 s, with margin
    assert Settings(reply_time_limit_s=0).reply_time_limit_s == 0
    with pytest.raises(ValueError, match="reply_time_limit_s"):
        Settings(reply_time_limit_s=-1)
