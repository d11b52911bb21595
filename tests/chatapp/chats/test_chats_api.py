"""The chats HTTP contract, per user: list, make, import, open, rename, delete, search; user A
never reads, renames, deletes or searches user B's chats (404 on every route, never 403)."""

from __future__ import annotations

import base64
from collections.abc import Callable

import pytest
from flask import Flask
from flask.testing import FlaskClient

ALICE = {"X-MS-CLIENT-PRINCIPAL-ID": "alice-oid", "X-MS-CLIENT-PRINCIPAL-NAME": "Alice"}
BOB = {"X-MS-CLIENT-PRINCIPAL-ID": "bob-oid", "X-MS-CLIENT-PRINCIPAL-NAME": "Bob"}
PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 32).decode()


@pytest.fixture
def client(make_app: Callable[..., Flask], database_url: str) -> FlaskClient:
    return make_app(DATABASE_URL=database_url, AUTH_MODE="appservice").test_client()


def _make(client: FlaskClient, headers: dict[str, str], **body: object) -> str:
    response = client.post("/api/chats", json=body, headers=headers)
    assert response.status_code == 201, response.get_json()
    chat_id: str = response.get_json()["id"]
    return chat_id


def test_a_chat_is_made_listed_opened_renamed_and_deleted(client: FlaskClient) -> None:
    made = client.post("/api/chats", json={"title": "  First\n chat "}, headers=ALICE)
    assert made.status_code == 201
    chat = made.get_json()
    assert chat["title"] == "First chat" and chat["messages"] == []
    assert made.headers["Location"] == f"/api/chats/{chat['id']}"
    assert made.headers["Cache-Control"] == "no-store"
    second = _make(client, ALICE)
    listed = client.get("/api/chats", headers=ALICE).get_json()["chats"]
    assert [c["id"] for c in listed] == [second, chat["id"]]  # newest first
    assert set(listed[0]) == {"id", "title", "created_at", "updated_at"}
    renamed = client.patch(f"/api/chats/{chat['id']}", json={"title": "Renamed"}, headers=ALICE)
    assert renamed.status_code == 200 and renamed.get_json()["title"] == "Renamed"
    listed = client.get("/api/chats", headers=ALICE).get_json()["chats"]
    assert [c["id"] for c in listed] == [chat["id"], second]  # a rename is an update
    assert client.get(f"/api/chats/{chat['id']}", headers=ALICE).get_json()["title"] == "Renamed"
    deleted = client.delete(f"/api/chats/{chat['id']}", headers=ALICE)
    assert deleted.status_code == 204 and deleted.data == b""
    assert client.get(f"/api/chats/{chat['id']}", headers=ALICE).status_code == 404
    assert client.delete(f"/api/chats/{chat['id']}", headers=ALICE).status_code == 404


def test_an_imported_chat_keeps_its_messages_images_and_times(client: FlaskClient) -> None:
    body = {
        "messages": [
            {
                "role": "user",
                "content": "What is in this picture?",
                "images": [PNG],
                "created_at": 1700000000000,
            },
            {
                "role": "assistant",
                "content": "A very small\x1b square.",
                "finish": "length",
                "created_at": "2023-11-14T22:13:21Z",
            },
        ],
        "updated_at": 1700000001000,
    }
    made = client.post("/api/chats", json=body, headers=ALICE)
    assert made.status_code == 201, made.get_json()
    chat = client.get(f"/api/chats/{made.get_json()['id']}", headers=ALICE).get_json()
    assert chat["title"] == "What is in this picture?"  # from its first message
    assert chat["updated_at"] == "2023-11-14T22:13:21.000Z"
    user, reply = chat["messages"]
    assert user == {
        "role": "user",
        "content": "What is in this picture?",
        "images": [PNG],
        "created_at": "2023-11-14T22:13:20.000Z",
    }
    assert reply["content"] == "A very small\u241b square."  # made visible, as replies are
    assert reply["finish"] == "length"


def test_an_import_takes_images_larger_than_the_text_bound(
    make_app: Callable[..., Flask], database_url: str
) -> None:
    """An image of 300 KB (the text of an import keeps MAX_IMPORT_BYTES, here 64 KiB; images
    have room of their own, as in POST /chat)."""
    client = make_app(
        DATABASE_URL=database_url, AUTH_MODE="appservice", MAX_IMPORT_BYTES=64 * 1024
    ).test_client()
    big = (
        "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(300_000)).decode()
    )
    body = {"messages": [{"role": "user", "content": "look", "images": [big]}]}
    made = client.post("/api/chats", json=body, headers=ALICE)
    assert made.status_code == 201, made.get_json()
    assert made.get_json()["messages"][0]["images"] == [big]
    too_much_text = {"messages": [{"role": "user", "content": "x" * 70_000, "images": [big]}]}
    refused = client.post("/api/chats", json=too_much_text, headers=ALICE)
    assert refused.status_code == 413
    assert refused.get_json()["error"]["type"] == "payload_too_large"


@pytest.mark.parametrize(
    ("body", "status", "type"),
    [
        ({"messages": [{"role": "robot", "content": "x"}]}, 400, "invalid_request"),
        ({"messages": [{"role": "user", "content": "a\x00b"}]}, 400, "invalid_request"),
        (
            {"messages": [{"role": "assistant", "content": "x", "images": [PNG]}]},
            400,
            "invalid_image",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "images": ["https://x/y.png"]}]},
            400,
            "invalid_image",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "images": [PNG] * 5}]},
            413,
            "payload_too_large",
        ),
        ({"title": 7}, 400, "invalid_request"),
        ({"created_at": "yesterday"}, 400, "invalid_request"),
        ([], 400, "invalid_request"),
    ],
)
def test_a_bad_import_is_refused_with_a_sentence(
    client: FlaskClient, body: object, status: int, type: str
) -> None:
    response = client.post("/api/chats", json=body, headers=ALICE)
    assert response.status_code == status
    assert response.get_json()["error"]["type"] == type
    assert client.get("/api/chats", headers=ALICE).get_json() == {"chats": []}


def test_bad_requests_get_the_envelope(client: FlaskClient) -> None:
    chat = _make(client, ALICE)
    assert client.post("/api/chats", data="x", headers=ALICE).status_code == 415
    bad_json = client.post(
        "/api/chats", data="{", headers={**ALICE, "Content-Type": "application/json"}
    )
    assert bad_json.status_code == 400 and bad_json.get_json()["error"]["type"] == "invalid_request"
    assert client.patch(f"/api/chats/{chat}", json={}, headers=ALICE).status_code == 400
    assert client.get("/api/chats?limit=x", headers=ALICE).status_code == 400
    assert client.get("/api/chats?limit=0", headers=ALICE).status_code == 400
    assert client.put(f"/api/chats/{chat}", json={}, headers=ALICE).status_code == 405


def test_search_finds_the_users_own_chats_by_title_and_text(client: FlaskClient) -> None:
    soup = _make(client, ALICE, messages=[{"role": "user", "content": "Onion soup, please"}])
    _make(client, ALICE, title="Taxes")
    _make(client, BOB, messages=[{"role": "user", "content": "Onion soup for Bob"}])
    found = client.get("/api/chats?q=onion", headers=ALICE).get_json()["chats"]
    assert [c["id"] for c in found] == [soup]
    assert len(client.get("/api/chats?q=tax", headers=ALICE).get_json()["chats"]) == 1
    assert client.get("/api/chats?q=%22%29%28*", headers=ALICE).get_json() == {"chats": []}


def test_user_a_never_reaches_user_bs_chats(client: FlaskClient) -> None:
    bobs = _make(client, BOB, messages=[{"role": "user", "content": "Bob's walrus secret"}])
    alices = _make(client, ALICE, title="Alice's")
    for response in [
        client.get(f"/api/chats/{bobs}", headers=ALICE),
        client.patch(f"/api/chats/{bobs}", json={"title": "taken"}, headers=ALICE),
        client.delete(f"/api/chats/{bobs}", headers=ALICE),
        client.get("/api/chats/no-such-chat", headers=ALICE),
    ]:
        assert response.status_code == 404
        assert response.get_json()["error"] == {
            "message": "There is no such chat.",
            "type": "not_found",
        }
    assert [c["id"] for c in client.get("/api/chats", headers=ALICE).get_json()["chats"]] == [
        alices
    ]
    assert client.get("/api/chats?q=walrus", headers=ALICE).get_json() == {"chats": []}
    # Bob's chat is untouched.
    bob_sees = client.get(f"/api/chats/{bobs}", headers=BOB).get_json()
    assert bob_sees["title"] == "Bob's walrus secret"
    assert [m["content"] for m in bob_sees["messages"]] == ["Bob's walrus secret"]


def test_each_request_logs_one_line_without_ids_or_text(
    client: FlaskClient, caplog: pytest.LogCaptureFixture
) -> None:
    chat = _make(client, ALICE, title="Secret plans")
    caplog.clear()
    with caplog.at_level("INFO", logger="chatapp.request"):
        client.get("/api/chats?q=walrus", headers=ALICE)
        client.get(f"/api/chats/{chat}", headers=BOB)
    lines = [r for r in caplog.records if r.name == "chatapp.request"]
    fields = [r.fields for r in lines]  # type: ignore[attr-defined]
    assert [(f["method"], f["route"], f["status"]) for f in fields] == [
        ("GET", "/api/chats", 200),
        ("GET", "/api/chats/<chat_id>", 404),
    ]
    assert fields[1]["error"] == "not_found" and fields[0]["duration_ms"] >= 0
    logged = " ".join(r.getMessage() + str(r.fields) for r in lines)  # type: ignore[attr-defined]
    assert chat not in logged and "walrus" not in logged and "Secret" not in logged
