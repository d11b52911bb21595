"""documents.claim and documents.long_read; a document's bytes stored in parts

- `documents.claim`: who holds the document: `storing` while its upload writes its bytes, or
  the claim id of the indexer reading it (random, never used twice: a deleted document's id
  may be given again on SQLite, a claim id never is, so an indexer's late write cannot land
  in another document).
- `documents.long_read`: an indexer's quick lane gave it up: only the other lanes take it.
- `document_files.part`: the bytes in parts of at most a mebibyte, each written in a
  transaction of its own, so that one upload holds SQLite's write lock for one part at a
  time, not for its whole file. The rows already there are part 0.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTERs, not a batch: SQLite's copy of `documents` would drop the old table, and
    # its foreign keys would take every document's files and passages with it.
    op.add_column("documents", sa.Column("claim", sa.String(64), nullable=True))
    op.add_column(
        "documents",
        sa.Column("long_read", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    with op.batch_alter_table("document_files") as batch:
        batch.add_column(sa.Column("part", sa.Integer(), nullable=False, server_default="0"))
        batch.drop_constraint("pk_document_files", type_="primary")
        batch.create_primary_key("pk_document_files", ["document_id", "part"])


def downgrade() -> None:
    # Each document's parts joined into its part 0 first: the older schema has one row each.
    connection = op.get_bind()
    files = sa.table(
        "document_files",
        sa.column("document_id", sa.Integer()),
        sa.column("part", sa.Integer()),
        sa.column("data", sa.LargeBinary()),
    )
    split = connection.execute(
        sa.select(files.c.document_id).where(files.c.part > 0).distinct()
    ).scalars()
    for document_id in list(split):
        parts = connection.execute(
            sa.select(files.c.data).where(files.c.document_id == document_id).order_by("part")
        ).scalars()
        data = b"".join(parts)
        connection.execute(sa.delete(files).where(files.c.document_id == document_id))
        connection.execute(sa.insert(files).values(document_id=document_id, part=0, data=data))
    with op.batch_alter_table("document_files") as batch:
        batch.drop_constraint("pk_document_files", type_="primary")
        batch.create_primary_key("pk_document_files", ["document_id"])
        batch.drop_column("part")
    op.drop_column("documents", "long_read")  # SQLite 3.35 and later drop a column in place
    op.drop_column("documents", "claim")
