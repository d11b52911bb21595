"""Chats and messages on both engines: every helper filters by owner, search finds titles and
message text, deleting a chat takes its messages (and their search entries) with it."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import func, select, text

from chatapp.store import Store
from chatapp.store import chats as store_chats
from chatapp.store.chats import NewMessage
from chatapp.store.models import Message
from chatapp.store.users import ensure_user


def _users(store: Store) -> tuple[int, int]:
    with store.session(write=True) as session:
        return ensure_user(session, "alice", "Alice").id, ensure_user(session, "bob").id


def _chat(store: Store, owner: int, title: str, *texts: str) -> str:
    with store.session(write=True) as session:
        chat = store_chats.create_chat(session, owner, title)
        roles = ["user", "assistant"]
        new = [NewMessage(roles[i % 2], t) for i, t in enumerate(texts)]
        store_chats.append_messages(session, owner, chat.id, new)
        return chat.id


def test_ensure_user_makes_one_row_per_subject_and_keeps_the_newest_name(store: Store) -> None:
    with store.session(write=True) as session:
        first = ensure_user(session, "subject-1", "Old name")
    with store.session(write=True) as session:
        again = ensure_user(session, "subject-1", "New name")
        assert again.id == first.id
    with store.session() as session:
        assert ensure_user(session, "subject-1").name == "New name"


def test_a_chat_is_found_only_with_its_owner(store: Store) -> None:
    alice, bob = _users(store)
    chat_id = _chat(store, alice, "Alice's plans", "a secret word", "noted")
    with store.session(write=True) as session:
        assert store_chats.get_chat(session, bob, chat_id) is None
        assert store_chats.messages_of(session, bob, chat_id) is None
        assert store_chats.rename_chat(session, bob, chat_id, "mine now") is None
        assert store_chats.append_messages(session, bob, chat_id, [NewMessage("user", "x")]) is None
        assert not store_chats.delete_chat(session, bob, chat_id)
        assert store_chats.list_chats(session, bob) == []
        assert store_chats.list_chats(session, bob, "secret") == []
    with store.session() as session:
        chat = store_chats.get_chat(session, alice, chat_id, messages=True)
        assert chat is not None and chat.title == "Alice's plans"
        assert [(m.position, m.role, m.content) for m in chat.messages] == [
            (0, "user", "a secret word"),
            (1, "assistant", "noted"),
        ]


def test_chats_are_listed_newest_first_and_an_append_moves_one_up(store: Store) -> None:
    alice, _ = _users(store)
    first = _chat(store, alice, "first")
    second = _chat(store, alice, "second")
    with store.session() as session:
        assert [c.id for c in store_chats.list_chats(session, alice)] == [second, first]
    with store.session(write=True) as session:
        added = store_chats.append_messages(session, alice, first, [NewMessage("user", "more")])
        assert added is not None and added[0].position == 0
    with store.session() as session:
        assert [c.id for c in store_chats.list_chats(session, alice)] == [first, second]


def test_search_finds_titles_and_message_text_by_word_prefixes(store: Store) -> None:
    alice, bob = _users(store)
    deploy = _chat(store, alice, "Kubernetes deployment", "how do I scale it?")
    soup = _chat(store, alice, "Dinner", "a recipe for onion soup", "Slice the onions thinly.")
    _chat(store, bob, "Bob's soup", "onion soup")

    def found(owner: int, query: str) -> set[str]:
        with store.session() as session:
            return {c.id for c in store_chats.list_chats(session, owner, query)}

    assert found(alice, "kube DEPL") == {deploy}
    assert found(alice, "onion") == {soup}
    assert found(alice, "slice thin") == {soup}
    assert found(alice, "scale") == {deploy}
    assert found(alice, "onion kube") == set()  # every word, in the title or one message
    assert found(alice, "") == set()
    assert found(alice, "soup\") * -- ' ;(") == {soup}  # quotes and operators only separate
    assert found(alice, "zebra") == set()
    assert found(bob, "onion") != found(alice, "onion")


def test_a_renamed_chat_is_found_by_its_new_title_only(store: Store) -> None:
    alice, _ = _users(store)
    chat_id = _chat(store, alice, "old name")
    with store.session(write=True) as session:
        renamed = store_chats.rename_chat(session, alice, chat_id, "  brand\nnew   name ")
        assert renamed is not None and renamed.title == "brand new name"
    with store.session() as session:
        assert store_chats.list_chats(session, alice, "old") == []
        assert [c.id for c in store_chats.list_chats(session, alice, "brand")] == [chat_id]


def test_deleting_a_chat_deletes_its_messages_and_their_search_entries(store: Store) -> None:
    alice, _ = _users(store)
    kept = _chat(store, alice, "kept", "walrus one")
    gone = _chat(store, alice, "gone", "walrus two", "walrus three")
    with store.session(write=True) as session:
        assert store_chats.delete_chat(session, alice, gone)
    with store.session() as session:
        assert session.scalar(select(func.count()).select_from(Message)) == 1
        assert [c.id for c in store_chats.list_chats(session, alice, "walrus")] == [kept]
        if store.dialect == "sqlite":  # the FTS5 index holds exactly the rows left
            session.execute(
                text("INSERT INTO messages_fts(messages_fts) VALUES('integrity-check')")
            )
            session.execute(text("INSERT INTO chats_fts(chats_fts) VALUES('integrity-check')"))
            assert session.scalar(text("SELECT count(*) FROM chats_fts")) == 1


def test_timestamps_come_back_as_utc(store: Store) -> None:
    alice, _ = _users(store)
    moment = dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    with store.session(write=True) as session:
        chat_id = store_chats.create_chat(session, alice, "t", created_at=moment).id
    with store.session() as session:
        chat = store_chats.get_chat(session, alice, chat_id)
        assert chat is not None
        assert chat.created_at == moment and chat.created_at.tzinfo == dt.UTC


def test_a_replys_sources_come_back_as_stored_and_none_is_sql_null(store: Store) -> None:
    """A grounded reply keeps the sources it was given (`[]`: nothing matched); a message
    without them holds SQL NULL, not JSON's 'null'. Read back by `open_chat` (the API's rows)
    and as ORM objects (the API's answer to an import), both as `convert.message_json` shows
    them."""
    from chatapp.chats import convert

    alice, _ = _users(store)
    given = [
        {"n": 1, "name": "guide.md", "page": None, "document_id": 7},
        {"n": 2, "name": "manual.pdf", "page": 3, "document_id": 8},
    ]
    cited = [{"n": 2, "document_id": 8, "name": "manual.pdf", "page": 3, "text": "Descale."}]
    with store.session(write=True) as session:
        chat_id = store_chats.create_chat(session, alice, "grounded").id
        new = [
            NewMessage("user", "How?", grounding="Passages: ..."),
            NewMessage("assistant", "Descale [2].", citations=cited, sources=given),
            NewMessage("user", "zebra?", grounding="Nothing matched."),
            NewMessage("assistant", "Not in your documents.", citations=[], sources=[]),
            NewMessage("user", "Thanks"),
            NewMessage("assistant", "You are welcome."),
        ]
        store_chats.append_messages(session, alice, chat_id, new)
    expected = [None, given, None, [], None, None]
    with store.session() as session:
        found = store_chats.open_chat(session, alice, chat_id)
        assert found is not None
        rows = found[1]
        assert [row.sources for row in rows] == expected
        nulls = session.scalars(select(Message.sources.is_(None)).order_by(Message.position)).all()
        assert nulls == [True, False, True, False, True, True]
        objects = store_chats.messages_of(session, alice, chat_id) or []
        for shown in (
            [convert.message_json(r) for r in rows],
            list(map(convert.message_json, objects)),
        ):
            assert [m.get("sources") for m in shown] == expected
            assert ["sources" in m for m in shown] == [False, True, False, True, False, False]
            assert shown[1]["citations"] == cited and shown[3]["citations"] == []


def test_a_replys_model_comes_back_as_stored(store: Store) -> None:
    """Each reply keeps the model it was asked of (None: the model service's default, SQL
    NULL), read back by `open_chat` and as ORM objects, as `convert.message_json` shows it."""
    from chatapp.chats import convert

    alice, _ = _users(store)
    with store.session(write=True) as session:
        chat_id = store_chats.create_chat(session, alice, "models").id
        new = [
            NewMessage("user", "Hi"),
            NewMessage("assistant", "Hello.", model="smollm2"),
            NewMessage("user", "And you?"),
            NewMessage("assistant", "Fine.", model="hf.co/owner/repo:Q4_K_M"),
            NewMessage("user", "Default?"),
            NewMessage("assistant", "Yes."),
        ]
        store_chats.append_messages(session, alice, chat_id, new)
    expected = [None, "smollm2", None, "hf.co/owner/repo:Q4_K_M", None, None]
    with store.session() as session:
        found = store_chats.open_chat(session, alice, chat_id)
        assert found is not None
        assert [row.model for row in found[1]] == expected
        objects = store_chats.messages_of(session, alice, chat_id) or []
        for shown in (
            [convert.message_json(r) for r in found[1]],
            list(map(convert.message_json, objects)),
        ):
            assert [m.get("model") for m in shown] == expected
            assert ["model" in m for m in shown] == [m is not None for m in expected]
