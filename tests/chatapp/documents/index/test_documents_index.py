"""Vector and keyword search on both engines: ranked, filtered by owner, gone with a delete."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import delete, func, select, text

from chatapp.documents.index.search_index import index_for
from chatapp.documents.index.vector_space import DimensionsChanged
from chatapp.documents.models import Chunk, Document
from chatapp.store import Store, migrate

WIDTH = 8


def unit(*values: float) -> np.ndarray:
    vector = np.zeros(WIDTH, dtype=np.float32)
    vector[: len(values)] = values
    return vector / np.linalg.norm(vector)


def add_document(
    store: Store, owner_id: int, texts: list[tuple[str, np.ndarray]], language: str | None = None
) -> list[int]:
    """A ready document of `texts` (in `language`, as the indexer detects it; None: not
    detected, its passages English), each passage with its vector; the passages' ids."""
    index = index_for(store)
    with store.session(write=True) as session:
        document = Document(
            owner_id=owner_id,
            name=f"{owner_id}.txt",
            mime="text/plain",
            size=1,
            content_hash=f"{owner_id}-{texts[0][0]}",
            status="ready",
            progress=1.0,
            chunks=len(texts),
            attempts=1,
            language=language,
        )
        session.add(document)
        session.flush()
        rows = [
            Chunk(
                document_id=document.id,
                owner_id=owner_id,
                ordinal=i,
                text=t,
                heading="",
                page=None,
                tokens=3,
                language=language or "english",
            )
            for i, (t, _) in enumerate(texts)
        ]
        session.add_all(rows)
        session.flush()
        index.add(session, owner_id, [(row.id, v) for row, (_, v) in zip(rows, texts, strict=True)])
        return [row.id for row in rows]


def test_dense_search_is_ranked_and_keeps_to_its_owner(
    store: Store, owners: tuple[int, int]
) -> None:
    alice, bob = owners
    near, far = add_document(
        store, alice, [("kettle descaling", unit(1, 0.1)), ("warranty terms", unit(0, 1))]
    )
    (bobs,) = add_document(store, bob, [("bob's kettle", unit(1, 0))])  # the nearest of all
    index = index_for(store)
    with store.session() as session:
        found = index.dense(session, alice, unit(1, 0), 5)
        assert [chunk_id for chunk_id, _ in found] == [near, far]
        assert found[0][1] > found[1][1] and found[0][1] == pytest.approx(0.995, abs=0.01)
        assert [c for c, _ in index.dense(session, bob, unit(1, 0), 5)] == [bobs]


def test_keyword_search_stems_and_keeps_to_its_owner(store: Store, owners: tuple[int, int]) -> None:
    alice, bob = owners
    descale, _ = add_document(
        store,
        alice,
        [("Descaling the kettle monthly", unit(1)), ("The warranty lasts two years", unit(0, 1))],
    )
    add_document(store, bob, [("descale your kettle", unit(1))])
    index = index_for(store)
    with store.session() as session:
        assert [c for c, _ in index.keyword(session, alice, "How do I descale it?", 5)] == [descale]
        assert index.keyword(session, alice, "what is it?", 5) == []  # no searchable word
        assert index.keyword(session, alice, 'NEAR(") * OR', 5) == []  # no query syntax


def test_keyword_search_stems_each_document_in_its_own_language(
    store: Store, owners: tuple[int, int]
) -> None:
    """German and French passages are stemmed by their own rules (issue 55): a question with
    another form of the word finds them, which English stemming did not."""
    alice, bob = owners
    houses, _ = add_document(
        store,
        alice,
        [
            ("Die Häuser der Altstadt wurden im Mittelalter gebaut.", unit(1)),
            ("Der Wasserkocher schaltet sich von selbst ab.", unit(0, 1)),
        ],
        language="german",
    )
    (rivers,) = add_document(
        store, alice, [("Les rivières de la région débordent au printemps.", unit(1))], "french"
    )
    (kettle,) = add_document(store, alice, [("The kettle boils water quickly", unit(1))], "english")
    (bobs,) = add_document(store, bob, [("Die Häuser der Stadt", unit(1))], language="german")
    index = index_for(store)
    with store.session() as session:
        # "Hauses" (genitive singular) and "Häuser" (plural) are one stem in German only.
        found = [c for c, _ in index.keyword(session, alice, "Wann wurde das Hauses gebaut?", 5)]
        assert found[:1] == [houses]
        assert [c for c, _ in index.keyword(session, alice, "Où sont les rivière ?", 5)] == [rivers]
        # A question that does not say its language: the library's commonest (a tie: by name)
        assert {c for c, _ in index.keyword(session, alice, "kettles boiling", 5)} == {kettle}
        assert {c for c, _ in index.keyword(session, bob, "Häusern", 5)} == {bobs}


def test_a_library_read_before_languages_is_detected_and_indexed_again(database_url: str) -> None:
    """Migration 0005 on a database of revision 0004: each document's language from its
    passages, and its passages searchable by that language's stems."""
    store = Store.open(database_url)
    migrate.upgrade(store.engine, "0004")
    now = "2025-01-01 00:00:00"
    with store.engine.begin() as connection:
        connection.execute(
            text("INSERT INTO users (id, subject, name, created_at) VALUES (1, 's', 'n', :t)"),
            {"t": now},
        )
        connection.execute(
            text(
                "INSERT INTO documents (id, owner_id, name, content_hash, mime, size, status, "
                "progress, chunks, attempts, created_at, updated_at) VALUES "
                "(1, 1, 'a.txt', 'h', 'text/plain', 1, 'ready', 1.0, 1, 1, :t, :t)"
            ),
            {"t": now},
        )
        connection.execute(
            text(
                "INSERT INTO chunks (id, document_id, owner_id, ordinal, text, heading, tokens) "
                "VALUES (7, 1, 1, 0, :text, 'Altstadt', 9)"
            ),
            {"text": "Die Häuser der Altstadt sind alt und sie wurden von den Bürgern gebaut."},
        )
    migrate.upgrade(store.engine)
    with store.session() as session:
        assert session.scalar(select(Document.language)) == "german"
        assert [c for c, _ in index_for(store).keyword(session, 1, "Hauses", 5)] == [7]
    store.close()


def test_deleting_a_document_takes_its_vectors_and_keywords(
    store: Store, owners: tuple[int, int]
) -> None:
    alice, _ = owners
    add_document(store, alice, [("kettle descaling", unit(1)), ("warranty", unit(0, 1))])
    index = index_for(store)
    with store.session(write=True) as session:
        session.execute(delete(Document).where(Document.owner_id == alice))
    with store.session() as session:
        assert index.dense(session, alice, unit(1), 5) == []
        assert index.keyword(session, alice, "kettle", 5) == []
        assert session.scalar(select(func.count()).select_from(Chunk)) == 0
        assert session.scalar(text("SELECT count(*) FROM chunk_vectors")) == 0


def test_an_encoder_of_another_width_is_refused(store: Store, owners: tuple[int, int]) -> None:
    alice, _ = owners
    add_document(store, alice, [("kettle", unit(1))])
    changed = pytest.raises(DimensionsChanged, match="8 dimensions and the encoder now makes 4")
    with changed, store.session(write=True) as session:
        index_for(store).add(session, alice, [(1, np.ones(4, dtype=np.float32))])
