"""Vector and keyword search on both engines: ranked, filtered by owner, gone with a delete."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import delete, func, select, text

from chatapp.documents.index.search_index import index_for
from chatapp.documents.index.vector_space import DimensionsChanged
from chatapp.documents.models import Chunk, Document
from chatapp.store import Store

WIDTH = 8


def unit(*values: float) -> np.ndarray:
    vector = np.zeros(WIDTH, dtype=np.float32)
    vector[: len(values)] = values
    return vector / np.linalg.norm(vector)


def add_document(store: Store, owner_id: int, texts: list[tuple[str, np.ndarray]]) -> list[int]:
    """A ready document of `texts`, each passage with its vector; the passages' ids."""
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
