"""Search a person's library: dense, keyword, or their fusion, then the passages themselves.

`search(...)` asks the engine's index (`index/search_index.py`) for candidates by the owner, then
reads those passages joined with their documents, again by the owner, and only from documents
that are `ready` (a document being read or cancelled is not searched). `DOCUMENT_SEARCH` picks
the method; its default is the one the evaluation chose (docs/documents.md, `python -m
scripts.bench rag`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sqlalchemy import select

from chatapp.documents.embedder import Embedder
from chatapp.documents.index.ranking import fuse
from chatapp.documents.index.search_index import SearchIndex
from chatapp.documents.models import Chunk, Document
from chatapp.documents.reading.chunker import cut
from chatapp.documents.sizing import PassageSizing
from chatapp.store import Store

Method = Literal["dense", "keyword", "fusion"]
METHODS: tuple[Method, ...] = ("dense", "keyword", "fusion")
DEPTH = 50  # candidates each method gives fusion


@dataclass(frozen=True)
class Passage:
    chunk_id: int
    document_id: int
    name: str
    text: str
    heading: str
    page: int | None
    tokens: int
    score: float

    @classmethod
    def of(cls, chunk: Chunk, name: str, score: float = 0.0) -> Passage:
        """A stored passage (its document's `name`) as a search gives it."""
        return cls(
            chunk.id,
            chunk.document_id,
            name,
            chunk.text,
            chunk.heading,
            chunk.page,
            chunk.tokens,
            score,
        )


@dataclass(frozen=True)
class Searcher:
    store: Store
    index: SearchIndex
    embedder: Embedder | None  # None: no encoder configured, keyword search only
    sizing: PassageSizing  # the encoder's count and limit: a longer question is cut to it
    method: Method

    def search(self, owner_id: int, question: str, k: int) -> list[Passage]:
        method = self.method if self.embedder is not None else "keyword"
        depth = max(k, DEPTH) if method == "fusion" else k
        # Extra candidates: a candidate from a document not ready is dropped below.
        want = depth + 10
        with self.store.session() as session:
            ranked: list[tuple[int, float]]
            if method == "keyword":
                ranked = self.index.keyword(session, owner_id, question, want)
            else:
                assert self.embedder is not None
                # A question is cut to the room the encoder leaves it (its prompt's aside)
                limit = self.sizing.current().question_limit
                asked = cut(question, lambda text: self.sizing.count(text) <= limit)
                vector = self.embedder.embed_query(asked)
                ranked = self.index.dense(session, owner_id, vector, want)
                if method == "fusion":
                    keyword = self.index.keyword(session, owner_id, question, want)
                    ranked = fuse([[c for c, _ in ranked], [c for c, _ in keyword]])
            ids = [chunk_id for chunk_id, _ in ranked]
            rows = session.execute(
                select(Chunk, Document.name)
                .join(Document, Document.id == Chunk.document_id)
                .where(
                    Chunk.id.in_(ids),
                    Chunk.owner_id == owner_id,
                    Document.owner_id == owner_id,
                    Document.status == "ready",
                )
            ).all()
        found = {chunk.id: (chunk, name) for chunk, name in rows}
        passages = []
        for chunk_id, score in ranked:
            if chunk_id in found:
                chunk, name = found[chunk_id]
                passages.append(Passage.of(chunk, name, round(score, 6)))
        return passages[:k]
