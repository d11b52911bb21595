"""A person's library: adding, listing, reading, cancelling, retrying and deleting documents.

Every function takes the owner's user id and every statement filters by it in SQL: another
owner's document is "not found", never read, never changed. Indexing itself is the indexer's
(`indexer/worker.py`): here a document is only stored (`queued`) or refused at once (`failed`).

A file's bytes are written a part at a time (`PART_BYTES`), each part in a transaction of its
own, after the short one that adds the document: SQLite has one writer at a time, and 16
uploads of 6 MB each holding it for a whole file made the last of them wait past the busy
timeout (500s). The document is held (`claim` `storing`) until its last part is in, so no
indexer reads half a file; an upload that fails takes its document away again, and one whose
process died is failed by the next claim once it has been storing for `claims.STALE_STORING`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from chatapp.documents.models import (
    NAME_CHARS,
    PART_BYTES,
    STORING,
    Chunk,
    Document,
    DocumentFile,
)
from chatapp.documents.names import stored_name
from chatapp.documents.reading.blocks import Refused
from chatapp.documents.reading.formats import Limits, format_of, mime_of
from chatapp.store import Store
from chatapp.store.base import utcnow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Added:
    document: Document
    already_held: bool  # the same bytes were already in this owner's library


def add(
    store: Store, owner_id: int, name: str, data: bytes, mime: str | None, limits: Limits
) -> Added:
    """Store a file for indexing, or find it already held (same bytes, same owner), or record
    it as failed with the reason when it is refused before reading (size, type)."""
    name = (stored_name(name) or "untitled")[:NAME_CHARS]
    digest = hashlib.sha256(data).hexdigest()
    with store.session(write=True) as session:
        held = session.scalars(
            select(Document).where(Document.owner_id == owner_id, Document.content_hash == digest)
        ).first()
        if held is not None:
            return Added(held, already_held=True)
        document = Document(
            owner_id=owner_id,
            name=name,
            content_hash=digest,
            size=len(data),
            status="queued",
            progress=0.0,
            chunks=0,
            attempts=0,
            claim=STORING,
        )
        try:
            if len(data) > limits.max_bytes:
                raise Refused(
                    "too_large",
                    f"The file has {len(data)} bytes; at most "
                    f"{limits.max_bytes} are read (DOCUMENT_MAX_BYTES).",
                )
            document.mime = mime_of(format_of(data, name, mime))
        except Refused as refused:
            document.mime = (mime or "application/octet-stream")[:100]
            _fail(document, refused.code, refused.message)
            session.add(document)
            session.flush()
            return Added(document, already_held=False)
        session.add(document)
        session.flush()
    try:
        _store_parts(store, document.id, data)
    except BaseException:
        # Best effort: if this fails too, the indexer fails the document once it is stale.
        with contextlib.suppress(Exception), store.session(write=True) as session:
            session.execute(delete(Document).where(Document.id == document.id))
        raise
    document.claim = None
    return Added(document, already_held=False)


def _store_parts(store: Store, document_id: int, data: bytes) -> None:
    """The bytes, a part per transaction; the last one lets the indexers have the document."""
    starts = range(0, max(len(data), 1), PART_BYTES)
    for part, start in enumerate(starts):
        piece = DocumentFile(
            document_id=document_id, part=part, data=data[start : start + PART_BYTES]
        )
        try:
            with store.session(write=True) as session:
                session.add(piece)
                session.flush()
                if part == len(starts) - 1:
                    session.execute(
                        update(Document)
                        .where(Document.id == document_id, Document.claim == STORING)
                        .values(claim=None, updated_at=utcnow())
                    )
        except IntegrityError:  # deleted meanwhile: its parts went with it
            log.info("upload deleted as stored", extra={"fields": {"document_id": document_id}})
            return


def listing(store: Store, owner_id: int) -> list[Document]:
    with store.session() as session:
        return list(
            session.scalars(
                select(Document).where(Document.owner_id == owner_id).order_by(Document.id)
            )
        )


def get(store: Store, owner_id: int, document_id: int) -> Document | None:
    with store.session() as session:
        return _owned(session, owner_id, document_id)


def delete_document(store: Store, owner_id: int, document_id: int) -> bool:
    """Delete it and its passages (their vectors and keywords go with them, in the same
    transaction: triggers on SQLite, foreign keys on PostgreSQL). False: no such document."""
    with store.session(write=True) as session:
        deleted = session.execute(
            delete(Document)
            .where(Document.id == document_id, Document.owner_id == owner_id)
            .returning(Document.id)
        ).first()
        return deleted is not None


def cancel(store: Store, owner_id: int, document_id: int) -> Document | None:
    """Stop indexing a queued or reading document: failed, `cancelled`, its passages gone. The
    indexer reading it sees it within a second (indexer.Watch) and stops, its reader killed."""
    with store.session(write=True) as session:
        document = _owned(session, owner_id, document_id)
        if document is not None and document.status in ("queued", "reading"):
            _fail(document, "cancelled", "Indexing was cancelled.")
            if document.claim != STORING:  # an indexer's claim ends; an upload finishes
                document.claim = None
            session.execute(
                delete(Chunk).where(Chunk.document_id == document.id, Chunk.owner_id == owner_id)
            )
        return document


def retry(store: Store, owner_id: int, document_id: int) -> Document | None:
    """Queue a failed document again (its bytes are kept; a refused file fails again)."""
    with store.session(write=True) as session:
        document = _owned(session, owner_id, document_id)
        if document is not None and document.status == "failed" and document.claim != STORING:
            session.execute(
                update(Document).where(Document.id == document.id).values(**queued_again())
            )
            session.refresh(document)
        return document


def queued_again() -> dict[str, Any]:
    """The columns of a document queued to be read again from its kept bytes, as new (retry,
    reembed.py): no claim, no attempts, no error."""
    return {
        "status": "queued",
        "progress": 0.0,
        "chunks": 0,
        "error": None,
        "error_type": None,
        "attempts": 0,
        "claim": None,
        "lease_until": None,
        "long_read": False,
        "updated_at": utcnow(),
    }


def _owned(session: Session, owner_id: int, document_id: int) -> Document | None:
    return session.scalars(
        select(Document).where(Document.id == document_id, Document.owner_id == owner_id)
    ).first()


def _fail(document: Document, code: str, message: str) -> None:
    document.status = "failed"
    document.error_type = code
    document.error = message
    document.lease_until = None
    document.updated_at = utcnow()
