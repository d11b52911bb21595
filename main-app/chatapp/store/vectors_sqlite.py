"""SQLite with sqlite-vec: the driver the store's engine uses, and the extension in every
connection.

sqlite-vec (the documents' vectors, chatapp/documents/index/sqlite.py) is a loadable extension,
and many Python builds cannot load one (pyenv's and some distributions' `sqlite3` lack
`enable_load_extension`). `sqlean.py` is the standard `sqlite3` module built with a recent
SQLite (FTS5 included) that always can: the engine uses it (`driver()`), and `load` puts
sqlite-vec into each new connection, so every process and thread finds `vec0` there.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any


def driver() -> ModuleType:
    """The DB-API module for SQLite: sqlean's `sqlite3`."""
    import sqlean

    return sqlean


def load(dbapi_connection: Any, _record: Any = None) -> None:
    """An engine `connect` listener: sqlite-vec into the new connection."""
    import sqlite_vec

    dbapi_connection.enable_load_extension(True)
    try:
        sqlite_vec.load(dbapi_connection)
    finally:
        dbapi_connection.enable_load_extension(False)
