"""/predict's `passages` and `passage_scope` (the passage store, model/kv/passages.py) against a
real sidecar on the tiny model: a grounded request's passages are read while the worker is idle,
the next question that holds them takes them from the store (`passage_cached_tokens` in the done
line, the header and the log line), /readyz says how, /metrics counts, and a passage that does
not stand in the messages is refused."""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

import httpx

from scripts.run.services import Service
from tests.sidecar.support import assert_error, metrics, request_line

EVENTS = {"accept": "application/x-ndjson"}
PASSAGES = [
    "The quick brown fox jumps over the lazy dog near the river bank at dawn, every day. " * 2,
    "Python lists are mutable sequences; tuples are immutable, and hashable when their items "
    "are. " * 2,
]


def grounded(question: str, order: list[int], scope: str) -> dict[str, Any]:
    block = "\n\n".join(f"[{n}] doc\n{PASSAGES[i]}" for n, i in enumerate(order, 1))
    return {
        "messages": [
            {"role": "system", "content": "Answer from the passages."},
            {"role": "user", "content": f"Passages:\n\n{block}\n\nQuestion: {question}"},
        ],
        "max_new_tokens": 4,
        "passages": [PASSAGES[i] for i in order],
        "passage_scope": scope,
        "cache_scope": secrets.token_hex(8),  # a chat of its own: no conversation cache
    }


def done_line(url: str, body: dict[str, Any]) -> tuple[httpx.Response, dict[str, Any]]:
    response = httpx.post(url + "/predict", json=body, headers=EVENTS, timeout=60)
    assert response.status_code == 200, response.text
    return response, json.loads(response.text.splitlines()[-1])


def test_a_grounded_question_takes_its_passages_from_the_store_once_read(
    sidecar_service: Service,
) -> None:
    url, scope = sidecar_service.url, "library-" + secrets.token_hex(4)
    assert httpx.get(url + "/readyz", timeout=10).json()["passage_reuse"] == "exact"
    _, first = done_line(url, grounded("What is a list?", [0, 1], scope))
    assert first["passage_cached_tokens"] == 0
    waited = time.monotonic() + 60  # the idle worker reads them (a wait, not a timing)
    while metrics(url)["sidecar_passage_store_wanted"] and time.monotonic() < waited:
        time.sleep(0.1)
    response, second = done_line(url, grounded("And a tuple?", [0, 1], scope))
    assert second["passage_cached_tokens"] > 50
    assert int(response.headers["x-passage-cached-tokens"]) == second["passage_cached_tokens"]
    line = request_line(sidecar_service, response.headers["x-request-id"])
    assert line["passage_cached_tokens"] == second["passage_cached_tokens"]
    counts = metrics(url)
    assert counts["sidecar_passage_store_hits_total"] >= 2
    assert counts["sidecar_passage_store_bytes"] > 0
    # Another owner's question with the same passages finds none of them
    _, other = done_line(url, grounded("And a tuple?", [0, 1], scope + "-other"))
    assert other["passage_cached_tokens"] == 0


def test_a_passage_that_is_not_in_the_messages_is_refused(sidecar_service: Service) -> None:
    body = grounded("What is a list?", [0], "library-x")
    body["passages"] = ["A text the messages do not hold."]
    response = httpx.post(sidecar_service.url + "/predict", json=body, timeout=60)
    message = assert_error(response, 422, "invalid_request")
    assert "passages[0]" in message
    too_many = grounded("What is a list?", [0], "library-x")
    too_many["passages"] = [PASSAGES[0]] * 33
    assert_error(httpx.post(sidecar_service.url + "/predict", json=too_many, timeout=60), 422)
