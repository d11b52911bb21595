"""The database: one engine per process, and the sessions every query runs in.

`Store.open(url)` makes the engine for `DATABASE_URL` (`sqlite:///PATH` or
`postgresql+psycopg://...`). SQLite is set up for several gunicorn workers sharing one file:
WAL (readers never wait for the writer), foreign keys on (SQLite leaves them off), and a busy
timeout so a writer waits for another's short transaction instead of failing at once.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, make_url
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, sessionmaker

from chatapp.store import vectors_sqlite

SQLITE_FILE = "chatapp.db"
# How long a SQLite writer waits for another process's write to finish, in milliseconds.
SQLITE_BUSY_TIMEOUT_MS = 10_000
DIALECTS = ("sqlite", "postgresql")
WRITE_OPTION = "chatapp_write"


class DatabaseUrlError(ValueError):
    """DATABASE_URL names an engine or a form the app does not take."""


# What says "another writer holds it, try again": SQLite's SQLITE_BUSY and SQLITE_LOCKED (its
# busy timeout ran out), PostgreSQL's lock_not_available, deadlock_detected and
# serialization_failure.
_SQLITE_BUSY = {5, 6}
_POSTGRESQL_BUSY = {"55P03", "40P01", "40001"}


def busy(error: BaseException) -> bool:
    """Whether `error` (a SQLAlchemy error) says the database was busy, not broken: worth a 503
    and a retry, not a 500."""
    original = getattr(error, "orig", None)
    code = getattr(original, "sqlite_errorcode", None)
    if code is not None:
        return int(code) & 0xFF in _SQLITE_BUSY  # extended codes keep the primary in the low byte
    return getattr(original, "sqlstate", None) in _POSTGRESQL_BUSY


def default_url(data_dir: str | Path) -> str:
    """The SQLite file in DATA_DIR (made if missing)."""
    folder = Path(data_dir).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / SQLITE_FILE}"


def check_url(raw: str) -> URL:
    """`raw` parsed; a SQLite URL must name a file (several processes share it), PostgreSQL
    goes through psycopg 3."""
    try:
        url = make_url(raw)
    except Exception:
        raise DatabaseUrlError("DATABASE_URL is not a database URL") from None
    backend = url.get_backend_name()
    if backend not in DIALECTS:
        raise DatabaseUrlError(f"DATABASE_URL must be sqlite or postgresql, got {backend!r}")
    if backend == "sqlite":
        if not url.database or url.database == ":memory:":
            raise DatabaseUrlError("DATABASE_URL must name a SQLite file: sqlite:///PATH")
        return url.set(drivername="sqlite+pysqlite")
    return url.set(drivername="postgresql+psycopg")


def _sqlite_pragmas(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
    # The driver's own transaction handling off: _sqlite_begin says BEGIN itself.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    # WAL's recommended durability: a commit survives a crash of the process, and the last
    # ones may be lost only with the machine's power.
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _sqlite_begin(connection: Connection) -> None:
    # A transaction that writes takes the write lock first (BEGIN IMMEDIATE), waiting up to
    # the busy timeout for another process's; a deferred one that read first and then wrote
    # would fail at once with SQLITE_BUSY when another process wrote in between.
    write = connection.get_execution_options().get(WRITE_OPTION, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def make_engine(raw_url: str) -> Engine:
    url = check_url(raw_url)
    if url.get_backend_name() == "sqlite":
        Path(url.database or "").parent.mkdir(parents=True, exist_ok=True)
        # sqlean's sqlite3, which loads extensions; sqlite-vec for the documents' vectors.
        engine = create_engine(url, module=vectors_sqlite.driver())
        event.listen(engine, "connect", vectors_sqlite.load)
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    # pre_ping: a connection the server closed (a restart, an idle timeout) is replaced, not
    # handed to a request.
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)


class Store:
    """The engine and a session factory; `app.extensions["store"]` holds the app's."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self._reads = sessionmaker(engine, expire_on_commit=False)
        self._writes = sessionmaker(
            engine.execution_options(**{WRITE_OPTION: True}), expire_on_commit=False
        )

    @classmethod
    def open(cls, url: str) -> Store:
        return cls(make_engine(url))

    @contextlib.contextmanager
    def session(self, *, write: bool = False) -> Iterator[Session]:
        """One transaction: committed when the block ends, rolled back if it raises. Say
        `write=True` for one that writes (on SQLite it takes the write lock at its start)."""
        sessions = self._writes if write else self._reads
        with sessions() as session, session.begin():
            yield session

    def close(self) -> None:
        self.engine.dispose()
