"""`DELETE /api/chats/<id>/messages?from=N&length=M`: a stored chat cut back to one of the
person's messages (the page's edit and regenerate), on each engine; a stale view is a 409 and
cuts nothing, a bad position a 400, another user's chat a 404; the next `POST /chat` goes on
from the cut."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.chatapp import fake_sidecar as fs
from tests.chatapp.fake_sidecar import FakeSidecar

ALICE = {"X-MS-CLIENT-PRINCIPAL-ID": "alice-oid"}
BOB = {"X-MS-CLIENT-PRINCIPAL-ID": "bob-oid"}
TURNS = [
    {"role": "user", "content": "one"},
    {"role": "assistant", "content": "reply one", "finish": "stop"},
    {"role": "user", "content": "two"},
    {"role": "assistant", "content": "reply two", "finish": "stop"},
    {"role": "user", "content": "three"},
    {"role": "assistant", "content": "reply three", "finish": "length"},
]


@pytest.fixture
def client(make_app: Callable[..., Flask], database_url: str) -> FlaskClient:
    return make_app(DATABASE_URL=database_url, AUTH_MODE="appservice").test_client()


def _chat(client: FlaskClient, headers: dict[str, str] = ALICE) -> str:
    made = client.post("/api/chats", json={"messages": TURNS}, headers=headers)
    assert made.status_code == 201, made.get_json()
    chat_id: str = made.get_json()["id"]
    return chat_id


def _contents(client: FlaskClient, chat_id: str, headers: dict[str, str] = ALICE) -> list[str]:
    chat = client.get(f"/api/chats/{chat_id}", headers=headers).get_json()
    return [m["content"] for m in chat["messages"]]


def test_a_chat_is_cut_back_to_one_of_the_persons_messages(client: FlaskClient) -> None:
    chat_id = _chat(client)
    before = client.get(f"/api/chats/{chat_id}", headers=ALICE).get_json()["updated_at"]
    cut = client.delete(f"/api/chats/{chat_id}/messages?from=2&length=6", headers=ALICE)
    assert cut.status_code == 204 and cut.data == b""
    assert cut.headers["Cache-Control"] == "no-store"
    assert _contents(client, chat_id) == ["one", "reply one"]
    assert client.get(f"/api/chats/{chat_id}", headers=ALICE).get_json()["updated_at"] >= before
    # Cut to nothing at all, then nothing more to cut (from == length).
    assert (
        client.delete(f"/api/chats/{chat_id}/messages?from=0&length=2", headers=ALICE).status_code
        == 204
    )
    assert _contents(client, chat_id) == []
    assert (
        client.delete(f"/api/chats/{chat_id}/messages?from=0&length=0", headers=ALICE).status_code
        == 204
    )


def test_a_search_no_longer_finds_what_was_cut(client: FlaskClient) -> None:
    chat_id = _chat(client)
    assert len(client.get("/api/chats?q=three", headers=ALICE).get_json()["chats"]) == 1
    assert (
        client.delete(f"/api/chats/{chat_id}/messages?from=4&length=6", headers=ALICE).status_code
        == 204
    )
    assert client.get("/api/chats?q=three", headers=ALICE).get_json() == {"chats": []}


def test_a_stale_view_is_a_conflict_and_cuts_nothing(client: FlaskClient) -> None:
    chat_id = _chat(client)
    for length in (4, 8):  # the page saw fewer (a turn stored since) or more (cut elsewhere)
        stale = client.delete(
            f"/api/chats/{chat_id}/messages?from=2&length={length}", headers=ALICE
        )
        assert stale.status_code == 409
        assert stale.get_json()["error"]["type"] == "conflict"
    assert len(_contents(client, chat_id)) == 6


@pytest.mark.parametrize(
    "query",
    [
        "",
        "?from=2",
        "?length=6",
        "?from=-1&length=6",
        "?from=x&length=6",
        "?from=2&length=6.0",
        "?from=7&length=6",
        "?from=99999999999&length=6",
        "?from=1&length=6",  # a reply, not the person's message
        "?from=5&length=6",
    ],
)
def test_a_bad_position_is_refused_with_a_sentence(client: FlaskClient, query: str) -> None:
    chat_id = _chat(client)
    refused = client.delete(f"/api/chats/{chat_id}/messages{query}", headers=ALICE)
    assert refused.status_code == 400
    error = refused.get_json()["error"]
    assert error["type"] == "invalid_request" and error["message"].endswith(".")
    assert len(_contents(client, chat_id)) == 6


def test_another_user_can_never_cut_someones_chat(client: FlaskClient) -> None:
    alices = _chat(client)
    for headers, chat_id in [(BOB, alices), (ALICE, "no-such-chat")]:
        refused = client.delete(f"/api/chats/{chat_id}/messages?from=0&length=6", headers=headers)
        assert refused.status_code == 404
        assert refused.get_json()["error"] == {
            "message": "There is no such chat.",
            "type": "not_found",
        }
    assert client.delete(f"/api/chats/{alices}/messages?from=0&length=6").status_code == 401
    assert len(_contents(client, alices)) == 6


def test_a_cut_from_another_site_is_refused(client: FlaskClient) -> None:
    chat_id = _chat(client)
    refused = client.delete(
        f"/api/chats/{chat_id}/messages?from=0&length=6",
        headers={**ALICE, "Sec-Fetch-Site": "cross-site"},
    )
    assert refused.status_code == 403
    assert len(_contents(client, chat_id)) == 6


def test_the_next_turn_goes_on_from_the_cut(client: FlaskClient, fake: FakeSidecar) -> None:
    """Regenerate as the page does it: cut at the last question, send it again with the chat's
    id; the prompt holds only what is left, and the chat the new turn."""
    chat_id = _chat(client)
    fake.predict = lambda h: fs.reply(h, ["a new ", "reply"])
    assert (
        client.delete(f"/api/chats/{chat_id}/messages?from=4&length=6", headers=ALICE).status_code
        == 204
    )
    response = client.post(
        "/chat",
        json={"chat_id": chat_id, "messages": [{"role": "user", "content": "three, again"}]},
        headers=ALICE,
    )
    assert response.status_code == 200
    response.get_data()
    response.close()  # as a server closes it: the turn is stored
    sent = json.loads(fake.raw_bodies[-1])
    assert [m["content"] for m in sent["messages"]] == [
        "one",
        "reply one",
        "two",
        "reply two",
        "three, again",
    ]
    assert _contents(client, chat_id) == [
        "one",
        "reply one",
        "two",
        "reply two",
        "three, again",
        "a new reply",
    ]


def test_a_turn_is_stored_before_its_done_line_so_a_cut_right_after_it_is_not_stale(
    client: FlaskClient, fake: FakeSidecar
) -> None:
    """The page regenerates as soon as it reads the done line: the turn must be in the chat by
    then (not only once the server closes the response), or the cut would be a 409."""
    chat_id = _chat(client)
    fake.predict = lambda h: fs.reply(h, ["four"])
    ask = {"chat_id": chat_id, "messages": [{"role": "user", "content": "four?"}]}
    response = client.post("/chat", json=ask, headers=ALICE)
    try:
        lines = [json.loads(line) for line in response.get_data().splitlines()]
        assert lines[-1]["done"] is True  # read to its end, not closed yet
        assert _contents(client, chat_id)[-2:] == ["four?", "four"]
        cut = client.delete(f"/api/chats/{chat_id}/messages?from=6&length=8", headers=ALICE)
        assert cut.status_code == 204
    finally:
        response.close()
    assert len(_contents(client, chat_id)) == 6  # closing stored nothing more
