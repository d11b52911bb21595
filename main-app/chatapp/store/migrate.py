"""Migrations: `upgrade(engine)` brings the database to the newest revision, once, however many
processes start together.

create_app calls it (each gunicorn worker builds its app after the fork, so several call it at
the same moment): the first takes a lock, migrates and lets go; the others wait for the lock,
find nothing to do and go on. PostgreSQL: a session advisory lock (`pg_advisory_lock`) on the
connection that migrates, so several instances on one server serialise too. SQLite: an
exclusive `flock` on a file beside the database (`PATH-migrate.lock`), since SQLite's own locks
do not span Alembic's separate statements. The revisions live in `migrations/versions/`, one
chain for every package (`chatapp/store/__init__.py` says how to add one).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

SCRIPT_LOCATION = "chatapp.store:migrations"
# The modules that define tables on `Base`: imported before a comparison of the models with the
# database (autogenerate). A package that adds tables adds its models module here.
MODEL_MODULES = ["chatapp.store.models", "chatapp.documents.models"]
# pg_advisory_lock's key: any fixed 64-bit number, the same in every process of the app.
ADVISORY_LOCK_KEY = 0x63686174617070  # "chatapp"


def import_models() -> None:
    for name in MODEL_MODULES:
        importlib.import_module(name)


def config(connection: Connection | None = None) -> Config:
    """Alembic's configuration without an alembic.ini: the scripts, and the connection env.py
    migrates through."""
    alembic_config = Config()
    alembic_config.set_main_option("script_location", SCRIPT_LOCATION)
    alembic_config.attributes["connection"] = connection
    return alembic_config


def head() -> str | None:
    """The newest revision in the scripts."""
    return ScriptDirectory.from_config(config()).get_current_head()


def current(connection: Connection) -> str | None:
    """The revision the database is at (None: empty)."""
    return MigrationContext.configure(connection).get_current_revision()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _advisory_lock(connection: Connection) -> Iterator[None]:
    connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
    connection.commit()  # the lock is the session's: it outlives this transaction
    try:
        yield
    finally:
        connection.rollback()
        connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": ADVISORY_LOCK_KEY})
        connection.commit()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate to `revision` under the lock; a no-op when the database is already there."""
    if engine.dialect.name == "sqlite":
        lock_path = Path(f"{engine.url.database}-migrate.lock")
        with _file_lock(lock_path), engine.connect() as connection:
            _upgrade(connection, revision)
        return
    with engine.connect() as connection, _advisory_lock(connection):
        _upgrade(connection, revision)


def _upgrade(connection: Connection, revision: str) -> None:
    target = head() if revision == "head" else revision
    if current(connection) == target:
        connection.rollback()
        return
    connection.rollback()
    command.upgrade(config(connection), revision)
    connection.commit()


def downgrade(engine: Engine, revision: str) -> None:
    """For tests and operators: back to `revision` (`base`: empty)."""
    with engine.connect() as connection:
        command.downgrade(config(connection), revision)
        connection.commit()
