"""POST /v1/passages/warm against a real sidecar on the tiny model: the passages sent are read
while the worker is idle (`sidecar_passage_store_warming` falls to 0), the first question they
lead takes them from the store, no admission place is taken, and bad items are refused."""

from __future__ import annotations

import secrets
from typing import Any

import httpx

from scripts.run.services import Service
from tests.sidecar.support import assert_error, passages_read
from tests.sidecar.web.predict.test_sidecar_predict_passages import PASSAGES, done_line, grounded

WARM = "/v1/passages/warm"


def warm_item(index: int) -> dict[str, Any]:
    """A first question's prompt cut before its question (as chatapp/documents/warming.py)."""
    body = grounded("", [index], "unused")
    return {"messages": body["messages"], "passages": body["passages"]}


def test_warmed_passages_are_read_while_idle_and_lead_the_next_question(
    sidecar_service: Service,
) -> None:
    url, scope = sidecar_service.url, "library-" + secrets.token_hex(4)
    body = {"items": [warm_item(0), warm_item(1)], "passage_scope": scope}
    response = httpx.post(url + WARM, json=body, timeout=60)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["object"] == "passage_warming"
    assert [item["index"] for item in answer["items"]] == [0, 1]
    tokens = [item["tokens"] for item in answer["items"]]
    assert all(count > 20 for count in tokens) and answer["items"][0]["reason"] is None
    passages_read(url)
    _, done = done_line(url, grounded("What is a tuple?", [1, 0], scope))
    assert done["passage_cached_tokens"] == tokens[1]
    again = httpx.post(url + WARM, json=body, timeout=60).json()
    assert [item["reason"] for item in again["items"]] == ["stored already"] * 2


def test_warming_takes_no_admission_place(sidecar_service: Service) -> None:
    # More items than the admission queue holds, sent at once: none is refused as overloaded
    items = [warm_item(0)] * 64
    body = {"items": items, "passage_scope": "library-" + secrets.token_hex(4)}
    response = httpx.post(sidecar_service.url + WARM, json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert sum(1 for item in response.json()["items"] if item["tokens"]) >= 1
    passages_read(sidecar_service.url)


def test_bad_items_are_refused(sidecar_service: Service) -> None:
    url = sidecar_service.url + WARM
    outside = warm_item(0) | {"passages": ["A text the messages do not hold."]}
    message = assert_error(httpx.post(url, json={"items": [outside]}, timeout=30), 400)
    assert "passages[0]" in message
    assert_error(httpx.post(url, json={"items": []}, timeout=30), 400)
    assert_error(httpx.post(url, json={"items": [warm_item(0)] * 65}, timeout=30), 400)
    no_passage = warm_item(0) | {"passages": []}
    assert_error(httpx.post(url, json={"items": [no_passage]}, timeout=30), 400)
    assistant_last = {
        "messages": [{"role": "assistant", "content": PASSAGES[0]}],
        "passages": [PASSAGES[0]],
    }
    assert_error(httpx.post(url, json={"items": [assistant_last]}, timeout=30), 400)
