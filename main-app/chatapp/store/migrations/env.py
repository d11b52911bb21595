"""Alembic's environment for the app's database: run by `chatapp.store.migrate.upgrade`, which
hands it an open connection (holding the migration lock) in `config.attributes`.

The target metadata is the one `Base`: every package's models module must be imported before
autogenerate compares (`chatapp.store.migrate.MODEL_MODULES`).
"""

from __future__ import annotations

from alembic import context

from chatapp.store.base import Base
from chatapp.store.migrate import import_models

import_models()
connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    # SQLite alters a table by copying it: later revisions use op.batch_alter_table, which
    # this makes work on both engines.
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
