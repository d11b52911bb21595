"""`POST /chat`'s `model` (issue 56) against the fake: checked as the wire format says, sent on as
/predict's `model` or as the OpenAI request's (instead of UPSTREAM_MODEL), named by the done
line; a model the service does not serve is `404 model_not_found`; the sidecar's `loading`
events become the page's `loading` lines, and a refusal after them its error line. Our real
sidecar with several models is in test_chatapp_models_relay.py."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from chatapp.observability.logs import JsonFormatter
from tests.chatapp import fake_sidecar as fs
from tests.chatapp.fake_sidecar import FakeSidecar, chunk, sse

HELLO = [{"role": "user", "content": "Hello"}]
NOT_FOUND = {
    "error": {
        "message": "no model 'gone' here; GET /v1/models lists those served (tiny)",
        "type": "not_found",
    }
}


def lines_of(client: FlaskClient, **body: Any) -> list[dict[str, Any]]:
    response = client.post("/chat", json={"messages": HELLO, **body})
    assert response.status_code == 200, response.get_data()
    return list(fs.ndjson(response.get_data()))


@pytest.mark.parametrize("bad", ["", "two words", "a" * 257, "bell\x07", 7, ["tiny"], "\u2028x"])
def test_a_model_name_is_checked(client: FlaskClient, fake: FakeSidecar, bad: object) -> None:
    response = client.post("/chat", json={"messages": HELLO, "model": bad})
    assert response.status_code == 400
    assert response.get_json()["error"] == {
        "message": "model must be 1 to 256 characters without spaces or control characters.",
        "type": "invalid_request",
    }
    assert fake.requests == []


def test_the_model_goes_to_predict_and_the_done_line_names_it(
    client: FlaskClient, fake: FakeSidecar
) -> None:
    lines = lines_of(client, model="hf.co/owner/repo:Q4_K_M")
    assert fake.requests[0]["model"] == "hf.co/owner/repo:Q4_K_M"
    assert lines[-1]["done"] is True and lines[-1]["model"] == "hf.co/owner/repo:Q4_K_M"
    # None named: none sent, none said (the model service's default answers)
    lines = lines_of(client)
    assert "model" not in fake.requests[1] and "model" not in lines[-1]


def test_a_model_the_sidecar_does_not_serve_is_404(client: FlaskClient, fake: FakeSidecar) -> None:
    fake.predict = lambda h: fs.refuse(h, 404, NOT_FOUND)
    response = client.post("/chat", json={"messages": HELLO, "model": "gone"})
    assert response.status_code == 404
    assert response.get_json()["error"] == {
        "message": "The model service has no model named 'gone'; choose another model.",
        "type": "model_not_found",
    }


def loading(seconds: float, left: int | None) -> dict[str, Any]:
    return {"loading": {"model": "small", "seconds": seconds, "seconds_left": left}}


def test_loading_events_are_relayed_before_the_reply(
    client: FlaskClient, fake: FakeSidecar
) -> None:
    def predict(h: fs.Handler) -> None:
        fs.start_events(h)
        for event in (loading(0.0, 12), loading(5.0, 7), loading(10.1, 2)):
            fs.write_chunk(h, fs.event_line(event))
        fs.write_text(h, "Hi")
        fs.write_done(h, 1)

    fake.predict = predict
    lines = lines_of(client, model="small")
    assert lines == [
        loading(0.0, 12),
        loading(5.0, 7),
        loading(10.1, 2),
        {"delta": "Hi"},
        lines[-1],
    ]
    assert lines[-1]["done"] is True and lines[-1]["model"] == "small"


@pytest.mark.parametrize(
    ("error", "relayed"),
    [
        # The model failed to load: said so, no retry for ever
        (
            {"message": "the model is not ready (failed: no weights)", "type": "not_ready"},
            "model_failed",
        ),
        ({"message": "the model is not ready (loading)", "type": "not_ready"}, "loading"),
        (
            {"message": "the models answering fill MODELS_MEMORY_BYTES", "type": "overloaded"},
            "busy",
        ),
        (
            {"message": "the prompt is too long", "type": "context_length_exceeded"},
            "context_overflow",
        ),
        (
            {"message": "the model 'small' reads text only", "type": "image_input_unsupported"},
            "invalid_request",
        ),
    ],
)
def test_a_refusal_after_the_loading_lines_is_the_streams_error_line(
    client: FlaskClient, fake: FakeSidecar, error: dict[str, str], relayed: str
) -> None:
    """The sidecar's stream started at once for a model that loads, so its refusal is an error
    line: before any text it is the refusal it stands for (with retry_after where waiting
    heals it), as the page reads a refused grounded turn."""

    def predict(h: fs.Handler) -> None:
        fs.start_events(h)
        fs.write_chunk(h, fs.event_line(loading(0.0, None)))
        fs.write_chunk(h, fs.event_line({"error": error}))
        fs.end_chunks(h)

    fake.predict = predict
    lines = lines_of(client, model="small")
    assert lines[0] == loading(0.0, None)
    assert lines[-1]["error"]["type"] == relayed
    assert ("retry_after" in lines[-1]["error"]) == (relayed in ("loading", "busy"))


def test_a_failure_after_text_is_still_a_broken_reply(
    client: FlaskClient, fake: FakeSidecar
) -> None:
    def predict(h: fs.Handler) -> None:
        fs.start_events(h)
        fs.write_text(h, "Half")
        failed = {"message": "the generation failed", "type": "generation_failed"}
        fs.write_chunk(h, fs.event_line({"error": failed}))
        fs.end_chunks(h)

    fake.predict = predict
    lines = lines_of(client, model="small")
    assert lines[-1]["error"]["type"] == "upstream_disconnected"


@pytest.fixture
def openai_client(make_app: Callable[..., Flask]) -> FlaskClient:
    return make_app(UPSTREAM_API="openai", UPSTREAM_MODEL="phi3:mini").test_client()


def test_the_model_replaces_upstream_model_in_the_openai_request(
    openai_client: FlaskClient, fake: FakeSidecar
) -> None:
    keepalive = chunk("") | {"loading": {"model": "smollm2", "seconds": 1.5, "seconds_left": 9}}
    fake.predict = lambda h: sse(h, [keepalive, chunk("Hi"), chunk(finish="stop")])
    lines = lines_of(openai_client, model="smollm2")
    assert fake.requests[0]["model"] == "smollm2"
    assert lines[0] == {"loading": {"model": "smollm2", "seconds": 1.5, "seconds_left": 9}}
    assert lines[1] == {"delta": "Hi"} and lines[-1]["model"] == "smollm2"
    fake.predict = lambda h: sse(h, [chunk("Hi"), chunk(finish="stop")])
    lines_of(openai_client)
    assert fake.requests[1]["model"] == "phi3:mini"


def test_an_unknown_model_of_the_openai_server_is_404(
    openai_client: FlaskClient, fake: FakeSidecar
) -> None:
    gone = {"error": {"message": "model 'gone' not found", "type": "invalid_request_error"}}
    fake.predict = lambda h: fs.refuse(h, 404, gone)
    response = openai_client.post("/chat", json={"messages": HELLO, "model": "gone"})
    assert (response.status_code, response.get_json()["error"]["type"]) == (404, "model_not_found")
    # The app's own model missing is still the operator's to fix
    response = openai_client.post("/chat", json={"messages": HELLO})
    assert (response.status_code, response.get_json()["error"]["type"]) == (502, "upstream_error")
    assert "UPSTREAM_MODEL" in response.get_json()["error"]["message"]


def test_the_chat_log_line_names_the_model(
    client: FlaskClient, fake: FakeSidecar, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="chatapp")
    response = client.post("/chat", json={"messages": HELLO, "model": "smollm2"})
    response.get_data()
    response.close()  # as a server closes it: the chat's line is written
    formatter = JsonFormatter()
    lines = [json.loads(formatter.format(r)) for r in caplog.records]
    chats = [line for line in lines if line["logger"] == "chatapp.request"]
    assert [line["model"] for line in chats] == ["smollm2"]
