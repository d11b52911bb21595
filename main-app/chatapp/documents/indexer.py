"""Indexing outside the request: a job in the database, taken up by an indexer that is not a
web worker.

A document is the job: `queued` until an indexer claims it (`claim`: one transaction, so two
indexers never take the same one; `FOR UPDATE SKIP LOCKED` on PostgreSQL, SQLite's write
lock), then `reading` with a lease (`lease_until`) that the indexer renews at every batch.
`index_document(document_id)` reads the stored bytes, parses and cuts them (the same result
every time: the parsers and the chunker are deterministic), and writes the passages in
batches: each batch's passages, vectors and progress in one transaction. An indexer that dies
(a restart, a crash) leaves a lease that lapses; the next indexer claims the document again
and starts at the first passage not written ((document, ordinal) is unique): nothing is
written twice. Between batches it reads the document's status: cancelled or deleted, it
stops. A document whose indexing killed its indexer `MAX_ATTEMPTS` times fails instead of
taking the next one down too.

`run(stop)` is the loop: claim, index, repeat; it sleeps `poll_s` when there is nothing to do.
It runs in its own process (`python -m chatapp.documents`, which `gunicorn_conf` starts
beside the web workers), so parsing a 300-page PDF never holds a web worker's GIL.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy import delete, or_, select, update

from chatapp.documents.blocks import Refused
from chatapp.documents.chunker import Chunk as Passage
from chatapp.documents.chunker import chunk
from chatapp.documents.embedder import Embedder, EmbeddingsFailed
from chatapp.documents.formats import Limits, read
from chatapp.documents.models import Chunk, Document, DocumentFile
from chatapp.documents.search_index import SearchIndex
from chatapp.documents.tokens import TokenCounter
from chatapp.documents.vector_space import DimensionsChanged
from chatapp.store import Store
from chatapp.store.base import utcnow

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3


@dataclass
class Indexer:
    store: Store
    index: SearchIndex
    embedder: Embedder
    counter: TokenCounter
    limits: Limits
    chunk_tokens: int
    lease_s: float = 60.0
    poll_s: float = 1.0
    batch: int = 32  # passages embedded and written per transaction
    _prepared: int | None = field(default=None, init=False)  # the vectors' width, once made

    def claim(self) -> int | None:
        """Take the oldest queued document, or one whose indexer's lease lapsed."""
        now = utcnow()
        with self.store.session(write=True) as session:
            query = (
                select(Document)
                .where(
                    or_(
                        Document.status == "queued",
                        (Document.status == "reading") & (Document.lease_until < now),
                    )
                )
                .order_by(Document.updated_at, Document.id)
                .limit(1)
            )
            if self.store.dialect == "postgresql":
                query = query.with_for_update(skip_locked=True)
            document = session.scalars(query).first()
            if document is None:
                return None
            document.attempts += 1
            document.updated_at = now
            if document.attempts > MAX_ATTEMPTS:
                _fail(
                    document,
                    "broken",
                    f"Reading this file stopped the indexer {MAX_ATTEMPTS} times; it is not read.",
                )
                return None
            document.status = "reading"
            document.lease_until = now + dt.timedelta(seconds=self.lease_s)
            return document.id

    def index_document(self, document_id: int) -> None:
        """Read, cut, embed and store one claimed document, from where it was left."""
        with self.store.session() as session:
            document = session.get(Document, document_id)
            file = session.get(DocumentFile, document_id)
            if document is None or document.status != "reading":
                return
            owner_id, name, mime = document.owner_id, document.name, document.mime
            written = set(
                session.scalars(select(Chunk.ordinal).where(Chunk.document_id == document_id))
            )
        try:
            if file is None:
                raise Refused("broken", "The file's bytes are not kept; add it again.")
            _, blocks = read(file.data, name, mime, self.limits)
            passages = chunk(blocks, self.counter, self.chunk_tokens)
        except Refused as refused:
            self._finish(document_id, "failed", refused.code, refused.message)
            return
        todo = [p for p in passages if p.ordinal not in written]
        done = len(passages) - len(todo)
        for start in range(0, len(todo), self.batch):
            batch = todo[start : start + self.batch]
            try:
                vectors = self.embedder.embed([p.embedded for p in batch])
            except EmbeddingsFailed as failed:
                self._finish(document_id, "failed", "embeddings_failed", str(failed))
                return
            done += len(batch)
            try:
                if not self._write(document_id, owner_id, batch, vectors, done / len(passages)):
                    return  # cancelled or deleted meanwhile
            except DimensionsChanged as changed:
                self._finish(document_id, "failed", "embeddings_failed", str(changed))
                return
        self._finish(document_id, "ready", None, None, chunks=len(passages))

    def _write(
        self,
        document_id: int,
        owner_id: int,
        batch: list[Passage],
        vectors: np.ndarray,
        progress: float,
    ) -> bool:
        width = int(vectors.shape[1])
        if self._prepared != width:  # the vectors' table first, alone (search_index.prepare)
            with self.store.session(write=True) as session:
                self.index.prepare(session, width)
            self._prepared = width
        with self.store.session(write=True) as session:
            document = session.get(Document, document_id)
            if document is None or document.status != "reading":
                return False
            rows = [
                Chunk(
                    document_id=document_id,
                    owner_id=owner_id,
                    ordinal=p.ordinal,
                    text=p.text,
                    heading=p.heading,
                    page=p.page,
                    tokens=p.tokens,
                )
                for p in batch
            ]
            session.add_all(rows)
            session.flush()
            self.index.add(
                session, owner_id, [(row.id, v) for row, v in zip(rows, vectors, strict=True)]
            )
            document.progress = round(progress, 4)
            document.updated_at = utcnow()
            document.lease_until = utcnow() + dt.timedelta(seconds=self.lease_s)
            return True

    def _finish(
        self,
        document_id: int,
        status: str,
        error_type: str | None,
        error: str | None,
        chunks: int = 0,
    ) -> None:
        with self.store.session(write=True) as session:
            values = {
                "status": status,
                "error_type": error_type,
                "error": error,
                "lease_until": None,
                "updated_at": utcnow(),
                "chunks": chunks,
                "progress": 1.0 if status == "ready" else 0.0,
            }
            session.execute(
                update(Document)
                .where(Document.id == document_id, Document.status == "reading")
                .values(**values)
            )
            if status == "failed":
                session.execute(delete(Chunk).where(Chunk.document_id == document_id))

    def run(self, stop: threading.Event, wake: threading.Event | None = None) -> None:
        """Claim and index documents until `stop` is set; `wake` cuts a poll's sleep short."""
        wake = wake or threading.Event()
        while not stop.is_set():
            try:
                claimed = self.claim()
                if claimed is None:
                    wake.wait(self.poll_s)
                    wake.clear()
                    continue
                began = time.monotonic()
                self.index_document(claimed)
                log.info(
                    "indexed",
                    extra={"document_id": claimed, "seconds": round(time.monotonic() - began, 3)},
                )
            except Exception:  # the loop outlives any one document's failure
                log.exception("indexing failed")
                stop.wait(self.poll_s)


def _fail(document: Document, code: str, message: str) -> None:
    document.status = "failed"
    document.error_type = code
    document.error = message
    document.lease_until = None
