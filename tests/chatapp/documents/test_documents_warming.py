"""PASSAGE_WARM (chatapp/documents/warming.py): each passage sent as the first question of a
chat would have it as its best one, the library newest documents first, per owner; and against
a real sidecar on the tiny model, the grounded question the relay builds finds the warmed
passage read (`passage_cached_tokens`)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import secrets
import time
from typing import Any

import httpx
import pytest

from chatapp import settings
from chatapp.documents.models import Chunk, Document
from chatapp.documents.search.grounding import block_of, with_block
from chatapp.documents.search.retrieval import Passage
from chatapp.documents.warming import Warmer, library_scope, newest_passages, warm_item
from chatapp.store import Store
from scripts.run.services import Service
from tests.sidecar.support import passages_read

TEXTS = [
    "The kettle boils a litre of water in three minutes; descale it once a month. " * 3,
    "The warranty lasts twenty-four months from the date on the receipt, parts included. " * 3,
    "Green tea wants water at eighty degrees, black tea boiling water, for three minutes. " * 3,
]


def passage(n: int, name: str = "kettle.pdf") -> Passage:
    return Passage(n, 1, name, TEXTS[n], "Care", n + 1, 60, 0.0)


def test_a_warmed_prompt_is_a_first_questions_prompt_up_to_its_best_passage() -> None:
    best, other = passage(0), passage(1)
    warmed = warm_item(best)
    (message,) = warmed["messages"]
    assert message["role"] == "user" and warmed["passages"] == [best.text]
    asked = with_block("How long does the kettle take?", block_of([best, other]))
    assert isinstance(asked, str)
    end = message["content"].index(best.text) + len(best.text)
    assert asked[:end] == message["content"][:end]


def add_document(store: Store, owner: int, name: str, age_s: int, status: str = "ready") -> int:
    created = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=age_s)
    with store.session(write=True) as session:
        document = Document(
            owner_id=owner,
            name=name,
            content_hash=secrets.token_hex(32),
            mime="text/plain",
            size=100,
            status=status,
            created_at=created,
        )
        session.add(document)
        session.flush()
        for ordinal, text in enumerate(TEXTS):
            session.add(
                Chunk(
                    document_id=document.id,
                    owner_id=owner,
                    ordinal=ordinal,
                    text=text,
                    heading="",
                    page=None,
                    tokens=60,
                )
            )
        return document.id


@pytest.mark.parametrize("database_url", ["sqlite", "postgresql"], indirect=True)
def test_the_library_comes_newest_documents_first_ready_ones_only(
    store: Store, owners: tuple[int, int]
) -> None:
    alice, bob = owners
    old = add_document(store, alice, "old.txt", 600)
    new = add_document(store, bob, "new.txt", 60)
    add_document(store, alice, "reading.txt", 0, status="reading")
    found = newest_passages(store, 100)
    assert [(owner, p.document_id, p.text) for owner, p in found] == [
        *((bob, new, text) for text in TEXTS),
        *((alice, old, text) for text in TEXTS),
    ]
    assert [p.name for _, p in newest_passages(store, 4)] == ["new.txt"] * 3 + ["old.txt"]
    assert {p.document_id for _, p in newest_passages(store, 100, old)} == {old}


def config(url: str, **changes: object) -> dict[str, object]:
    return {**settings.DEFAULTS, "SIDECAR_URL": url, "PASSAGE_WARM": True, **changes}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_warming_is_off_unless_asked_and_never_for_another_server(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    assert Warmer.of(store, config("http://x", PASSAGE_WARM=False)) is None
    with caplog.at_level(logging.WARNING, logger="chatapp.documents.warming"):
        assert Warmer.of(store, config("http://x", UPSTREAM_API="openai")) is None
    (line,) = caplog.records
    assert "UPSTREAM_API=openai" in line.fields["reason"]  # type: ignore[attr-defined]
    unreachable = Warmer.of(store, config("http://127.0.0.1:9"))
    assert unreachable is not None
    assert unreachable.send([(1, passage(0))], "library") is False  # tried again later


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_warmed_passage_is_found_by_the_question_it_leads(
    store: Store, sidecar_service: Service
) -> None:
    owner = 10_000 + secrets.randbelow(10_000)  # a library of its own in the shared sidecar
    warmer = Warmer.of(store, config(sidecar_service.url))
    assert warmer is not None
    assert warmer.send([(owner, passage(0)), (owner, passage(2))], "library")
    passages_read(sidecar_service.url)
    # The question as the relay sends it (relay/chat.py): its best passage first
    best = [passage(2), passage(1)]
    body = {
        "messages": [
            {"role": "user", "content": with_block("Which water for tea?", block_of(best))}
        ],
        "passages": [p.text for p in best],
        "passage_scope": library_scope(owner),
        "max_new_tokens": 2,
    }
    response = httpx.post(
        sidecar_service.url + "/predict",
        json=body,
        headers={"accept": "application/x-ndjson"},
        timeout=60,
    )
    done = json.loads(response.text.splitlines()[-1])
    assert done["passage_cached_tokens"] > 40
    # Sent again: the sidecar holds them already
    answers = warmer._post(
        {"items": [warm_item(passage(2))], "passage_scope": library_scope(owner)}
    )
    assert answers == [{"index": 0, "tokens": 0, "reason": "stored already"}]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_warmer_sweeps_the_library_then_sends_each_document_ready(
    store: Store,
    owners: tuple[int, int],
    sidecar_service: Service,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import threading

    alice, _ = owners
    add_document(store, alice, "first.txt", 60)
    warmer = Warmer.of(store, config(sidecar_service.url))
    assert warmer is not None
    stop = threading.Event()

    def sent(what: str) -> list[dict[str, Any]]:
        return [
            r.fields  # type: ignore[attr-defined]
            for r in caplog.records
            if r.getMessage() == "passages sent to warm" and r.fields["what"] == what  # type: ignore[attr-defined]
        ]

    with caplog.at_level(logging.INFO, logger="chatapp.documents.warming"):
        warmer.start(stop)
        try:
            waited = time.monotonic() + 30
            while not sent("library") and time.monotonic() < waited:
                time.sleep(0.05)
            (library,) = sent("library")
            assert library["noted"] + library["stored_already"] == len(TEXTS)
            later = add_document(store, alice, "second.txt", 0)
            warmer.document_ready(later)
            while not sent("document") and time.monotonic() < waited:
                time.sleep(0.05)
            (document,) = sent("document")
            # The same texts as the first document's, but under another name: other prompts
            assert document["noted"] == len(TEXTS)
        finally:
            stop.set()
    passages_read(sidecar_service.url)
