"""One interface in front of the two engines' vector and keyword search over passages.

`index_for(store)` gives the engine's `SearchIndex`: `sqlite.SqliteIndex` (sqlite-vec's
`vec0`, FTS5) or `postgres.PostgresIndex` (pgvector's HNSW, `tsvector` + GIN). Every
method takes the owner's user id and filters by it in SQL: a passage of another owner is never
read, whatever ids a caller passes. Scores are higher-is-better (dense: cosine similarity;
keyword: the engine's BM25-like rank, comparable only within one query).

The vectors' table is made at the first vector, for the encoder's width, and the encoder's
fingerprint is kept with it (`vector_space.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
from sqlalchemy.orm import Session

if TYPE_CHECKING:
    from chatapp.store import Store


class SearchIndex(Protocol):
    def prepare(self, session: Session, width: int, probe: np.ndarray | None = None) -> None:
        """Make the vectors' table for `width` if the library has none, recording the
        encoder's `probe` with it (vector_space.py; raises DimensionsChanged for another
        width, EncoderChanged for another encoder's probe). Writers call it in a transaction of
        its own before they write passages: on PostgreSQL, making the table takes locks that a
        concurrent writer's passages hold (indexer/worker.py)."""
        ...

    def forget(self, session: Session) -> None:
        """Drop the vectors' table and the library's record of its encoder (reembed.py): the
        next vector makes them again, for its encoder's width."""
        ...

    def add(self, session: Session, owner_id: int, rows: Sequence[tuple[int, np.ndarray]]) -> None:
        """Store each (chunk id, unit vector) of the owner's passages."""
        ...

    def dense(
        self, session: Session, owner_id: int, vector: np.ndarray, k: int
    ) -> list[tuple[int, float]]:
        """The owner's k passages nearest `vector`: (chunk id, cosine similarity), best first."""
        ...

    def keyword(
        self, session: Session, owner_id: int, question: str, k: int
    ) -> list[tuple[int, float]]:
        """The owner's k passages that best match the question's words, best first."""
        ...


def index_for(store: Store) -> SearchIndex:
    if store.dialect == "sqlite":
        from chatapp.documents.index.sqlite import SqliteIndex

        return SqliteIndex()
    from chatapp.documents.index.postgres import PostgresIndex

    return PostgresIndex()
