"""`cut_messages` on both engines: it waits for a turn being stored (the chat's row lock, or
SQLite's write lock) and then sees the chat as it is, so a cut and an append never interleave;
the owner filter holds in the statement itself."""

from __future__ import annotations

import threading

from chatapp.store import Store
from chatapp.store import chats as store_chats
from chatapp.store.chats import NewMessage
from chatapp.store.users import ensure_user


def _chat(store: Store, owner: int, turns: int) -> str:
    with store.session(write=True) as session:
        chat = store_chats.create_chat(session, owner, "t")
        new = [NewMessage(("user", "assistant")[i % 2], f"m{i}") for i in range(2 * turns)]
        store_chats.append_messages(session, owner, chat.id, new)
        return chat.id


def _contents(store: Store, owner: int, chat_id: str) -> list[str]:
    with store.session() as session:
        return [m.content for m in store_chats.messages_of(session, owner, chat_id) or []]


def test_a_cut_waits_for_a_turn_being_stored_and_then_sees_it(store: Store) -> None:
    with store.session(write=True) as session:
        owner = ensure_user(session, "alice").id
    chat_id = _chat(store, owner, 2)
    locked, release = threading.Event(), threading.Event()

    def store_a_turn() -> None:
        with store.session(write=True) as session:
            turn = [NewMessage("user", "late"), NewMessage("assistant", "late reply")]
            store_chats.append_messages(session, owner, chat_id, turn)
            locked.set()
            release.wait(10)

    writer = threading.Thread(target=store_a_turn)
    writer.start()
    assert locked.wait(10)
    outcome: list[str] = []

    def cut() -> None:
        with store.session(write=True) as session:
            outcome.append(store_chats.cut_messages(session, owner, chat_id, 2, 4))

    cutter = threading.Thread(target=cut)
    cutter.start()
    cutter.join(0.5)
    assert outcome == []  # waiting for the turn's transaction
    release.set()
    writer.join(10)
    cutter.join(10)
    assert outcome == ["stale"]  # the page saw 4 messages; the chat now holds 6
    assert _contents(store, owner, chat_id) == ["m0", "m1", "m2", "m3", "late", "late reply"]


def test_a_cut_then_a_turn_goes_on_from_the_cut(store: Store) -> None:
    with store.session(write=True) as session:
        owner = ensure_user(session, "alice").id
        other = ensure_user(session, "bob").id
    chat_id = _chat(store, owner, 3)
    with store.session(write=True) as session:
        assert store_chats.cut_messages(session, other, chat_id, 2, 6) == "missing"
        assert store_chats.cut_messages(session, owner, chat_id, 3, 6) == "not_a_question"
        assert store_chats.cut_messages(session, owner, chat_id, 2, 6) == "cut"
    with store.session(write=True) as session:
        store_chats.append_messages(
            session, owner, chat_id, [NewMessage("user", "new"), NewMessage("assistant", "r")]
        )
    assert _contents(store, owner, chat_id) == ["m0", "m1", "new", "r"]
