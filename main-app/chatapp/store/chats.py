"""Chats and their messages, always one owner's: every function takes the owner's user id and
filters by it in SQL, so another user's chat id finds nothing (the routes answer 404).

Call them inside `Store.session()` (`write=True` for those that change something).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import Row, delete, func, select
from sqlalchemy.orm import Session, selectinload

from chatapp.store import search
from chatapp.store.base import utcnow
from chatapp.store.models import TITLE_CHARS, Chat, Message

LIST_LIMIT = 500
# A row of plain columns, whatever they are (open_chat's).
AnyRow = Row[*tuple[Any, ...]]


@dataclass
class NewMessage:
    """A message to append to a chat."""

    role: str
    content: str
    images: list[str] | None = None
    finish: str | None = None
    citations: list[dict[str, Any]] | None = None
    sources: list[dict[str, Any]] | None = None
    grounding: str | None = None
    model: str | None = None
    created_at: dt.datetime = field(default_factory=utcnow)


def clean_title(title: str) -> str:
    """A title as stored: one line, trimmed, at most TITLE_CHARS characters."""
    return " ".join(title.split())[:TITLE_CHARS]


def list_chats(
    session: Session, owner_id: int, query: str | None = None, limit: int = LIST_LIMIT
) -> Sequence[Chat]:
    """The owner's chats, newest first; with `query`, those whose title or messages match it
    (`chatapp.store.search`)."""
    statement = select(Chat).where(Chat.owner_id == owner_id)
    if query is not None:
        condition = search.matches(session, owner_id, query)
        if condition is None:
            return []
        statement = statement.where(condition)
    statement = statement.order_by(Chat.updated_at.desc(), Chat.id).limit(limit)
    return session.scalars(statement).all()


def get_chat(
    session: Session, owner_id: int, chat_id: str, *, messages: bool = False, lock: bool = False
) -> Chat | None:
    """The owner's chat with this id, None for any other (someone else's, or none). With
    `messages`, its messages are loaded in order; with `lock`, its row is locked until the
    transaction ends (PostgreSQL; a SQLite write transaction holds the whole file)."""
    statement = select(Chat).where(Chat.id == chat_id, Chat.owner_id == owner_id)
    if messages:
        statement = statement.options(selectinload(Chat.messages))
    if lock and session.get_bind().dialect.name == "postgresql":
        statement = statement.with_for_update()
    return session.scalars(statement).one_or_none()


def create_chat(
    session: Session,
    owner_id: int,
    title: str = "",
    *,
    created_at: dt.datetime | None = None,
    updated_at: dt.datetime | None = None,
) -> Chat:
    now = utcnow()
    chat = Chat(
        owner_id=owner_id,
        title=clean_title(title),
        created_at=created_at or now,
        updated_at=updated_at or created_at or now,
    )
    session.add(chat)
    session.flush()
    return chat


def rename_chat(session: Session, owner_id: int, chat_id: str, title: str) -> Chat | None:
    chat = get_chat(session, owner_id, chat_id)
    if chat is not None:
        chat.title = clean_title(title)
        chat.updated_at = utcnow()
    return chat


def delete_chat(session: Session, owner_id: int, chat_id: str) -> bool:
    """Whether the owner had such a chat (its messages go with it: ON DELETE CASCADE)."""
    result = session.execute(delete(Chat).where(Chat.id == chat_id, Chat.owner_id == owner_id))
    return bool(result.rowcount)  # type: ignore[attr-defined]


def append_messages(
    session: Session, owner_id: int, chat_id: str, new: Sequence[NewMessage]
) -> list[Message] | None:
    """Add messages at the end of the owner's chat (None if it is not theirs) and mark it
    updated. The chat's row is locked first, so two appends never take the same position."""
    chat = get_chat(session, owner_id, chat_id, lock=True)
    if chat is None:
        return None
    last = session.scalar(select(func.max(Message.position)).where(Message.chat_id == chat_id))
    position = -1 if last is None else last
    added = []
    for message in new:
        position += 1
        added.append(
            Message(
                chat_id=chat_id,
                owner_id=owner_id,
                position=position,
                role=message.role,
                content=message.content,
                images=message.images or None,
                finish=message.finish,
                citations=message.citations,
                sources=message.sources,
                grounding=message.grounding,
                model=message.model,
                created_at=message.created_at,
            )
        )
    session.add_all(added)
    chat.updated_at = max(utcnow(), chat.updated_at)
    session.flush()
    return added


# What `cut_messages` did: cut (or nothing to cut), no such chat of the owner's, the chat holds
# another number of messages than the caller saw, or `start` is not one of the person's turns.
CutOutcome = Literal["cut", "missing", "stale", "not_a_question"]


def cut_messages(
    session: Session, owner_id: int, chat_id: str, start: int, seen: int
) -> CutOutcome:
    """Delete the owner's chat's messages from position `start` on, so the chat continues from
    there (the page's edit or regenerate), if the chat still holds `seen` messages, as the
    caller last saw it, and `start` is a user message (or the end). Under the chat's row lock,
    as `append_messages`, so a turn being stored lands wholly before or after the check."""
    chat = get_chat(session, owner_id, chat_id, lock=True)
    if chat is None:
        return "missing"
    held = session.scalar(
        select(func.count())
        .select_from(Message)
        .where(Message.chat_id == chat_id, Message.owner_id == owner_id)
    )
    if held != seen:
        return "stale"
    if start == seen:
        return "cut"  # nothing after the end
    role = session.scalar(
        select(Message.role).where(
            Message.chat_id == chat_id, Message.owner_id == owner_id, Message.position == start
        )
    )
    if role != "user":
        return "not_a_question"
    session.execute(
        delete(Message).where(
            Message.chat_id == chat_id, Message.owner_id == owner_id, Message.position >= start
        )
    )
    chat.updated_at = max(utcnow(), chat.updated_at)
    return "cut"


def open_chat(
    session: Session, owner_id: int, chat_id: str
) -> tuple[AnyRow, Sequence[AnyRow]] | None:
    """The owner's chat as plain rows, in two queries and without an object per message (a
    chat of 200 reads several times faster than through `Chat.messages`): its summary (`id`,
    `title`, `created_at`, `updated_at`) and its messages in order (`role`, `content`,
    `images`, `finish`, `citations`, `sources`, `grounding`, `model`, `created_at`). None if it
    is not theirs."""
    summary = session.execute(
        select(Chat.id, Chat.title, Chat.created_at, Chat.updated_at).where(
            Chat.id == chat_id, Chat.owner_id == owner_id
        )
    ).one_or_none()
    if summary is None:
        return None
    columns = (
        Message.role,
        Message.content,
        Message.images,
        Message.finish,
        Message.citations,
        Message.sources,
        Message.grounding,
        Message.model,
        Message.created_at,
    )
    statement = select(*columns).where(Message.chat_id == chat_id).order_by(Message.position)
    return summary, session.execute(statement).all()


def messages_of(session: Session, owner_id: int, chat_id: str) -> Sequence[Message] | None:
    """The messages of the owner's chat in order; None if it is not theirs."""
    if get_chat(session, owner_id, chat_id) is None:
        return None
    statement = select(Message).where(Message.chat_id == chat_id).order_by(Message.position)
    return session.scalars(statement).all()
