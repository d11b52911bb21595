"""The library's tables: `documents`, `document_files` (the bytes), `chunks` (the passages).

Vectors and keyword search are not mapped here: they differ by engine and live behind
`chatapp.documents.index.search_index` (SQLite: a sqlite-vec `vec0` table and an FTS5 table over
`chunks`' stemmed `keywords`; PostgreSQL: a `vector(dim)` table with an HNSW index, and a
generated `tsvector` column on `chunks`, stemmed in the passage's `language`, with a GIN
index). Every query of these tables takes the owner's user id.

A document's life: `queued` (its bytes stored, waiting for the indexer; `claim` is `storing`
while they are being written) -> `reading` (parsed, cut, embedded; `progress` 0..1; `claim`
the indexer's) -> `ready`, or `failed` with `error_type` and `error` (a refusal of
`blocks.REFUSALS`, `cancelled`, `embeddings_failed`, or `encoder_changed`). Retry sets it
`queued` again; `python -m chatapp.documents reembed` the whole library (reembed.py).
`content_hash` (SHA-256 of the bytes) is unique per owner: the same file twice is the same
document.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.dialects.postgresql import REGCONFIG
from sqlalchemy.orm import Mapped, mapped_column

# `users`, which these tables' owner_id refers to, must be on `Base` wherever these are used:
# the indexer process (`python -m chatapp.documents`) imports nothing else of the store's
# models when it finds the database already migrated (Alembic's env.py, which imports them
# all, then never runs), and its first flush failed with NoReferencedTableError.
from chatapp.documents.language import keywords
from chatapp.store import models as _users_table  # noqa: F401
from chatapp.store.base import Base, UtcDateTime, utcnow

NAME_CHARS = 255
STATUSES = ("queued", "reading", "ready", "failed")
STORING = "storing"  # Document.claim while the upload writes the bytes
PART_BYTES = 1024 * 1024  # the most bytes of a file in one document_files row


def _keywords(context: Any) -> str | None:
    if context.dialect.name != "sqlite":
        return None
    row = context.get_current_parameters()
    text = f"{row.get('heading') or ''}\n{row['text']}"
    return keywords(text, row.get("language") or "english")


class Document(Base):
    __tablename__ = "documents"
    __table_args__ = (
        UniqueConstraint("owner_id", "content_hash"),
        Index("ix_documents_status_updated_at", "status", "updated_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(NAME_CHARS))
    content_hash: Mapped[str] = mapped_column(String(64))
    mime: Mapped[str] = mapped_column(String(100))
    size: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    chunks: Mapped[int] = mapped_column(Integer, default=0)
    error_type: Mapped[str | None] = mapped_column(String(32))
    error: Mapped[str | None] = mapped_column(Text)
    # Times the indexer has taken it up: a document that keeps killing its indexer stops
    # being retried (claims.MAX_ATTEMPTS); a hand-back of the quick lane is not counted.
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # While an indexer reads it: until when its claim holds (renewed as it goes). A claim that
    # lapsed belongs to an indexer that died (a restart): another takes the document up again.
    lease_until: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    # Who holds it: STORING while its upload writes its bytes, else the claim id of the indexer
    # reading it (random: an id of a deleted document may come back on SQLite, a claim never
    # does, so every write of an indexer names its claim). None: nobody.
    claim: Mapped[str | None] = mapped_column(String(64))
    # An indexer's quick lane gave it up after its time there: only the other lanes take it.
    long_read: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Its language, detected when read (language.detect; None until then): its passages are
    # indexed for keyword search in it, and a question that does not say its own is searched
    # in its library's languages.
    language: Mapped[str | None] = mapped_column(String(16))
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)


class DocumentFile(Base):
    """The uploaded bytes, kept so indexing can start again after a restart or a retry: in
    parts of at most `PART_BYTES`, each written in a transaction of its own (library.add)."""

    __tablename__ = "document_files"

    document_id: Mapped[int] = mapped_column(
        ForeignKey("documents.id", ondelete="CASCADE"), primary_key=True
    )
    part: Mapped[int] = mapped_column(Integer, primary_key=True, server_default="0")
    data: Mapped[bytes] = mapped_column(LargeBinary)


class Chunk(Base):
    __tablename__ = "chunks"
    # (document_id, ordinal) unique: an indexer that resumes cannot write a passage twice.
    __table_args__ = (
        UniqueConstraint("document_id", "ordinal"),
        Index("ix_chunks_owner_id", "owner_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    document_id: Mapped[int] = mapped_column(ForeignKey("documents.id", ondelete="CASCADE"))
    # The document's owner, copied here so that search filters passages by owner without a
    # join (and the vector tables carry it too).
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    ordinal: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    heading: Mapped[str] = mapped_column(Text, default="")
    page: Mapped[int | None] = mapped_column(Integer)
    tokens: Mapped[int] = mapped_column(Integer)
    # Its document's language (language.LANGUAGES). PostgreSQL's column is a `regconfig`,
    # which its generated `search` column stems by.
    language: Mapped[str] = mapped_column(
        String(16).with_variant(REGCONFIG(), "postgresql"),
        default="english",
        server_default="english",
    )
    # SQLite only: the passage's heading and text stemmed in its language, what FTS5 indexes
    # (made at insert from the other columns; PostgreSQL stems in SQL and leaves it empty).
    keywords: Mapped[str | None] = mapped_column(Text, default=_keywords)
