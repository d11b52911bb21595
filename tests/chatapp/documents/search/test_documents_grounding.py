"""Grounded turns: passages numbered into the turn that asked, citations checked against them,
an honest turn when nothing matches, and a follow-up read from the conversation cache; through
the app, a real sidecar (tiny chat model, tiny encoder) and both engines."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from chatapp import create_app
from chatapp.documents.search import grounding
from chatapp.documents.search.grounding import (
    CHAT_TOKENS_PER_ENCODER_TOKEN,
    INSTRUCTION,
    MIN_LEARNING_TOKENS,
    NOTHING_FOUND,
    RATIO_BOUNDS,
    ChatTokenRatio,
    Grounding,
    learn_from,
    with_block,
)
from chatapp.documents.search.retrieval import Passage
from chatapp.observability.logs import JsonFormatter
from scripts.run.services import Service

FILES = Path(__file__).parents[1] / "files"


def passage(n: int) -> Passage:
    return Passage(n, 100 + n, f"doc{n}.pdf", f"text {n}", "", n, 5, 0.5)


def test_a_reply_citing_9_of_4_passages_links_only_what_exists() -> None:
    grounding = Grounding([passage(n) for n in range(1, 5)], "block")
    fields = grounding.done_fields("Descale monthly [2]. Never [9]. Also [4].")
    assert fields["citations"] == [
        {"n": 2, "document_id": 102, "name": "doc2.pdf", "page": 2, "text": "text 2"},
        {"n": 4, "document_id": 104, "name": "doc4.pdf", "page": 4, "text": "text 4"},
    ]
    assert fields["unknown_citations"] == [9]
    assert fields["grounding"] == "block"


def test_the_block_goes_before_the_question_in_text_and_in_parts() -> None:
    assert with_block("Why?", "B") == "B\n\nQuestion: Why?"
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    assert with_block([image], "B") == [{"type": "text", "text": "B\n\nQuestion:"}, image]


class Words:
    """A stand-in encoder count: one token a word."""

    def count(self, text: str) -> int:
        return len(text.split())


def test_the_ratio_starts_at_the_assumption_and_learns_from_usage() -> None:
    ratio = ChatTokenRatio()
    assert ratio.value == CHAT_TOKENS_PER_ENCODER_TOKEN and ratio.readings == 0
    ratio.observe(chat_tokens=50, encoder_tokens=MIN_LEARNING_TOKENS - 1)  # too short to tell
    assert ratio.readings == 0
    ratio.observe(chat_tokens=320, encoder_tokens=200)
    assert ratio.value == 1.6  # the first reading replaces the assumption
    ratio.observe(chat_tokens=240, encoder_tokens=200)
    assert ratio.value == pytest.approx(1.4)  # later ones are averaged in
    ratio.observe(chat_tokens=10_000, encoder_tokens=200)
    assert ratio.value == pytest.approx((1.4 + RATIO_BOUNDS[1]) / 2)  # a wild reading is clipped


def test_nothing_is_learned_from_images_or_a_shortened_prompt() -> None:
    ratio = ChatTokenRatio()
    text = " ".join(["word"] * 300)
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    with_image = [{"role": "user", "content": [{"type": "text", "text": text}, image]}]
    learn_from(ratio, Words(), with_image, 900, None)
    learn_from(ratio, Words(), [{"role": "user", "content": text}], 900, 1)  # a turn dropped
    learn_from(ratio, Words(), [{"role": "user", "content": text}], None, None)  # no usage
    assert ratio.readings == 0
    learn_from(ratio, Words(), [{"role": "user", "content": text}], 900, 0)
    assert ratio.value == 3.0


@pytest.fixture
def client(
    database_url: str, encoder_sidecar: Service, tiny_encoder_dir: Path
) -> Iterator[FlaskClient]:
    app: Flask = create_app(
        {
            "TESTING": True,
            "DATABASE_URL": database_url,
            "SIDECAR_URL": encoder_sidecar.url,
            "EMBED_MODEL": "tiny",
            "EMBED_TOKENIZER": str(tiny_encoder_dir),
            "EMBED_MAX_TOKENS": 32,
            "DOCUMENT_SEARCH": "fusion",
            "DOCUMENT_CONTEXT_TOKENS": 150,
        }
    )
    yield app.test_client()
    app.extensions["documents"].close()
    app.extensions["store"].close()


def add_ready_guide(client: FlaskClient, headers: dict[str, str] | None = None) -> None:
    """Uploads the fixture guide.md and waits (at most 120 s) until it is indexed."""
    added = client.post(
        "/api/documents",
        data={"file": [(io.BytesIO((FILES / "guide.md").read_bytes()), "guide.md")]},
        content_type="multipart/form-data",
        headers=headers,
    )
    assert added.status_code == 202
    deadline = time.monotonic() + 120
    while (
        client.get("/api/documents", headers=headers).get_json()["documents"][0]["status"]
        != "ready"
    ):
        assert time.monotonic() < deadline
        time.sleep(0.1)


def chat(
    client: FlaskClient, messages: list[dict[str, Any]], documents: bool = True
) -> dict[str, Any]:
    response = client.post(
        "/chat",
        json={
            "messages": messages,
            "documents": documents,
            "conversation_id": "grounded-1" if documents else "bare-1",
            "max_new_tokens": 8,
        },
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    lines = [json.loads(line) for line in response.get_data(as_text=True).splitlines()]
    response.close()  # as a WSGI server closes it: the chat's line is logged
    done = lines[-1]
    assert done.get("done") is True, lines[-1]
    done["text"] = "".join(line.get("delta", "") for line in lines)
    if documents:  # the sources first of all, before the model said anything (issue 54)
        assert "sources" in lines[0], lines[0]
        done["sources"] = lines[0]["sources"]
    else:
        assert not any("sources" in line for line in lines)
    return done


def test_a_grounded_turn_and_its_follow_up(client: FlaskClient) -> None:
    add_ready_guide(client)
    question = "How long does the warranty last?"
    first = chat(client, [{"role": "user", "content": question}])
    block = first["grounding"]
    assert block.startswith("Passages from my documents:") and "[1] guide.md" in block
    assert "The warranty lasts" in block
    assert isinstance(first["citations"], list) and isinstance(first["unknown_citations"], list)
    sources = first["sources"]
    assert [source["n"] for source in sources] == list(range(1, len(sources) + 1))
    assert {source["name"] for source in sources} == {"guide.md"}
    assert all(set(source) == {"n", "name", "page", "document_id"} for source in sources)
    assert len(sources) == block.count("] guide.md")
    for cited in first["citations"]:  # each cited passage is one of the sources listed first
        assert {k: cited[k] for k in ("n", "name", "page", "document_id")} in sources
    # The follow-up sends the first turn back with its block: its prompt starts as the first's.
    follow = chat(
        client,
        [
            {"role": "user", "content": question, "grounding": block},
            {"role": "assistant", "content": first["text"]},
            {"role": "user", "content": "And the descaling?"},
        ],
    )
    assert follow["cached_tokens"] > 0
    assert follow["grounding"] != block


class Kept(logging.Handler):
    """Keeps the records it is given."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_the_chat_line_says_what_grounding_took(client: FlaskClient) -> None:
    add_ready_guide(client)
    handler = Kept()
    request_log = logging.getLogger("chatapp.request")
    request_log.addHandler(handler)
    level = request_log.level
    request_log.setLevel(logging.INFO)
    try:
        done = chat(client, [{"role": "user", "content": "How long does the warranty last?"}])
    finally:
        request_log.removeHandler(handler)
        request_log.setLevel(level)
    (line,) = [json.loads(JsonFormatter().format(record)) for record in handler.records]
    assert line["passages"] == done["grounding"].count("\n[") >= 1
    assert 0 < line["grounding_ms"] <= line["ttft_ms"]  # the search is part of the wait


def bare_prompt_tokens(client: FlaskClient, text: str) -> int:
    return int(chat(client, [{"role": "user", "content": text}], documents=False)["prompt_tokens"])


def test_the_passages_budget_learns_the_chat_models_tokens(client: FlaskClient) -> None:
    """After one grounded turn the app knows how many of the chat model's tokens its own count
    of the prompt made (the model service's usage), and the next turn's passages fit
    DOCUMENT_CONTEXT_TOKENS (150) in the chat model's own tokens."""
    add_ready_guide(client)
    assert isinstance(client.application, Flask)
    documents = client.application.extensions["documents"]
    assert documents.chat_tokens.readings == 0
    question = "How long does the warranty last?"
    first = chat(client, [{"role": "user", "content": question}])
    sent = with_block(question, first["grounding"])
    assert isinstance(sent, str)
    units = documents.searcher.sizing.count(sent)
    assert documents.chat_tokens.readings == 1
    assert documents.chat_tokens.value == pytest.approx(first["prompt_tokens"] / units)
    second = chat(client, [{"role": "user", "content": "And the descaling?"}])
    # Every passage given (not only those the reply cited): each "[n] where" line's text
    block = second["grounding"].removesuffix(INSTRUCTION)
    texts = [part.split("\n", 1)[1] for part in block.split("\n\n[")[1:]]
    passages = bare_prompt_tokens(client, "\n".join(texts)) - bare_prompt_tokens(client, "x")
    assert 0 < passages <= 150 * 1.1  # the estimate's error: the ratio is the whole prompt's


def test_a_failure_to_learn_from_usage_never_touches_the_reply(
    client: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_ready_guide(client)

    def broken(*args: Any) -> None:
        raise RuntimeError("no")

    monkeypatch.setattr(grounding, "learn_from", broken)
    done = chat(client, [{"role": "user", "content": "How long does the warranty last?"}])
    assert done["finish_reason"] and done["grounding"].startswith("Passages from my documents:")


def test_nothing_relevant_is_said_plainly(client: FlaskClient) -> None:
    done = chat(client, [{"role": "user", "content": "zebra quantum?"}])  # an empty library
    assert done["grounding"] == NOTHING_FOUND
    assert done["citations"] == [] and done["unknown_citations"] == []
    assert done["sources"] == []


def test_a_grounding_with_control_characters_is_refused(client: FlaskClient) -> None:
    response = client.post(
        "/chat",
        json={
            "messages": [
                {"role": "user", "content": "q", "grounding": "bad\x00"},
                {"role": "assistant", "content": "a"},
                {"role": "user", "content": "again"},
            ]
        },
    )
    assert response.status_code == 400


ALICE = {"X-MS-CLIENT-PRINCIPAL-ID": "alice-oid", "X-MS-CLIENT-PRINCIPAL-NAME": "Alice"}
BOB = {"X-MS-CLIENT-PRINCIPAL-ID": "bob-oid", "X-MS-CLIENT-PRINCIPAL-NAME": "Bob"}


@pytest.fixture
def signed_in(
    database_url: str, encoder_sidecar: Service, tiny_encoder_dir: Path
) -> Iterator[FlaskClient]:
    """The app under App Service's sign-in (AUTH_MODE=appservice), as the accounts tests run it."""
    app: Flask = create_app(
        {
            "TESTING": True,
            "DATABASE_URL": database_url,
            "SIDECAR_URL": encoder_sidecar.url,
            "EMBED_MODEL": "tiny",
            "EMBED_TOKENIZER": str(tiny_encoder_dir),
            "EMBED_MAX_TOKENS": 32,
            "DOCUMENT_SEARCH": "fusion",
            "DOCUMENT_CONTEXT_TOKENS": 150,
            "AUTH_MODE": "appservice",
        }
    )
    yield app.test_client()
    app.extensions["documents"].close()
    app.extensions["store"].close()


def stored_turn(client: FlaskClient, headers: dict[str, str], **body: Any) -> dict[str, Any]:
    """A stored chat's turn's done line, with the first line's `sources` when grounded; the
    response is closed, as a server closes it (the turn is stored)."""
    response = client.post("/chat", json={"max_new_tokens": 8, **body}, headers=headers)
    try:
        assert response.status_code == 200, response.get_data(as_text=True)
        lines = [json.loads(line) for line in response.get_data(as_text=True).splitlines()]
    finally:
        response.close()
    assert lines[-1].get("done") is True, lines[-1]
    done = dict(lines[-1])
    if "sources" in lines[0]:
        done["sources"] = lines[0]["sources"]
    return done


def test_a_stored_chat_keeps_its_grounding_citations_and_sources_per_user(
    signed_in: FlaskClient,
) -> None:
    add_ready_guide(signed_in, ALICE)
    chat_id = signed_in.post("/api/chats", json={}, headers=ALICE).get_json()["id"]
    question = {"role": "user", "content": "How long does the warranty last?"}
    first = stored_turn(signed_in, ALICE, chat_id=chat_id, messages=[question], documents=True)
    assert "The warranty lasts" in first["grounding"]
    assert first["sources"] and {s["name"] for s in first["sources"]} == {"guide.md"}
    stored = signed_in.get(f"/api/chats/{chat_id}", headers=ALICE).get_json()["messages"]
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert stored[0]["content"] == question["content"]  # the question as asked, no passages
    assert stored[1]["citations"] == first["citations"]  # what the done line said, kept
    # Every source the first line listed, cited or not.
    assert stored[1]["sources"] == first["sources"] and "sources" not in stored[0]
    # The follow-up (not grounded itself) is built from the stored turns, the first with the
    # passages it was sent with: its prompt holds all of the first's, read from the cache.
    follow = stored_turn(
        signed_in, ALICE, chat_id=chat_id, messages=[{"role": "user", "content": "And?"}]
    )
    assert follow["prompt_tokens"] > first["prompt_tokens"]
    assert follow["cached_tokens"] > 0
    stored = signed_in.get(f"/api/chats/{chat_id}", headers=ALICE).get_json()["messages"]
    assert ["sources" in m for m in stored] == [False, True, False, False]
    # Bob's grounded chat reaches none of Alice's passages, nor her chat; it keeps that
    # nothing matched (the page says so under the reply).
    bobs = signed_in.post("/api/chats", json={}, headers=BOB).get_json()["id"]
    his = stored_turn(signed_in, BOB, chat_id=bobs, messages=[question], documents=True)
    assert his["grounding"] == NOTHING_FOUND and his["citations"] == []
    assert his["sources"] == []
    his_stored = signed_in.get(f"/api/chats/{bobs}", headers=BOB).get_json()["messages"]
    assert his_stored[1]["sources"] == [] and his_stored[1]["citations"] == []
    refused = signed_in.post(
        "/chat", json={"chat_id": chat_id, "messages": [question], "documents": True}, headers=BOB
    )
    assert refused.status_code == 404


def test_a_stored_chats_earlier_turns_leave_room_for_the_new_passages(
    signed_in: FlaskClient,
) -> None:
    """The stored turns that go before a grounded question are chosen with its passages
    counted: a chat whose stored turns just fit beside the bare question keeps fewer of them,
    so the request to the model service stays within MAX_REQUEST_BYTES (the real sidecar's own
    limit, 64 KiB by default, refuses anything larger)."""
    from chatapp.chats.turns import MESSAGE_OVERHEAD
    from chatapp.store import chats
    from chatapp.store.users import ensure_user

    add_ready_guide(signed_in, ALICE)
    chat_id = signed_in.post("/api/chats", json={}, headers=ALICE).get_json()["id"]
    question = "How long does the warranty last?"
    app = signed_in.application
    # Sixteen stored messages that fill the request beside the bare question to 20 bytes of
    # fit's own margin: all of them fit without the passages, not with them.
    room = app.config["MAX_CONTENT_LENGTH"] - (len(question) + MESSAGE_OVERHEAD) - 200 - 20
    each = room // 16 - MESSAGE_OVERHEAD
    sizes = [each] * 15 + [room - 15 * (each + MESSAGE_OVERHEAD) - MESSAGE_OVERHEAD]
    store = app.extensions["store"]
    with store.session(write=True) as session:
        owner = ensure_user(session, "appservice:alice-oid").id
        earlier = [
            chats.NewMessage(("user", "assistant")[n % 2], (f"turn {n} " + "x" * size)[:size])
            for n, size in enumerate(sizes)
        ]
        assert chats.append_messages(session, owner, chat_id, earlier) is not None
    grounded = stored_turn(
        signed_in,
        ALICE,
        chat_id=chat_id,
        messages=[{"role": "user", "content": question}],
        documents=True,
    )
    assert "The warranty lasts" in grounded["grounding"]
    stored = signed_in.get(f"/api/chats/{chat_id}", headers=ALICE).get_json()["messages"]
    assert len(stored) == 18 and stored[16]["content"] == question


def test_a_browsers_long_conversation_leaves_room_for_the_new_passages(
    client: FlaskClient,
) -> None:
    """A conversation the page sends whole, just within MAX_REQUEST_BYTES: with the question's
    passages added the oldest turns are left out (as the page leaves them out itself), so the
    model service gets a request within its bound instead of refusing it 413."""
    add_ready_guide(client)
    question = "How long does the warranty last?"
    # Sixteen earlier messages: with the question, a body (as compact JSON) 100 bytes under
    # the bound; the passages are more than that.
    limit = client.application.config["MAX_CONTENT_LENGTH"]

    def conversation(size: int) -> list[dict[str, Any]]:
        earlier = [
            {"role": ("user", "assistant")[n % 2], "content": (f"turn {n} " + "x" * size)[:size]}
            for n in range(16)
        ]
        return [*earlier, {"role": "user", "content": question}]

    def body_bytes(messages: list[dict[str, Any]]) -> int:
        body = {"messages": messages, "documents": True, "conversation_id": "grounded-1"}
        return len(json.dumps({**body, "max_new_tokens": 8}, separators=(",", ":")))

    size = 1
    while body_bytes(conversation(size + 1)) <= limit - 100:
        size += 1 if body_bytes(conversation(size + 64)) > limit - 100 else 64
    messages = conversation(size)
    done = chat(client, messages)
    assert "The warranty lasts" in done["grounding"]
