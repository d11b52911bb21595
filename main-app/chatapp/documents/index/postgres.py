"""PostgreSQL: vectors in a pgvector `vector(dim)` table with an HNSW index, keywords in the
generated `tsvector` column `chunks.search` (stemmed by the passage's `language`, a text search
configuration) with its GIN index; a question is stemmed in its own language
(documents/language.py).

HNSW's parameters: pgvector's defaults for the build (m 16, ef_construction 64: its authors'
balance of build time and recall for vectors of a few hundred dimensions), and at query time
`hnsw.ef_search` 100 (the default 40 is below what fusion asks for: up to 50 candidates) with
`hnsw.iterative_scan = relaxed_order` (pgvector 0.8): the owner filter is applied to what the
graph yields, so an owner whose passages are a small share of the table would otherwise get
fewer than k; the scan goes on until k of theirs are found. `python -m scripts.bench rag`
measures recall against exact search at 100,000 passages.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sqlalchemy import text
from sqlalchemy.orm import Session

from chatapp.documents.index import vector_space
from chatapp.documents.index.ranking import keyword_words, library_languages
from chatapp.documents.index.vector_space import claim_dimensions, dimensions
from chatapp.documents.language import question_languages

EF_SEARCH = 100
HNSW_INDEX = (
    "CREATE INDEX IF NOT EXISTS ix_chunk_vectors_embedding ON chunk_vectors "
    "USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64)"
)


class PostgresIndex:
    def prepare(self, session: Session, width: int, probe: np.ndarray | None = None) -> None:
        if dimensions(session) == width:
            claim_dimensions(session, width, probe)  # the probe checked, or recorded (0008)
            return
        # Two writers' first vectors: the second waits here until the first has made the
        # table, then finds it made (or another width: DimensionsChanged).
        session.execute(text("LOCK TABLE vector_space IN SHARE ROW EXCLUSIVE MODE"))
        if claim_dimensions(session, width, probe):
            session.execute(text("CREATE EXTENSION IF NOT EXISTS vector"))
            session.execute(
                text(
                    "CREATE TABLE IF NOT EXISTS chunk_vectors ("
                    "chunk_id integer PRIMARY KEY REFERENCES chunks (id) ON DELETE CASCADE, "
                    f"owner_id integer NOT NULL, embedding vector({int(width)}) NOT NULL)"
                )
            )
            session.execute(text(HNSW_INDEX))

    def forget(self, session: Session) -> None:
        session.execute(text("DROP TABLE IF EXISTS chunk_vectors"))  # its HNSW index with it
        vector_space.forget(session)

    def add(self, session: Session, owner_id: int, rows: Sequence[tuple[int, np.ndarray]]) -> None:
        if not rows:
            return
        self.prepare(session, len(rows[0][1]))
        session.execute(
            text(
                "INSERT INTO chunk_vectors (chunk_id, owner_id, embedding) "
                "VALUES (:chunk_id, :owner_id, CAST(:embedding AS vector))"
            ),
            [
                {"chunk_id": chunk_id, "owner_id": owner_id, "embedding": _literal(vector)}
                for chunk_id, vector in rows
            ],
        )

    def dense(
        self, session: Session, owner_id: int, vector: np.ndarray, k: int
    ) -> list[tuple[int, float]]:
        if session.execute(text("SELECT to_regclass('chunk_vectors')")).scalar() is None:
            return []
        session.execute(text(f"SET LOCAL hnsw.ef_search = {EF_SEARCH}"))
        session.execute(text("SET LOCAL hnsw.iterative_scan = relaxed_order"))
        rows = session.execute(
            text(
                "SELECT chunk_id, embedding <=> CAST(:q AS vector) AS distance "
                "FROM chunk_vectors WHERE owner_id = :owner_id "
                "ORDER BY embedding <=> CAST(:q AS vector) LIMIT :k"
            ),
            {"q": _literal(vector), "owner_id": owner_id, "k": int(k)},
        )
        # relaxed_order may return a near neighbour slightly out of place: sort what came.
        found = [(int(chunk_id), 1.0 - float(distance)) for chunk_id, distance in rows]
        return sorted(found, key=lambda pair: -pair[1])

    def keyword(
        self, session: Session, owner_id: int, question: str, k: int
    ) -> list[tuple[int, float]]:
        words = keyword_words(question)
        if not words:
            return []
        # The question's words stemmed in each of its languages (one, or its library's).
        languages = question_languages(question, library_languages(session, owner_id))
        configs = {f"config{n}": language for n, language in enumerate(languages)}
        query = " || ".join(
            f"websearch_to_tsquery(CAST(:{name} AS regconfig), :words)" for name in configs
        )
        rows = session.execute(
            text(
                "SELECT id, ts_rank_cd(search, q.query) AS rank "
                f"FROM chunks, (SELECT {query} AS query) AS q "
                "WHERE owner_id = :owner_id AND search @@ q.query "
                "ORDER BY rank DESC LIMIT :k"
            ),
            {"words": " or ".join(words), "owner_id": owner_id, "k": int(k), **configs},
        )
        return [(int(chunk_id), float(rank)) for chunk_id, rank in rows]


def _literal(vector: np.ndarray) -> str:
    return "[" + ",".join(f"{float(x):.7g}" for x in np.asarray(vector).ravel()) + "]"
