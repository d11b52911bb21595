"""SQLite through sqlean's driver with sqlite-vec loaded (for the documents' vectors) keeps the
store's setup in every connection: WAL, foreign keys, the busy timeout, and writes that take the
write lock when their transaction begins, before they read (BEGIN IMMEDIATE), while reads take
none."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlean
from sqlalchemy import text

from chatapp.store import Store, migrate
from chatapp.store.database import SQLITE_BUSY_TIMEOUT_MS


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Store:
    store = Store.open(f"sqlite:///{tmp_path / 'chatapp.db'}")
    migrate.upgrade(store.engine)
    return store


def test_each_connection_has_the_stores_pragmas_and_sqlite_vec(sqlite_store: Store) -> None:
    with sqlite_store.session() as session:
        assert session.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert session.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert session.execute(text("PRAGMA busy_timeout")).scalar() == SQLITE_BUSY_TIMEOUT_MS
        assert str(session.execute(text("SELECT vec_version()")).scalar()).startswith("v")
    sqlite_store.close()


def test_a_write_takes_the_lock_at_its_start_and_a_read_takes_none(
    sqlite_store: Store, tmp_path: Path
) -> None:
    other = sqlean.connect(tmp_path / "chatapp.db", timeout=0, isolation_level=None)
    with sqlite_store.session() as session:  # a read: another process may still write
        session.execute(text("SELECT count(*) FROM users")).scalar()
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    with sqlite_store.session(write=True) as session:
        session.execute(text("SELECT count(*) FROM users")).scalar()  # read first: still locked
        with pytest.raises(sqlean.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")
    other.execute("BEGIN IMMEDIATE")
    other.execute("ROLLBACK")
    other.close()
    sqlite_store.close()
