"""Full-text search over one user's chats: their titles and their messages' text.

What a person types becomes words (letters and digits; everything else separates them), each
matched as a prefix, all of them required: "kube depl" finds a chat that mentions "Kubernetes
deployment". The words go into the engine's own query language quoted (FTS5: `"word"*`;
PostgreSQL: `word:*` in `to_tsquery`, where `\\w` characters are never operators), so no input
is a syntax error. The search structures are the migration's (0001).
"""

from __future__ import annotations

import re

from sqlalchemy import ColumnElement, func, literal_column, or_, select, text
from sqlalchemy.orm import Session

from chatapp.store.models import Chat, Message

WORD = re.compile(r"\w+")
MAX_WORDS = 16


def words(query: str) -> list[str]:
    """The words of a search, lower-cased, at most MAX_WORDS."""
    return [word.lower() for word in WORD.findall(query)][:MAX_WORDS]


def matches(session: Session, owner_id: int, query: str) -> ColumnElement[bool] | None:
    """A condition on the owner's `Chat`s that holds when its title, or one of its messages,
    holds every word of `query`; None when the query has no words (then nothing matches). Only
    the owner's messages are read: the engines narrow by `owner_id` before they match words."""
    found = words(query)
    if not found:
        return None
    if session.get_bind().dialect.name == "postgresql":
        return _postgresql(owner_id, found)
    return _sqlite(owner_id, found)


def _postgresql(owner_id: int, found: list[str]) -> ColumnElement[bool]:
    q = func.to_tsquery(literal_column("'simple'::regconfig"), " & ".join(f"{w}:*" for w in found))
    in_message = select(Message.chat_id).where(
        Message.owner_id == owner_id, literal_column("messages.search").op("@@")(q)
    )
    return or_(literal_column("chats.search").op("@@")(q), Chat.id.in_(in_message))


def _sqlite(owner_id: int, found: list[str]) -> ColumnElement[bool]:
    # The owner's id as an FTS5 column filter, then each word as a prefix of the text column.
    def fts(column: str) -> str:
        return " AND ".join([f'owner_id : "{owner_id}"', *(f'{column} : "{w}"*' for w in found)])

    titles = text("SELECT chat_id FROM chats_fts WHERE chats_fts MATCH :in_titles")
    messages = text("SELECT rowid FROM messages_fts WHERE messages_fts MATCH :in_messages")
    in_message = select(Message.chat_id).where(
        Message.id.in_(messages.bindparams(in_messages=fts("content")))
    )
    return or_(Chat.id.in_(titles.bindparams(in_titles=fts("title"))), Chat.id.in_(in_message))
