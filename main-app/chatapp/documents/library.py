"""A person's library: adding, listing, reading, cancelling, retrying and deleting documents.

Every function takes the owner's user id and every statement filters by it in SQL: another
owner's document is "not found", never read, never changed. Indexing itself is the indexer's
(`indexer.py`): here a document is only stored (`queued`) or refused at once (`failed`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from chatapp.documents.blocks import Refused
from chatapp.documents.formats import Limits, format_of, mime_of
from chatapp.documents.models import NAME_CHARS, Chunk, Document, DocumentFile
from chatapp.documents.names import stored_name
from chatapp.store import Store
from chatapp.store.base import utcnow


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
        session.add(DocumentFile(document_id=document.id, data=data))
        return Added(document, already_held=False)


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
    indexer sees it at its next batch and stops."""
    with store.session(write=True) as session:
        document = _owned(session, owner_id, document_id)
        if document is not None and document.status in ("queued", "reading"):
            _fail(document, "cancelled", "Indexing was cancelled.")
            session.execute(
                delete(Chunk).where(Chunk.document_id == document.id, Chunk.owner_id == owner_id)
            )
        return document


def retry(store: Store, owner_id: int, document_id: int) -> Document | None:
    """Queue a failed document again (its bytes are kept; a refused file fails again)."""
    with store.session(write=True) as session:
        document = _owned(session, owner_id, document_id)
        if document is not None and document.status == "failed":
            session.execute(
                update(Document)
                .where(Document.id == document.id)
                .values(
                    status="queued",
                    progress=0.0,
                    chunks=0,
                    error=None,
                    error_type=None,
                    attempts=0,
                    lease_until=None,
                    updated_at=utcnow(),
                )
            )
            session.refresh(document)
        return document


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
