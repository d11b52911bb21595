"""UPSTREAM_API=openai against a fake that behaves like the OpenAI-compatible servers where they
differ (no usage chunk, no [DONE], an error event mid-stream, a 429 with Retry-After, keep-alive
comment lines, a model list to discover). The real sidecar's /v1 is in tests/e2e."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.chatapp import fake_sidecar as fs
from tests.chatapp.fake_sidecar import USAGE, FakeSidecar, chunk, sse

CONVERSATION = {"messages": [{"role": "user", "content": "Hello"}]}
REPLY = [chunk("Hel"), chunk("lo "), chunk("there."), chunk(finish="stop")]


@pytest.fixture
def client(make_app: Callable[..., Flask]) -> FlaskClient:
    return make_app(UPSTREAM_API="openai").test_client()


def chat(client: FlaskClient, body: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    response = client.post("/chat", json=body or CONVERSATION)
    assert response.status_code == 200, response.get_data()
    return list(fs.ndjson(response.get_data()))


def text_of(lines: list[dict[str, Any]]) -> str:
    return "".join(line.get("delta", "") for line in lines)


def test_the_request_and_the_relayed_reply(client: FlaskClient, fake: FakeSidecar) -> None:
    fake.predict = lambda h: sse(h, [*REPLY, chunk(usage=USAGE) | {"choices": []}])
    body = {**CONVERSATION, "max_new_tokens": 30, "temperature": 0.5, "conversation_id": "c-1"}
    lines = chat(client, body)
    assert text_of(lines) == "Hello there."
    done = lines[-1]
    assert done["done"] is True and done["finish_reason"] == "stop"
    assert (done["prompt_tokens"], done["cached_tokens"]) == (12, 8)
    assert done["tokens"] == USAGE["completion_tokens"]  # the server's count
    assert fake.paths == ["/v1/chat/completions"]
    assert fake.requests == [
        {
            "model": "fake-model",  # the first one GET /v1/models lists
            "messages": CONVERSATION["messages"],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 30,
            "temperature": 0.5,
            "prompt_cache_key": "c-1",
        }
    ]
    assert fake.headers[0]["Accept"] == "text/event-stream"


def test_upstream_model_and_key_and_a_v1_url(
    make_app: Callable[..., Flask], fake: FakeSidecar
) -> None:
    fake.predict = lambda h: sse(h, REPLY)
    app = make_app(
        UPSTREAM_API="openai",
        UPSTREAM_MODEL="phi3:mini",
        UPSTREAM_API_KEY="sk-local",
        SIDECAR_URL=fake.url + "/v1",
    )
    assert text_of(chat(app.test_client())) == "Hello there."
    assert fake.requests[0]["model"] == "phi3:mini"
    assert fake.paths == ["/v1/chat/completions"]  # not /v1/v1/...
    assert fake.headers[0]["Authorization"] == "Bearer sk-local"


def test_no_usage_chunk_and_no_done_marker(client: FlaskClient, fake: FakeSidecar) -> None:
    """Servers that send neither: the reply is complete after its finish_reason."""
    fake.predict = lambda h: sse(h, REPLY, done=False)
    lines = chat(client)
    assert text_of(lines) == "Hello there."
    assert lines[-1]["done"] is True and lines[-1]["finish_reason"] == "stop"
    assert "prompt_tokens" not in lines[-1]
    assert lines[-1]["tokens"] == 3  # no count from the server: the pieces relayed


def test_keep_alive_comments_are_skipped(client: FlaskClient, fake: FakeSidecar) -> None:
    fake.predict = lambda h: sse(h, REPLY, comments=True)
    assert text_of(chat(client)) == "Hello there."


def test_empty_content_chunks_add_nothing(client: FlaskClient, fake: FakeSidecar) -> None:
    """Our sidecar's first chunk, its keep-alives and its last chunk carry "content": ""."""
    keepalive = chunk("")
    first = chunk("") | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    fake.predict = lambda h: sse(h, [first, keepalive, keepalive, *REPLY[:-1], chunk("", "stop")])
    lines = chat(client)
    assert [line["delta"] for line in lines if "delta" in line] == ["Hel", "lo ", "there."]
    assert lines[-1]["done"] is True and lines[-1]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("error", "type", "sentence"),
    [
        ({"code": "context_length_exceeded", "limit_tokens": 4096}, "context_overflow", "too long"),
        ({"code": "overloaded", "type": "server_error"}, "busy", "busy"),
        ({"code": "model_not_ready", "phase": "restarting"}, "restarting", "restarting"),
        ({"code": "model_not_ready", "phase": "failed"}, "model_failed", "could not load"),
    ],
)
def test_a_refusal_in_a_started_stream_is_that_refusal(
    client: FlaskClient, fake: FakeSidecar, error: dict[str, Any], type: str, sentence: str
) -> None:
    """Our sidecar starts a stream that waits (STREAM_START_AFTER_S); a refusal after that
    comes as an error event: the page gets the refusal's own type and sentence, as it would
    for the HTTP status (it once read "The model service stopped: ...", upstream_disconnected)."""
    event = {"error": {"message": "the prompt takes 5000 tokens", **error}}
    first = chunk("") | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    fake.predict = lambda h: sse(h, [first, chunk(""), event], done=False)
    lines = chat(client)
    assert not any(line.get("delta") for line in lines)
    assert lines[-1]["error"]["type"] == type
    assert sentence in lines[-1]["error"]["message"]


def test_a_length_finish_is_said(client: FlaskClient, fake: FakeSidecar) -> None:
    fake.predict = lambda h: sse(h, [chunk("Hello"), chunk(finish="length")])
    assert chat(client)[-1]["finish_reason"] == "length"


def test_an_error_event_mid_stream_breaks_the_reply_with_its_message(
    client: FlaskClient, fake: FakeSidecar
) -> None:
    error = {"error": {"message": "Out of memory.", "type": "server_error"}}
    fake.predict = lambda h: sse(h, [chunk("Hel"), error], done=False)
    lines = chat(client)
    assert text_of(lines) == "Hel"
    assert lines[-1] == {
        "error": {
            "message": "The model service stopped: Out of memory.",
            "type": "upstream_disconnected",
        }
    }


def test_a_stream_cut_before_it_finished_is_broken(client: FlaskClient, fake: FakeSidecar) -> None:
    fake.predict = lambda h: sse(h, [chunk("Hel")], done=False)
    assert chat(client)[-1]["error"]["type"] == "upstream_disconnected"


@pytest.mark.parametrize(
    ("status", "body", "headers", "expected", "type"),
    [
        (
            429,
            {"error": {"message": "slow down", "type": "rate_limit"}},
            {"Retry-After": "7"},
            503,
            "busy",
        ),
        (
            401,
            {"error": {"message": "bad key", "code": "invalid_api_key"}},
            {},
            502,
            "upstream_unauthorized",
        ),
        (404, {"error": {"message": "model 'x' not found"}}, {}, 502, "upstream_error"),
        (
            400,
            {"error": {"message": "context too long", "code": "context_length_exceeded"}},
            {},
            413,
            "context_overflow",
        ),
        (
            400,
            {
                "error": {
                    "message": "the request exceeds the available context size",
                    "type": "exceed_context_size_error",
                }
            },
            {},
            413,
            "context_overflow",
        ),
        (400, {"error": "temperature: too high"}, {}, 400, "invalid_request"),
        (
            503,
            {"error": {"message": "not ready", "code": "model_not_ready", "phase": "loading"}},
            {"Retry-After": "5"},
            503,
            "loading",
        ),
        (
            503,
            {"error": {"message": "not ready", "code": "model_not_ready", "phase": "failed"}},
            {},
            503,
            "model_failed",
        ),
        (500, {"error": {"message": "boom"}}, {}, 502, "upstream_error"),
    ],
    ids=[
        "429",
        "401",
        "404",
        "context",
        "llama-context",
        "string-error",
        "loading",
        "failed",
        "500",
    ],
)
def test_refusals_of_other_servers(
    client: FlaskClient,
    fake: FakeSidecar,
    status: int,
    body: Any,
    headers: dict[str, str],
    expected: int,
    type: str,
) -> None:
    fake.predict = lambda h: fs.refuse(h, status, body, headers)
    response = client.post("/chat", json=CONVERSATION)
    assert response.status_code == expected
    assert response.get_json()["error"]["type"] == type
    if type == "busy":
        assert response.headers["Retry-After"] == "7"


def test_health_names_the_upstream_model(client: FlaskClient, fake: FakeSidecar) -> None:
    body = client.get("/healthz").get_json()
    assert body["model"] == "fake-model" and body["sidecar"]["ready"] is True
    fake.models = (200, {"object": "list", "data": []})  # nothing to serve yet
    body = client.get("/healthz").get_json()
    assert body["sidecar"]["ready"] is False and body["sidecar"]["detail"]["phase"] == "loading"


def test_a_server_without_a_model_list_is_ready_with_upstream_model(
    make_app: Callable[..., Flask], fake: FakeSidecar
) -> None:
    fake.models = (404, {"error": "not found"})
    unnamed = make_app(UPSTREAM_API="openai").test_client().get("/healthz").get_json()
    assert unnamed["sidecar"]["ready"] is False
    named = make_app(UPSTREAM_API="openai", UPSTREAM_MODEL="phi-4-mini").test_client()
    body = named.get("/healthz").get_json()
    assert body["sidecar"]["ready"] is True and body["model"] == "phi-4-mini"
    fake.predict = lambda h: sse(h, REPLY)
    assert text_of(chat(named)) == "Hello there."


def test_no_model_listed_is_a_readable_error(
    make_app: Callable[..., Flask], fake: FakeSidecar
) -> None:
    fake.models = (200, {"object": "list", "data": []})
    response = make_app(UPSTREAM_API="openai").test_client().post("/chat", json=CONVERSATION)
    assert response.status_code == 502
    assert "UPSTREAM_MODEL" in response.get_json()["error"]["message"]
