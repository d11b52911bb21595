"""The app's database: accounts, chats and their messages, one schema on SQLite and PostgreSQL.

- `chatapp.store.base`: `Base`, the declarative base of every table (one `MetaData`, named
  constraints), and `UtcDateTime`.
- `chatapp.store.database`: `Store` (`Store.open(url)`; `with store.session() as s:` is one
  transaction, `session(write=True)` for one that writes). `create_app` keeps the app's in
  `app.extensions["store"]`; `current_store()` reads it inside a request.
- `chatapp.store.models`: `User`, `Chat`, `Message`. `chatapp.store.users.ensure_user`,
  `chatapp.store.chats` (every query takes the owner's user id and filters by it in SQL),
  `chatapp.store.search` (full text), `chatapp.store.retention`.
- `chatapp.store.migrate`: `upgrade(engine)`, run by create_app under a lock, once however many
  workers start together; the revisions in `migrations/versions/`.

Adding tables from another package (the documents library, say):

1. Its own models module (`chatapp/documents/models.py`) declares its classes on this `Base`
   (`from chatapp.store.base import Base`), and names its module in `migrate.MODEL_MODULES` so
   that Alembic's autogenerate sees them.
2. Its own revision in `chatapp/store/migrations/versions/`, whose `down_revision` is the
   newest one before it (`0001` now): `NNNN_what.py`, written by hand or with `alembic
   revision --autogenerate` (the `config()` of `migrate`). Engine-specific parts (FTS5 tables,
   `vector` columns, GIN or HNSW indexes) go in `op.execute` under
   `if op.get_bind().dialect.name == ...`, as 0001 does for search; on SQLite alter tables with
   `op.batch_alter_table`. tests/chatapp/store/test_migrations.py runs every revision up and down
   on both engines.
3. Its queries take the owner (`User.id`) and filter by it in SQL, as `chats` does.
"""

from __future__ import annotations

from chatapp.store.base import Base
from chatapp.store.database import Store

__all__ = ["Base", "Store", "current_store"]


def current_store() -> Store:
    """The app's store, inside a request or an app context."""
    from flask import current_app

    store: Store = current_app.extensions["store"]
    return store
