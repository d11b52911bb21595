"""An import's bound (`MAX_IMPORT_BYTES`): a long chat's text, far over one request's 64 KiB,
is imported whole; past the bound it is the app's JSON 413 and nothing is stored; through
gunicorn too (its body read under the body deadline, which must leave room for it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from flask import Flask
from flask.testing import FlaskClient

from scripts.run import services

ALICE = {"X-MS-CLIENT-PRINCIPAL-ID": "alice-oid"}


def long_chat(turns: int, size: int = 1000) -> dict[str, object]:
    messages = []
    for n in range(turns):
        messages.append({"role": "user", "content": f"Question {n}: " + "q" * size})
        messages.append({"role": "assistant", "content": f"Answer {n}: " + "a" * size})
    return {"title": "Long", "messages": messages}


@pytest.fixture
def client(make_app: Callable[..., Flask], database_url: str) -> FlaskClient:
    return make_app(
        DATABASE_URL=database_url, AUTH_MODE="appservice", MAX_IMPORT_BYTES=600_000
    ).test_client()


def test_a_chat_far_over_one_requests_bound_is_imported_whole(client: FlaskClient) -> None:
    made = client.post("/api/chats", json=long_chat(250), headers=ALICE)  # about 510 KB
    assert made.status_code == 201, made.get_json()
    messages = made.get_json()["messages"]
    assert len(messages) == 500
    assert messages[-1]["content"] == "Answer 249: " + "a" * 1000


def test_an_import_over_its_bound_is_the_apps_413(client: FlaskClient) -> None:
    refused = client.post("/api/chats", json=long_chat(300), headers=ALICE)  # about 610 KB
    assert refused.status_code == 413
    assert refused.get_json()["error"]["type"] == "payload_too_large"
    assert client.get("/api/chats", headers=ALICE).get_json() == {"chats": []}


def test_an_imported_reply_keeps_its_model(client: FlaskClient) -> None:
    """The page's own chats carry each reply's model (issue 56): imported with it, checked as
    POST /chat checks a model's name; only a reply has one."""
    messages = [
        {"role": "user", "content": "Hi", "model": "ignored"},
        {"role": "assistant", "content": "Hello.", "model": "smollm2"},
        {"role": "user", "content": "Again"},
        {"role": "assistant", "content": "Hello again."},
    ]
    made = client.post("/api/chats", json={"messages": messages}, headers=ALICE)
    assert made.status_code == 201, made.get_json()
    assert [m.get("model") for m in made.get_json()["messages"]] == [None, "smollm2", None, None]
    messages[1]["model"] = "two words"
    refused = client.post("/api/chats", json={"messages": messages}, headers=ALICE)
    assert refused.status_code == 400
    assert refused.get_json()["error"]["message"] == (
        "Message 2: model must be 1 to 256 characters without spaces or control characters."
    )


def test_the_default_bound_is_megabytes(make_app: Callable[..., Flask]) -> None:
    app = make_app()
    assert app.config["MAX_IMPORT_BYTES"] == 8 * 1024 * 1024
    assert app.config["MAX_IMPORT_BYTES"] > app.config["MAX_CONTENT_LENGTH"]


def test_through_gunicorn_a_long_import_arrives_and_a_larger_one_is_refused(
    tmp_path: Path,
) -> None:
    database = f"sqlite:///{tmp_path / 'chats.db'}"
    with services.chatapp(
        "http://127.0.0.1:9",  # no model service: an import does not need one
        tmp_path / "chatapp.log",
        AUTH_MODE="appservice",
        DATABASE_URL=database,
        MAX_IMPORT_BYTES="3000000",
    ) as app:
        made = httpx.post(
            f"{app.url}/api/chats", json=long_chat(1000), headers=ALICE, timeout=60
        )  # about 2 MB of text
        assert made.status_code == 201, made.text[:300]
        assert len(made.json()["messages"]) == 2000
        refused = httpx.post(
            f"{app.url}/api/chats", json=long_chat(1000, 1600), headers=ALICE, timeout=60
        )  # about 3.2 MB
        assert refused.status_code == 413
        assert refused.json()["error"]["type"] == "payload_too_large"
        listed = httpx.get(f"{app.url}/api/chats", headers=ALICE).json()["chats"]
        assert len(listed) == 1
