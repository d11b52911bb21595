"""documents, their bytes, their passages, and keyword search over the passages

The tables are the same on both engines; keyword search differs (`chatapp.documents.index`
reads it): SQLite gets an FTS5 table over `chunks` (external content, kept by triggers; Porter
stemming, which found more answers on the Python FAQ than plain words), PostgreSQL a generated
`tsvector` column `search` on `chunks` (the `english` configuration: the same stemming; the
heading weighted A) with a GIN index. The vectors' table is made by the index at the first
vector, when the encoder's width is known (`vector_space` records it).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from chatapp.store.base import UtcDateTime

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SQLITE_SEARCH = [
    # owner_id is indexed too, so a query names its owner inside MATCH and FTS5 ranks only
    # that owner's passages (documents/index/sqlite.py filters in SQL as well).
    """CREATE VIRTUAL TABLE chunks_fts USING fts5(
        heading, text, owner_id, content='chunks', content_rowid='id',
        tokenize='porter unicode61')""",
    """CREATE TRIGGER chunks_fts_insert AFTER INSERT ON chunks BEGIN
        INSERT INTO chunks_fts(rowid, heading, text, owner_id)
        VALUES (new.id, new.heading, new.text, new.owner_id);
    END""",
    """CREATE TRIGGER chunks_fts_delete AFTER DELETE ON chunks BEGIN
        INSERT INTO chunks_fts(chunks_fts, rowid, heading, text, owner_id)
        VALUES ('delete', old.id, old.heading, old.text, old.owner_id);
    END""",
]
POSTGRESQL_SEARCH = [
    """ALTER TABLE chunks ADD COLUMN search tsvector GENERATED ALWAYS AS (
        setweight(to_tsvector('english', coalesce(heading, '')), 'A')
        || to_tsvector('english', text)) STORED""",
    "CREATE INDEX ix_chunks_search ON chunks USING gin (search)",
]


def upgrade() -> None:
    op.create_table(
        "documents",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "owner_id", sa.Integer(), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("mime", sa.String(100), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("chunks", sa.Integer(), nullable=False),
        sa.Column("error_type", sa.String(32), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("lease_until", UtcDateTime(), nullable=True),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint("owner_id", "content_hash"),
    )
    op.create_index("ix_documents_status_updated_at", "documents", ["status", "updated_at"])
    op.create_table(
        "document_files",
        sa.Column(
            "document_id",
            sa.Integer(),
            sa.ForeignKey("documents.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("data", sa.LargeBinary(), nullable=False),
    )
    op.create_table(
        "chunks",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "document_id",
            sa.Integer(),
            sa.ForeignKey("documents.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "owner_id", sa.Integer(), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("heading", sa.Text(), nullable=False),
        sa.Column("page", sa.Integer(), nullable=True),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.UniqueConstraint("document_id", "ordinal"),
    )
    op.create_index("ix_chunks_owner_id", "chunks", ["owner_id"])
    # The encoder's width the vectors' table was made for (one row, or none before the first).
    op.create_table(
        "vector_space",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("dimensions", sa.Integer(), nullable=False),
    )
    dialect = op.get_bind().dialect.name
    for statement in SQLITE_SEARCH if dialect == "sqlite" else POSTGRESQL_SEARCH:
        op.execute(statement)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.execute("DROP TABLE IF EXISTS chunk_vectors")
    if dialect == "sqlite":
        op.execute("DROP TABLE IF EXISTS chunks_fts")
    op.drop_table("vector_space")
    op.drop_index("ix_chunks_owner_id", table_name="chunks")
    op.drop_table("chunks")
    op.drop_table("document_files")
    op.drop_index("ix_documents_status_updated_at", table_name="documents")
    op.drop_table("documents")
