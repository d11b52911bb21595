"""Retention: chats not updated for CHAT_RETENTION_DAYS are deleted with their messages; off
by default."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from flask import Flask
from sqlalchemy import func, select

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
