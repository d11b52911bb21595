"""POST /predict with Accept: application/x-ndjson: the text as events and how the reply ended
(text/plain stays the default, for the original sample's clients)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from scripts.run.services import Service
from tests.support.engines import RAISE

EVENTS = {"accept": "application/x-ndjson"}


def events(url: str, body: dict[str, Any]) -> tuple[httpx.Response, list[dict[str, Any]]]:
    response = httpx.post(url + "/predict", json=body, headers=EVENTS, timeout=60)
    return response, [json.loads(line) for line in response.text.splitlines()]


def test_events_end_with_the_finish_reason_and_counts(sidecar_service: Service) -> None:
    body = {"input_text": "Hello there", "max_new_tokens": 6, "min_new_tokens": 6}
    response, lines = events(sidecar_service.url, body)
    assert response.headers["content-type"].startswith("application/x-ndjson")
    assert all(set(line) == {"text"} for line in lines[:-1])
    done = lines[-1]
    assert done["done"] is True and done["finish_reason"] == "length"
    assert done["generated_tokens"] == 6
    assert done["prompt_tokens"] == int(response.headers["x-prompt-tokens"])
    assert done["cached_tokens"] == int(response.headers["x-cached-tokens"])
    assert done["dropped_messages"] == 0
    plain = httpx.post(sidecar_service.url + "/predict", json=body, timeout=60)
    assert plain.headers["content-type"].startswith("text/plain")
    assert plain.text == "".join(line["text"] for line in lines[:-1])


def test_a_stop_sequence_finishes_with_stop(sidecar_service: Service) -> None:
    body = {"input_text": "Hello there", "max_new_tokens": 30, "min_new_tokens": 30}
    whole = httpx.post(sidecar_service.url + "/predict", json=body, timeout=60).text
    stop = whole[8:11]
    _, lines = events(sidecar_service.url, {**body, "stop": [stop]})
    assert "".join(line.get("text", "") for line in lines) == whole[: whole.find(stop)]
    assert lines[-1]["finish_reason"] == "stop"


def test_text_plain_is_still_the_default(sidecar_service: Service) -> None:
    for accept in ("*/*", "text/plain", "application/x-ndjson;q=0"):
        response = httpx.post(
            sidecar_service.url + "/predict",
            json={"input_text": "Hi", "max_new_tokens": 2},
            headers={"accept": accept},
            timeout=60,
        )
        assert response.headers["content-type"].startswith("text/plain"), accept


def test_a_failure_after_the_first_byte_is_an_error_event(faulty_service: Service) -> None:
    _, lines = events(faulty_service.url, {"input_text": f"{RAISE} go", "max_new_tokens": 20})
    assert lines[0].get("text")
    assert lines[-1] == {
        "error": {
            "message": "the generation failed after the reply started; see the sidecar log",
            "type": "generation_failed",
        }
    }
