"""SQLite: vectors in sqlite-vec's `vec0` (exact search, owner as its partition key), keywords
in FTS5 (BM25) over each passage's words stemmed in its document's language (`chunks.keywords`,
documents/language.py), a question's words stemmed in its own language.

`vec0` with `owner_id` as a partition key keeps each owner's vectors apart, so a search scans
only the caller's (exact cosine distance over them: no index to tune, and exact recall). The
table has no foreign key (virtual tables cannot), so a trigger on `chunks` deletes a passage's
vector with it, in the same statement that deletes the passage (a document's deletion cascades
to its chunks, and so to their vectors and FTS rows).

sqlite-vec is a loadable extension: `chatapp.store.vectors_sqlite` gives the engine a SQLite
driver that can load it (Python builds without loadable extensions are common) and loads it
into every connection.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sqlalchemy import text
from sqlalchemy.orm import Session

from chatapp.documents.index import vector_space
from chatapp.documents.index.ranking import fts5_query, library_languages
from chatapp.documents.index.vector_space import claim_dimensions
from chatapp.documents.language import question_languages


class SqliteIndex:
    def prepare(self, session: Session, width: int, probe: np.ndarray | None = None) -> None:
        # A SQLite write transaction holds the whole file: no other writer runs meanwhile.
        if claim_dimensions(session, width, probe):
            self._make_table(session, width)

    def forget(self, session: Session) -> None:
        # The trigger first: one left behind would fail every later delete of a passage.
        session.execute(text("DROP TRIGGER IF EXISTS chunks_vectors_delete"))
        session.execute(text("DROP TABLE IF EXISTS chunk_vectors"))
        vector_space.forget(session)

    def add(self, session: Session, owner_id: int, rows: Sequence[tuple[int, np.ndarray]]) -> None:
        if not rows:
            return
        self.prepare(session, len(rows[0][1]))
        session.execute(
            text(
                "INSERT INTO chunk_vectors (chunk_id, owner_id, embedding) "
                "VALUES (:chunk_id, :owner_id, :embedding)"
            ),
            [
                {"chunk_id": chunk_id, "owner_id": owner_id, "embedding": _blob(vector)}
                for chunk_id, vector in rows
            ],
        )

    @staticmethod
    def _make_table(session: Session, width: int) -> None:
        session.execute(
            text(
                "CREATE VIRTUAL TABLE IF NOT EXISTS chunk_vectors USING vec0("
                "chunk_id INTEGER PRIMARY KEY, owner_id INTEGER PARTITION KEY, "
                f"embedding FLOAT[{int(width)}] distance_metric=cosine)"
            )
        )
        session.execute(
            text(
                "CREATE TRIGGER IF NOT EXISTS chunks_vectors_delete AFTER DELETE ON chunks BEGIN "
                "DELETE FROM chunk_vectors WHERE chunk_id = old.id; END"
            )
        )

    def dense(
        self, session: Session, owner_id: int, vector: np.ndarray, k: int
    ) -> list[tuple[int, float]]:
        if not _has_vectors(session):
            return []
        rows = session.execute(
            text(
                "SELECT chunk_id, distance FROM chunk_vectors WHERE embedding MATCH :q "
                "AND k = :k AND owner_id = :owner_id ORDER BY distance"
            ),
            {"q": _blob(vector), "k": int(k), "owner_id": owner_id},
        )
        return [(int(chunk_id), 1.0 - float(distance)) for chunk_id, distance in rows]

    def keyword(
        self, session: Session, owner_id: int, question: str, k: int
    ) -> list[tuple[int, float]]:
        languages = question_languages(question, library_languages(session, owner_id))
        query = fts5_query(question, languages)
        if query is None:
            return []
        # The owner inside MATCH: FTS5 ranks that owner's passages only (their column weighs
        # nothing in BM25); and again in SQL, whatever the index holds.
        rows = session.execute(
            text(
                "SELECT c.id, bm25(chunks_fts, 1.0, 0.0) AS rank FROM chunks_fts "
                "JOIN chunks AS c ON c.id = chunks_fts.rowid "
                "WHERE chunks_fts MATCH :query AND c.owner_id = :owner_id "
                "ORDER BY rank LIMIT :k"
            ),
            {
                "query": f'owner_id : "{int(owner_id)}" AND ({query})',
                "owner_id": owner_id,
                "k": int(k),
            },
        )
        return [(int(chunk_id), -float(rank)) for chunk_id, rank in rows]


def _has_vectors(session: Session) -> bool:
    found = session.execute(
        text("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'chunk_vectors'")
    ).first()
    return found is not None


def _blob(vector: np.ndarray) -> bytes:
    return np.asarray(vector, dtype="<f4").tobytes()
