"""Every error is the JSON envelope with one readable sentence: no HTML page, no stack trace."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

USER = {"role": "user", "content": "Hello"}


def assert_envelope(response: Any, status: int, type: str) -> str:
    assert response.status_code == status
    assert response.mimetype == "application/json"
    body = response.get_json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type"}
    assert body["error"]["type"] == type
    message: str = body["error"]["message"]
    assert message.endswith(".") and "Traceback" not in message
    return message


def test_404_is_json(client: FlaskClient) -> None:
    assert_envelope(client.get("/nope"), 404, "not_found")


def test_405_is_json_and_keeps_allow(client: FlaskClient) -> None:
    response = client.get("/chat")
    assert_envelope(response, 405, "method_not_allowed")
    assert "POST" in response.headers["Allow"]


def test_500_is_json_without_internals(make_app: Callable[..., Flask]) -> None:
    app = make_app()

    @app.get("/boom")
    def boom() -> str:
        raise RuntimeError("secret internal detail")

    response = app.test_client().get("/boom")
    message = assert_envelope(response, 500, "internal_error")
    assert "secret" not in response.get_data(as_text=True)
    assert message == "Something went wrong in the chat app."


def test_415_when_not_json(client: FlaskClient) -> None:
    response = client.post("/chat", data="hello", content_type="text/plain")
    assert_envelope(response, 415, "unsupported_media_type")


def test_400_when_body_is_not_json(client: FlaskClient) -> None:
    response = client.post("/chat", data="{not json", content_type="application/json")
    assert_envelope(response, 400, "invalid_request")


def test_413_when_body_too_large(make_app: Callable[..., Flask]) -> None:
    client = make_app(MAX_CONTENT_LENGTH=1000).test_client()
    response = client.post("/chat", json={"messages": [{"role": "user", "content": "x" * 2000}]})
    assert_envelope(response, 413, "payload_too_large")


def test_an_upload_too_large_says_so_not_that_a_conversation_is(client: FlaskClient) -> None:
    """Issue 58: a 100 MB upload was told "The conversation is too long to send."."""
    response = client.post(
        "/api/documents",
        data=b"--x\r\n",
        content_type="multipart/form-data; boundary=x",
        environ_overrides={"CONTENT_LENGTH": str(100 * 1024 * 1024)},
    )
    message = assert_envelope(response, 413, "payload_too_large")
    assert message.startswith("The upload is too large: send at most ") and "MB" in message
    assert "conversation" not in message


def test_a_form_of_too_many_parts_says_so(client: FlaskClient) -> None:
    """Issue 58: a 3,000-part request was told "The conversation is too long to send."."""
    parts = b"".join(
        b'--x\r\nContent-Disposition: form-data; name="f%d"\r\n\r\nv\r\n' % n for n in range(3000)
    )
    response = client.post(
        "/api/documents", data=parts + b"--x--\r\n", content_type="multipart/form-data; boundary=x"
    )
    message = assert_envelope(response, 413, "too_many_parts")
    assert (
        message
        == "The upload has too many parts; at most 1000 are read. Send fewer files at a time."
    )


def test_empty_assistant_turn_is_accepted(client: FlaskClient, fake: Any) -> None:
    # A reply stopped before its first word leaves an empty assistant turn in some clients.
    body = {"messages": [USER, {"role": "assistant", "content": ""}, USER]}
    with client.post("/chat", json=body) as response:
        assert response.status_code == 200
    assert fake.requests == [{**body, "cache_scope": fake.requests[0]["cache_scope"]}]


def test_413_when_too_many_messages(make_app: Callable[..., Flask]) -> None:
    client = make_app(MAX_MESSAGES=3).test_client()
    response = client.post("/chat", json={"messages": [USER] * 4})
    assert_envelope(response, 413, "payload_too_large")


@pytest.mark.parametrize(
    "body",
    [
        [USER],
        {},
        {"messages": []},
        {"messages": "Hello"},
        {"messages": ["Hello"]},
        {"messages": [{"role": "robot", "content": "Hello"}]},
        {"messages": [{"role": "user", "content": 5}]},
        {"messages": [{"role": "user"}]},
        {"messages": [USER, {"role": "assistant", "content": "Hi"}]},
        {"messages": [{"role": "user", "content": "   "}]},
        {"messages": [{"role": "system", "content": " "}, USER]},
        {"messages": [USER, {"role": "system", "content": "Be brief."}, USER]},
        {"messages": [{"role": "user", "content": "form\x0cfeed"}]},
        {"messages": [{"role": "user", "content": "nul\x00"}]},
        {"messages": [USER], "max_new_tokens": 0},
        {"messages": [USER], "max_new_tokens": "10"},
        {"messages": [USER], "max_new_tokens": True},
        {"messages": [USER], "temperature": "hot"},
        {"messages": [USER], "temperature": -1},
        {"messages": [USER], "min_new_tokens": -1},
        {"messages": [USER], "min_new_tokens": 1.5},
        {"messages": [USER], "min_new_tokens": 6, "max_new_tokens": 5},
    ],
)
def test_400_for_bad_conversations(client: FlaskClient, fake: Any, body: Any) -> None:
    assert_envelope(client.post("/chat", json=body), 400, "invalid_request")
    assert fake.requests == []  # nothing reached the sidecar
