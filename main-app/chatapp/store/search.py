"""Full-text search over one user's chats: their titles and their messages' text.

What a person types becomes words (letters and digits; everything else separates them), each
matched as a prefix, all of them required: "kube depl" finds a chat that mentions "Kubernetes
deployment". The words go into the engine's own query language quoted (FTS5: `"word"*`;
PostgreSQL: `word:*` in `to_tsquery`, where `\\w` characters are never operators), so no input
is a syntax error. The search structures are the migration's (0001).
"""

from __future__ import annotations

import re

from sqlalchemy import ColumnElement, exists, func, literal_column, or_, select, text
from sqlalchemy.orm import Session

from chatapp.store.models import Chat, Message

WORD = re.compile(r"\w+")
MAX_WORDS = 16


def words(query: str) -> list[str]:
    """The words of a search, lower-cased, at most MAX_WORDS."""
    return [word.lower() for word in WORD.findall(query)][:MAX_WORDS]


def matches(session: Session, query: str) -> ColumnElement[bool] | None:
    """A condition on `Chat` that holds when its title, or one of its messages, holds every
    word of `query`; None when the query has no words (then nothing matches)."""
    found = words(query)
    if not found:
        return None
    if session.get_bind().dialect.name == "postgresql":
        return _postgresql(found)
    return _sqlite(found)


def _postgresql(found: list[str]) -> ColumnElement[bool]:
    q = func.to_tsquery(literal_column("'simple'::regconfig"), " & ".join(f"{w}:*" for w in found))
    in_message = exists(
        select(1)
        .select_from(Message)
        .where(Message.chat_id == Chat.id, literal_column("messages.search").op("@@")(q))
    )
    return or_(literal_column("chats.search").op("@@")(q), in_message)


def _sqlite(found: list[str]) -> ColumnElement[bool]:
    fts = " ".join(f'"{word}"*' for word in found)
    titles = text("SELECT chat_id FROM chats_fts WHERE chats_fts MATCH :fts")
    messages = text("SELECT rowid FROM messages_fts WHERE messages_fts MATCH :fts")
    in_message = select(Message.chat_id).where(Message.id.in_(messages.bindparams(fts=fts)))
    return or_(Chat.id.in_(titles.bindparams(fts=fts)), Chat.id.in_(in_message))
