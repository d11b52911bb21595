"""`POST /chat` options the page sends: `conversation_id` (the sidecar's cache scope) and
reply lengths bounded by `MAX_NEW_TOKENS_LIMIT`, which the page reads from its markup."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from chatapp import create_app
from tests.chatapp import fake_sidecar as fs
from tests.chatapp.fake_sidecar import FakeSidecar

USER = {"role": "user", "content": "Hello"}


def test_conversation_id_scopes_the_sidecars_cache(client: FlaskClient, fake: FakeSidecar) -> None:
    body = {"messages": [USER], "conversation_id": "3f2a_B-9" * 8}  # 64 characters
    response = client.post("/chat", json=body)
    assert response.status_code == 200
    assert list(fs.ndjson(response.get_data()))[-1]["done"] is True
    # Only this conversation's requests may reuse each other's cached tokens.
    assert fake.requests == [{"messages": [USER], "cache_scope": "3f2a_B-9" * 8}]


def test_a_chat_without_conversation_id_gets_a_fresh_scope_of_its_own(
    client: FlaskClient, fake: FakeSidecar
) -> None:
    # Never the model service's shared unscoped pool, where cached_tokens is an oracle for
    # what others sent: each such request gets its own random scope (issue 25).
    for _ in range(2):
        assert client.post("/chat", json={"messages": [USER]}).status_code == 200
    scopes = [request["cache_scope"] for request in fake.requests]
    assert all(re.fullmatch(r"once-[0-9a-f]{32}", scope) for scope in scopes)
    assert scopes[0] != scopes[1]


@pytest.mark.parametrize(
    "conversation_id", ["", "x" * 65, "with space", "slash/es", "ünïcode", 42, ["a"], {"a": 1}]
)
def test_bad_conversation_id_is_refused(
    client: FlaskClient, fake: FakeSidecar, conversation_id: Any
) -> None:
    response = client.post("/chat", json={"messages": [USER], "conversation_id": conversation_id})
    assert response.status_code == 400
    assert response.get_json()["error"]["type"] == "invalid_request"
    assert "conversation_id" in response.get_json()["error"]["message"]
    assert fake.requests == []


def test_max_new_tokens_limit(make_app: Callable[..., Flask], fake: FakeSidecar) -> None:
    client = make_app(MAX_NEW_TOKENS_LIMIT=100).test_client()
    assert client.post("/chat", json={"messages": [USER], "max_new_tokens": 100}).status_code == 200
    for name in ("max_new_tokens", "min_new_tokens"):
        response = client.post("/chat", json={"messages": [USER], name: 101})
        assert response.status_code == 400
        assert response.get_json()["error"] == {
            "message": f"{name} must be at most 100.",
            "type": "invalid_request",
        }
    assert [request["max_new_tokens"] for request in fake.requests] == [100]


def test_limit_setting_reaches_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MAX_NEW_TOKENS_LIMIT", raising=False)
    assert create_app().config["MAX_NEW_TOKENS_LIMIT"] == 4096
    monkeypatch.setenv("MAX_NEW_TOKENS_LIMIT", "512")
    app = create_app({"TESTING": True})
    assert app.config["MAX_NEW_TOKENS_LIMIT"] == 512
    html = app.test_client().get("/").get_data(as_text=True)
    assert 'data-max-new-tokens-limit="512"' in html
