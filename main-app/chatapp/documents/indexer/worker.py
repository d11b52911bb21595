"""Indexing outside the request: a job in the database, taken up by an indexer that is not a
web worker.

A document is the job: `queued` until an indexer claims it (`claims.py`: owners in turn, a
random claim id, a lease kept alive by a `Watch` thread), then `reading`.
`index_document(claim)` hands the stored bytes to a reader process (`reading/reader.py`), which
parses and cuts them within the document's budgets (DOCUMENT_READ_TIMEOUT, its own address
space of DOCUMENT_READ_MEMORY_MB; the same passages every time: the parsers and the cutter
are deterministic), then embeds and writes the passages in batches: each batch's passages,
vectors and progress in one transaction that names the claim. An indexer that dies (a
restart, the OOM killer) leaves a lease that lapses, or its process's successor takes its
documents over at once (`claims.take_over`); the next claim starts at the first passage not
written ((document, ordinal) is unique): nothing is written twice.

Nothing a file does stops the others:

- a file over a budget (time, memory, its text, what it unpacks to) fails at once with its
  reason (`too_slow`, `too_large`) and is not claimed again;
- cancelled, deleted or taken by another indexer, the document is dropped within a second
  whatever is being done: the watch sees it and the reader process is killed mid-read;
- the lanes: with several indexers (DOCUMENT_INDEXER_THREADS, `python -m chatapp.documents`)
  the last is a quick lane (`quick_s`): it works on a document at most `quick_s` seconds,
  reading and embedding together, then gives it back (`claims.hand_back`: queued again, its
  passages kept, for the other lanes only). A small file thus waits for at most `quick_s`
  however long the other lanes read, and a library of small files keeps every lane busy.

`run(stop)` is the loop: claim, index, repeat; it sleeps `poll_s` when there is nothing to do.
It runs in its own process (`python -m chatapp.documents`, which `gunicorn_conf` starts beside
the web workers and starts again within seconds when it dies), so no web worker reads a file.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import select

from chatapp.documents.embedder import Embedder, EmbeddingsFailed
from chatapp.documents.encoder_check import EncoderCheck
from chatapp.documents.index.search_index import SearchIndex
from chatapp.documents.index.vector_space import EncoderChanged
from chatapp.documents.indexer import claims
from chatapp.documents.indexer.claims import Claim, Watch
from chatapp.documents.language import document_language
from chatapp.documents.models import Chunk, Document, DocumentFile
from chatapp.documents.reading.chunker import Chunk as Passage
from chatapp.documents.reading.formats import Limits
from chatapp.documents.reading.reader import Answer, Job, Reader
from chatapp.documents.sizing import PassageSizing
from chatapp.documents.warming import Warmer
from chatapp.store import Store
from chatapp.store.base import utcnow

# The name its log lines have always carried, not the module's path.
log = logging.getLogger("chatapp.documents.indexer")

QUICK_S = 5.0  # how long the quick lane works on one document before it gives it back


@dataclass
class Indexer:
    store: Store
    index: SearchIndex
    embedder: Embedder
    sizing: PassageSizing  # how passages are counted and how long they may be
    limits: Limits
    read_timeout_s: float = 120.0  # DOCUMENT_READ_TIMEOUT
    read_memory_mb: int = 512  # DOCUMENT_READ_MEMORY_MB
    quick_s: float | None = None  # a quick lane's time per document; None: not a quick lane
    # PASSAGE_WARM: each document ready is sent to warm the passage store (documents/warming.py)
    warmer: Warmer | None = None
    instance: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    lease_s: float = 60.0
    check_s: float = 0.25  # how often a claim is looked at while its document is worked on
    poll_s: float = 1.0
    batch: int = 32  # passages embedded and written per transaction
    # Whether the encoder is still the library's (its probe, kept a minute); None: the
    # embedder's own. One for a process's indexers (__main__.py).
    encoder: EncoderCheck | None = None
    _prepared: int | None = field(default=None, init=False)  # the vectors' width, once made
    _reader: Reader | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.encoder is None:
            self.encoder = EncoderCheck(self.embedder)

    @property
    def check(self) -> EncoderCheck:
        assert self.encoder is not None  # __post_init__
        return self.encoder

    @property
    def reader(self) -> Reader:
        if self._reader is None:
            self._reader = Reader(self.read_memory_mb, self.read_timeout_s)
        return self._reader

    def claim(self) -> Claim | None:
        return claims.claim(self.store, self.instance, self.lease_s, quick=self.quick_s is not None)

    def index_document(self, claim: Claim) -> str:
        """Read, cut, embed and store one claimed document, from where it was left; what
        came of it (`ready`, a refusal's code, `lost`, `handed_back`)."""
        with self.store.session() as session:
            document = session.scalars(select(Document).where(claims.holds(claim))).first()
            if document is None:
                return "lost"
            owner_id, name, mime = document.owner_id, document.name, document.mime
            parts = session.scalars(
                select(DocumentFile.data)
                .where(DocumentFile.document_id == claim.document_id)
                .order_by(DocumentFile.part)
            ).all()
            written = set(
                session.scalars(select(Chunk.ordinal).where(Chunk.document_id == claim.document_id))
            )
        if not parts:
            return self._fail(claim, "broken", "The file's bytes are not kept; add it again.")
        # Not read for nothing: no vector of another encoder could be kept (no probe from the
        # model service is `unknown`: embedding the passages will say why)
        if self.check.state(self.store) == "changed":
            return self._fail(claim, "encoder_changed", str(EncoderChanged()))
        began = time.monotonic()
        until = math.inf if self.quick_s is None else began + self.quick_s
        with Watch(self.store, claim, self.lease_s, self.check_s) as watch:

            def give_up() -> bool:  # the claim lost, or the quick lane's time up
                return watch.lost.is_set() or time.monotonic() > until

            measure = self.sizing.current()
            job = Job(
                b"".join(parts), name, mime, self.limits, measure.tokenizer, measure.max_tokens
            )
            del parts
            answer = self.reader.read(job, give_up=give_up)
            self._log_read(claim, answer)
            if answer.stopped:
                return self._stopped(claim, watch)
            if answer.passages is None:
                return self._fail(claim, answer.code or "broken", answer.message)
            passages = answer.passages
            # Deterministic, as the passages are: a resumed document keeps its language.
            language = document_language(p.text for p in passages)
            todo = [p for p in passages if p.ordinal not in written]
            done = len(passages) - len(todo)
            for start in range(0, len(todo), self.batch):
                if give_up():
                    return self._stopped(claim, watch)
                batch = todo[start : start + self.batch]
                try:
                    vectors = self.embedder.embed([p.embedded for p in batch])
                    probe = self.check.probe()
                except EmbeddingsFailed as failed:
                    self.check.forget()  # a sidecar restarted may serve another encoder
                    return self._fail(claim, "embeddings_failed", str(failed))
                done += len(batch)
                try:
                    progress = done / len(passages)
                    if not self._write(claim, owner_id, batch, vectors, probe, progress, language):
                        return "lost"  # cancelled, deleted or taken meanwhile
                except EncoderChanged as changed:  # DimensionsChanged too: another width
                    return self._fail(claim, "encoder_changed", str(changed))
            claims.finish(self.store, claim, "ready", chunks=len(passages))
            return "ready"

    def _stopped(self, claim: Claim, watch: Watch) -> str:
        if watch.lost.is_set():
            return "lost"
        claims.hand_back(self.store, claim)  # the quick lane's time is up
        return "handed_back"

    def _fail(self, claim: Claim, code: str, message: str) -> str:
        claims.finish(self.store, claim, "failed", code, message)
        return code

    def _log_read(self, claim: Claim, answer: Answer) -> None:
        fields: dict[str, Any] = {
            "document_id": claim.document_id,
            "read_seconds": answer.seconds,
            "read_peak_mb": answer.peak_mb,
        }
        if answer.passages is not None:
            fields["passages"] = len(answer.passages)
        log.info("read", extra={"fields": fields | {"outcome": _outcome(answer)}})

    def _write(
        self,
        claim: Claim,
        owner_id: int,
        batch: Sequence[Passage],
        vectors: np.ndarray,
        probe: np.ndarray,
        progress: float,
        language: str,
    ) -> bool:
        """Write a batch's passages and vectors, made by the encoder whose `probe` is given:
        EncoderChanged when it is not the library's, and nothing written."""
        width = int(vectors.shape[1])
        if self._prepared != width:  # the vectors' table first, alone (search_index.prepare)
            with self.store.session(write=True) as session:
                self.index.prepare(session, width, probe)
            self._prepared = width
        with self.store.session(write=True) as session:
            # The claim, not the id alone: an id may name another document by now.
            document = session.scalars(select(Document).where(claims.holds(claim))).first()
            if document is None:
                return False
            # The encoder checked in the transaction that writes its vectors; after a reembed
            # (no record, no table) this makes them again.
            self.index.prepare(session, width, probe)
            rows = [
                Chunk(
                    document_id=claim.document_id,
                    owner_id=owner_id,
                    ordinal=p.ordinal,
                    text=p.text,
                    heading=p.heading,
                    page=p.page,
                    tokens=p.tokens,
                    language=language,
                )
                for p in batch
            ]
            session.add_all(rows)
            session.flush()
            self.index.add(
                session, owner_id, [(row.id, v) for row, v in zip(rows, vectors, strict=True)]
            )
            document.language = language
            document.progress = round(progress, 4)
            document.updated_at = utcnow()
            return True

    def run(self, stop: threading.Event, wake: threading.Event | None = None) -> None:
        """Claim and index documents until `stop` is set; `wake` cuts a poll's sleep short."""
        wake = wake or threading.Event()
        if self.warmer is not None:
            self.warmer.start(stop)
        try:
            while not stop.is_set():
                try:
                    claimed = self.claim()
                    if claimed is None:
                        wake.wait(self.poll_s)
                        wake.clear()
                        continue
                    began = time.monotonic()
                    outcome = self.index_document(claimed)
                    if outcome == "ready" and self.warmer is not None:
                        self.warmer.document_ready(claimed.document_id)
                    seconds = round(time.monotonic() - began, 3)
                    fields = {"document_id": claimed.document_id, "outcome": outcome}
                    log.info("indexed", extra={"fields": fields | {"seconds": seconds}})
                except Exception:  # the loop outlives any one document's failure
                    log.exception("indexing failed")
                    stop.wait(self.poll_s)
        finally:
            self.close()

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()


def _outcome(answer: Answer) -> str:
    if answer.stopped:
        return "stopped"
    return "read" if answer.passages is not None else answer.code or "broken"
