"""Search a person's library: dense, keyword, or both (hybrid: relative score fusion, the
default; fusion: reciprocal rank fusion), then the passages themselves.

`search(...)` asks the engine's index (`index/search_index.py`) for candidates by the owner, then
reads those passages joined with their documents, again by the owner, and only from documents
that are `ready` (a document being read or cancelled is not searched). `DOCUMENT_SEARCH` picks
the method; its default is the one the evaluation chose (docs/documents.md, `python -m
scripts.bench rag`).

Without an encoder, or with another encoder than the library's vectors were made with
(`encoder_check.py`: a question's vector would be compared with another encoder's passages, a
ranking of noise), every method is keyword search.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sqlalchemy import select

from chatapp.documents.embedder import Embedder
from chatapp.documents.encoder_check import EncoderCheck
from chatapp.documents.index.ranking import blend, fuse
from chatapp.documents.index.search_index import SearchIndex
from chatapp.documents.models import Chunk, Document
from chatapp.documents.reading.chunker import cut
from chatapp.documents.sizing import PassageSizing
from chatapp.settings import DEFAULTS
from chatapp.store import Store

Method = Literal["hybrid", "dense", "keyword", "fusion"]
METHODS: tuple[Method, ...] = ("hybrid", "dense", "keyword", "fusion")
DEPTH = 50  # candidates each method gives hybrid and fusion


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
    # Cosine similarity to the question (dense, hybrid): what DOCUMENT_MIN_SCORE is held to.
    # Hybrid's passage found by its words alone has the lowest of the encoder's candidates,
    # which its own is below. None: keyword and fusion.
    similarity: float | None = None

    @classmethod
    def of(
        cls, chunk: Chunk, name: str, score: float = 0.0, similarity: float | None = None
    ) -> Passage:
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
            similarity,
        )


@dataclass(frozen=True)
class Searcher:
    store: Store
    index: SearchIndex
    embedder: Embedder | None  # None: no encoder configured, keyword search only
    sizing: PassageSizing  # the encoder's count and limit: a longer question is cut to it
    method: Method

    # hybrid's weight of keyword scores (DOCUMENT_KEYWORD_WEIGHT, chosen on bench rag's suite)
    keyword_weight: float = DEFAULTS["DOCUMENT_KEYWORD_WEIGHT"]
    # Whether the encoder is still the library's; None: not checked (documents/service.py
    # gives the app's searcher one)
    encoder: EncoderCheck | None = None

    def search(self, owner_id: int, question: str, k: int) -> list[Passage]:
        method = self.method if self.embedder is not None else "keyword"
        # Another encoder than the library's: logged once, when first seen
        if method != "keyword" and self.encoder and self.encoder.state(self.store) == "changed":
            method = "keyword"
        depth = max(k, DEPTH) if method in ("hybrid", "fusion") else k
        # Extra candidates: a candidate from a document not ready is dropped below.
        want = depth + 10
        with self.store.session() as session:
            dense: list[tuple[int, float]] = []
            keyword: list[tuple[int, float]] = []
            if method != "keyword":
                assert self.embedder is not None
                # A question is cut to the room the encoder leaves it (its prompt's aside)
                limit = self.sizing.current().question_limit
                asked = cut(question, lambda text: self.sizing.count(text) <= limit)
                vector = self.embedder.embed_query(asked)
                dense = self.index.dense(session, owner_id, vector, want)
            if method != "dense":
                keyword = self.index.keyword(session, owner_id, question, want)
            ids = {chunk_id for chunk_id, _ in dense} | {chunk_id for chunk_id, _ in keyword}
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
        # Candidates of documents not ready are dropped before any fusion scales scores
        dense = [pair for pair in dense if pair[0] in found]
        keyword = [pair for pair in keyword if pair[0] in found]
        similarity = dict(dense)
        ranked: list[tuple[int, float]]
        if method == "keyword":
            ranked = keyword
        elif method == "dense":
            ranked = dense
        elif method == "fusion":
            ranked = fuse([[c for c, _ in dense], [c for c, _ in keyword]])
        else:
            document_of = {chunk_id: chunk.document_id for chunk_id, (chunk, _) in found.items()}
            ranked = blend(dense, keyword, document_of, self.keyword_weight)
        floor = min(similarity.values(), default=None)
        passages = []
        for chunk_id, score in ranked[:k]:
            chunk, name = found[chunk_id]
            cosine = similarity.get(chunk_id, floor) if method in ("dense", "hybrid") else None
            passages.append(Passage.of(chunk, name, round(score, 6), cosine))
        return passages
