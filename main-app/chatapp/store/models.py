"""The accounts and chats tables: `users`, `chats`, `messages`.

The full-text search columns are not mapped here: they differ by engine (SQLite: the FTS5
tables `chats_fts` and `messages_fts`, kept by triggers; PostgreSQL: a generated `tsvector`
column `search` on `chats` and `messages`, each with a GIN index) and only the migration and
`chatapp.store.search` know them.
"""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Any

from sqlalchemy import JSON, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from chatapp.store.base import Base, UtcDateTime, utcnow

# Bounds the columns hold (the routes check them first, with a sentence).
SUBJECT_CHARS = 255
NAME_CHARS = 255
TITLE_CHARS = 200
ROLE_CHARS = 16
FINISH_CHARS = 32
# A model's id as the model service names it (our sidecar's are at most 128 characters; an
# OpenAI-compatible server's, such as Ollama's `hf.co/owner/repo:tag`, may be longer).
MODEL_CHARS = 256


def new_chat_id() -> str:
    """A chat's id: 128 random bits, URL-safe (22 characters). Guessing one is hopeless, and
    every query filters by owner anyway."""
    return secrets.token_urlsafe(16)


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # The identity provider's principal id (Easy Auth's X-MS-CLIENT-PRINCIPAL-ID, a proxy's
    # header), or "local" under AUTH_MODE=none.
    subject: Mapped[str] = mapped_column(String(SUBJECT_CHARS), unique=True)
    name: Mapped[str | None] = mapped_column(String(NAME_CHARS))
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)


class Chat(Base):
    __tablename__ = "chats"
    __table_args__ = (Index("ix_chats_owner_id_updated_at", "owner_id", "updated_at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_chat_id)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    title: Mapped[str] = mapped_column(String(TITLE_CHARS), default="")
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)

    messages: Mapped[list[Message]] = relationship(
        back_populates="chat",
        order_by="Message.position",
        cascade="all, delete-orphan",
        passive_deletes=True,
    )


class Message(Base):
    __tablename__ = "messages"
    # Also the index a chat's messages are read in order by.
    __table_args__ = (UniqueConstraint("chat_id", "position"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    chat_id: Mapped[str] = mapped_column(ForeignKey("chats.id", ondelete="CASCADE"))
    # The chat's owner, repeated (a chat never changes hands): a search reads only the owner's
    # messages (SQLite's FTS5 matches it as a column, PostgreSQL by its index) instead of every
    # user's that hold the word, then filtering them out (about 50x faster at 100k messages).
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(ROLE_CHARS))  # system, user, assistant
    content: Mapped[str] = mapped_column(Text, default="")
    # The user's images as data: URLs, in their order (at most MAX_IMAGES per chat, each at
    # most MAX_IMAGE_BYTES: the bounds POST /chat checks).
    images: Mapped[list[str] | None] = mapped_column(JSON)
    # How a reply ended: stop, length, or the error type that cut it off (upstream_timeout,
    # upstream_disconnected, reply_time_limit, client_gone); None for the person's turns.
    finish: Mapped[str | None] = mapped_column(String(FINISH_CHARS))
    # The sources a grounded reply cites (the documents feature fills it).
    citations: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    # Every source a grounded reply was given, cited or not ({n, name, page, document_id}, the
    # stream's first line; [] when nothing matched), so the page lists them again when the
    # chat is opened; None for a reply that was not grounded: SQL NULL (`none_as_null`; plain
    # JSON writes None as the JSON text 'null', as `images` and `citations` hold it).
    sources: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON(none_as_null=True))
    # The model a reply was asked of (`POST /chat`'s `model`, an id the model service lists);
    # None for one asked of the model service's default, and for the person's turns.
    model: Mapped[str | None] = mapped_column(String(MODEL_CHARS))
    # A grounded user turn's passages, as it was sent with them
    # (chatapp/documents/search/grounding.py): the chat's later turns put them back from here,
    # never from the request.
    grounding: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)

    chat: Mapped[Chat] = relationship(back_populates="messages")
