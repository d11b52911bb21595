"""Migrations on both engines: an empty database to the newest revision, every revision down
and up again, an older database brought forward with its rows kept, and several processes
starting at once migrating exactly once."""

from __future__ import annotations

import multiprocessing

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from chatapp.store import Store, migrate

TABLES = {"users", "chats", "messages"}


def _revisions() -> list[str]:
    """Every revision, oldest first."""
    script = ScriptDirectory.from_config(migrate.config())
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def test_an_empty_database_is_migrated_to_the_newest_revision(database_url: str) -> None:
    store = Store.open(database_url)
    migrate.upgrade(store.engine)
    with store.engine.connect() as connection:
        assert migrate.current(connection) == migrate.head()
        assert set(inspect(connection).get_table_names()) >= TABLES
    migrate.upgrade(store.engine)  # again: nothing to do
    store.close()


def test_every_revision_goes_down_and_up_again(database_url: str) -> None:
    store = Store.open(database_url)
    migrate.upgrade(store.engine)
    migrate.downgrade(store.engine, "base")
    with store.engine.connect() as connection:
        assert not TABLES & set(inspect(connection).get_table_names())
    migrate.upgrade(store.engine)
    with store.engine.connect() as connection:
        assert migrate.current(connection) == migrate.head()
    store.close()


def test_an_older_database_keeps_its_rows_through_every_later_revision(database_url: str) -> None:
    revisions = _revisions()
    store = Store.open(database_url)
    migrate.upgrade(store.engine, revisions[0])
    with store.engine.begin() as connection:
        now = "2025-01-01 00:00:00"
        connection.execute(
            text("INSERT INTO users (id, subject, name, created_at) VALUES (1, 's', 'n', :t)"),
            {"t": now},
        )
        connection.execute(
            text(
                "INSERT INTO chats (id, owner_id, title, created_at, updated_at) "
                "VALUES ('c1', 1, 'old chat', :t, :t)"
            ),
            {"t": now},
        )
        connection.execute(
            text(
                "INSERT INTO messages (chat_id, owner_id, position, role, content, created_at) "
                "VALUES ('c1', 1, 0, 'user', 'kept words', :t)"
            ),
            {"t": now},
        )
    for revision in revisions[1:]:
        migrate.upgrade(store.engine, revision)
    migrate.upgrade(store.engine)
    from chatapp.store import chats

    with store.session() as session:
        assert [c.id for c in chats.list_chats(session, 1, "kept")] == ["c1"]
        assert [m.content for m in chats.messages_of(session, 1, "c1") or []] == ["kept words"]
    store.close()


def _migrate_in_a_process(url: str) -> None:
    store = Store.open(url)
    migrate.upgrade(store.engine)
    store.close()


@pytest.mark.parametrize("processes", [4])
def test_workers_starting_together_migrate_once(database_url: str, processes: int) -> None:
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=_migrate_in_a_process, args=(database_url,))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert [worker.exitcode for worker in workers] == [0] * processes
    store = Store.open(database_url)
    with store.engine.connect() as connection:
        rows = connection.execute(text("SELECT version_num FROM alembic_version")).all()
        assert rows == [(migrate.head(),)]
    store.close()


def test_message_sources_come_and_go_with_0006_and_search_keeps_working(database_url: str) -> None:
    """0006 on a database of 0005: a new, empty `messages.sources` (the replies stored before
    have none); down again it is gone, and on SQLite the messages' search triggers stay (a
    table copy would drop them), so a message stored after the downgrade is still found."""
    store = Store.open(database_url)
    migrate.upgrade(store.engine, "0005")
    now = "2025-01-01 00:00:00"
    with store.engine.begin() as connection:
        connection.execute(
            text("INSERT INTO users (id, subject, name, created_at) VALUES (1, 's', 'n', :t)"),
            {"t": now},
        )
        connection.execute(
            text(
                "INSERT INTO chats (id, owner_id, title, created_at, updated_at) "
                "VALUES ('c1', 1, 'old chat', :t, :t)"
            ),
            {"t": now},
        )
        connection.execute(
            text(
                "INSERT INTO messages (chat_id, owner_id, position, role, content, created_at) "
                "VALUES ('c1', 1, 0, 'assistant', 'an older reply', :t)"
            ),
            {"t": now},
        )
    migrate.upgrade(store.engine, "0006")
    with store.engine.connect() as connection:
        columns = {c["name"]: c for c in inspect(connection).get_columns("messages")}
        assert columns["sources"]["nullable"]
        assert connection.execute(text("SELECT sources FROM messages")).scalars().all() == [None]
    migrate.downgrade(store.engine, "0005")
    with store.engine.begin() as connection:
        assert "sources" not in {c["name"] for c in inspect(connection).get_columns("messages")}
        connection.execute(
            text(
                "INSERT INTO messages (chat_id, owner_id, position, role, content, created_at) "
                "VALUES ('c1', 1, 1, 'user', 'stored after the downgrade', :t)"
            ),
            {"t": now},
        )
    from chatapp.store import chats

    with store.session() as session:
        assert [c.id for c in chats.list_chats(session, 1, "downgrade")] == ["c1"]
    store.close()


def test_message_model_comes_and_goes_with_0007_and_search_keeps_working(database_url: str) -> None:
    """0007 on a database of 0006: a new, empty `messages.model` (the replies stored before
    name none); down again it is gone, and on SQLite the messages' search triggers stay (a
    table copy would drop them), so a message stored after the downgrade is still found."""
    store = Store.open(database_url)
    migrate.upgrade(store.engine, "0006")
    now = "2025-01-01 00:00:00"
    with store.engine.begin() as connection:
        connection.execute(
            text("INSERT INTO users (id, subject, name, created_at) VALUES (1, 's', 'n', :t)"),
            {"t": now},
        )
        connection.execute(
            text(
                "INSERT INTO chats (id, owner_id, title, created_at, updated_at) "
                "VALUES ('c1', 1, 'old chat', :t, :t)"
            ),
            {"t": now},
        )
        connection.execute(
            text(
                "INSERT INTO messages (chat_id, owner_id, position, role, content, created_at) "
                "VALUES ('c1', 1, 0, 'assistant', 'an older reply', :t)"
            ),
            {"t": now},
        )
    migrate.upgrade(store.engine, "0007")
    with store.engine.begin() as connection:
        columns = {c["name"]: c for c in inspect(connection).get_columns("messages")}
        assert columns["model"]["nullable"]
        assert connection.execute(text("SELECT model FROM messages")).scalars().all() == [None]
        # An id as long as the column takes (an OpenAI-compatible server's may be long)
        connection.execute(text("UPDATE messages SET model = :m"), {"m": "m" * 256})
    migrate.downgrade(store.engine, "0006")
    with store.engine.begin() as connection:
        assert "model" not in {c["name"] for c in inspect(connection).get_columns("messages")}
        assert connection.execute(text("SELECT content FROM messages")).scalars().all() == [
            "an older reply"
        ]
        connection.execute(
            text(
                "INSERT INTO messages (chat_id, owner_id, position, role, content, created_at) "
                "VALUES ('c1', 1, 1, 'user', 'stored after the downgrade', :t)"
            ),
            {"t": now},
        )
    from chatapp.store import chats

    with store.session() as session:
        assert [c.id for c in chats.list_chats(session, 1, "downgrade")] == ["c1"]
    store.close()


def test_the_encoders_probe_comes_and_goes_with_0008(database_url: str) -> None:
    """0008 on a library of 0007: `vector_space.probe`, empty for the library indexed before it
    (which takes the encoder of its first check); down again it is gone, the width kept."""
    store = Store.open(database_url)
    migrate.upgrade(store.engine, "0007")
    with store.engine.begin() as connection:
        connection.execute(text("INSERT INTO vector_space (id, dimensions) VALUES (1, 384)"))
    migrate.upgrade(store.engine, "0008")
    with store.engine.begin() as connection:
        columns = {c["name"]: c for c in inspect(connection).get_columns("vector_space")}
        assert columns["probe"]["nullable"]
        rows = connection.execute(text("SELECT dimensions, probe FROM vector_space")).all()
        assert [tuple(row) for row in rows] == [(384, None)]
        connection.execute(text("UPDATE vector_space SET probe = :p"), {"p": "[0.6, 0.8]"})
    migrate.downgrade(store.engine, "0007")
    with store.engine.connect() as connection:
        columns = {c["name"]: c for c in inspect(connection).get_columns("vector_space")}
        assert "probe" not in columns
        assert connection.execute(text("SELECT dimensions FROM vector_space")).scalar() == 384
    store.close()
