"""Retention: chats and documents not updated for CHAT_RETENTION_DAYS are deleted, with their
messages, kept bytes and passages; off by default."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import numpy as np
from flask import Flask
from sqlalchemy import func, select

from chatapp.documents import library
from chatapp.documents.index.search_index import index_for
from chatapp.documents.models import Chunk, Document, DocumentFile
from chatapp.documents.reading.formats import Limits
from chatapp.store import Store
from chatapp.store import chats as store_chats
from chatapp.store.chats import NewMessage
from chatapp.store.models import Chat, Message
from chatapp.store.retention import Retention
from chatapp.store.users import ensure_user

NOW = dt.datetime.now(dt.UTC)


def _chat_updated(store: Store, days_ago: float, subject: str = "alice") -> str:
    moment = NOW - dt.timedelta(days=days_ago)
    with store.session(write=True) as session:
        owner = ensure_user(session, subject).id
        chat = store_chats.create_chat(session, owner, f"{days_ago} days", created_at=moment)
        store_chats.append_messages(session, owner, chat.id, [NewMessage("user", "hello")])
        chat.updated_at = moment
        return chat.id


def _left(store: Store) -> set[str]:
    with store.session() as session:
        return set(session.scalars(select(Chat.id)))


def test_chats_older_than_the_retention_go_with_their_messages(store: Store) -> None:
    old = _chat_updated(store, 31)
    _chat_updated(store, 45, subject="bob")
    recent = _chat_updated(store, 29)
    retention = Retention(store, days=30)
    assert retention.maybe_sweep() == 2
    assert _left(store) == {recent}
    with store.session() as session:
        assert session.scalar(select(func.count()).select_from(Message)) == 1
        assert store_chats.list_chats(session, 1, "hello") != []
    assert old not in _left(store)
    assert retention.maybe_sweep() == 0  # not again within the hour


def _document_updated(store: Store, days_ago: float, subject: str = "alice") -> int:
    """A document, its bytes and one passage with its vector, last updated `days_ago`."""
    with store.session(write=True) as session:
        owner = ensure_user(session, subject).id
    data = f"descaling the kettle, {days_ago} days".encode()
    limits = Limits(max_bytes=1000, max_pages=10)
    document_id = library.add(store, owner, "notes.txt", data, "text/plain", limits).document.id
    index = index_for(store)
    with store.session(write=True) as session:
        index.prepare(session, 4)
    with store.session(write=True) as session:
        chunk = Chunk(
            document_id=document_id, owner_id=owner, ordinal=0, text=data.decode(), tokens=8
        )
        session.add(chunk)
        session.flush()
        index.add(session, owner, [(chunk.id, np.array([1, 0, 0, 0], np.float32))])
        document = session.get(Document, document_id)
        assert document is not None
        document.status, document.updated_at = "ready", NOW - dt.timedelta(days=days_ago)
    return document_id


def test_documents_older_than_the_retention_go_with_their_bytes_and_passages(
    store: Store,
) -> None:
    """Issue 58: CHAT_RETENTION_DAYS never removed a document, its kept bytes or passages."""
    _document_updated(store, 31)
    _document_updated(store, 45, subject="bob")
    recent = _document_updated(store, 29)
    assert Retention(store, days=30).maybe_sweep() == 2
    index = index_for(store)
    with store.session() as session:
        assert list(session.scalars(select(Document.id))) == [recent]
        assert list(session.scalars(select(DocumentFile.document_id).distinct())) == [recent]
        assert list(session.scalars(select(Chunk.document_id))) == [recent]
        alice, bob = (ensure_user(session, name).id for name in ("alice", "bob"))
        vector = np.array([1, 0, 0, 0], np.float32)
        assert len(index.dense(session, alice, vector, 10)) == 1
        assert index.dense(session, bob, vector, 10) == []
        assert len(index.keyword(session, alice, "kettle", 10)) == 1
        assert index.keyword(session, bob, "kettle", 10) == []


def test_retention_is_off_by_default(
    make_app: Callable[..., Flask], database_url: str, store: Store
) -> None:
    _chat_updated(store, 3650)
    make_app(DATABASE_URL=database_url)
    assert len(_left(store)) == 1
    assert Retention(store, days=None).maybe_sweep() == 0


def test_the_app_sweeps_when_it_starts(
    make_app: Callable[..., Flask], database_url: str, store: Store
) -> None:
    _chat_updated(store, 10)
    kept = _chat_updated(store, 1)
    make_app(DATABASE_URL=database_url, CHAT_RETENTION_DAYS=7)
    assert _left(store) == {kept}
