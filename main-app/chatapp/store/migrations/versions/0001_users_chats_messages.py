"""users, chats, messages, and full-text search over a user's chats

The same three tables on both engines; the search differs (`chatapp.store.search` reads it):
SQLite gets FTS5 tables kept by triggers (`messages_fts`, external content over `messages`;
`chats_fts`, the titles, keyed by chat id since a chat's id is text), PostgreSQL a generated
`tsvector` column `search` on `chats` and `messages`, each with a GIN index. Both tokenize the
same way: words of letters and digits, case folded, accents kept, no stemming (the `simple`
configuration; FTS5's unicode61), so a search finds the same chats on either.

Revision ID: 0001
Revises:
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from chatapp.store.base import UtcDateTime

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SQLITE_SEARCH = [
    """CREATE VIRTUAL TABLE messages_fts USING fts5(
        content, content='messages', content_rowid='id',
        tokenize='unicode61 remove_diacritics 0')""",
    """CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
        INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
    END""",
    """CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content)
        VALUES ('delete', old.id, old.content);
    END""",
    """CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content)
        VALUES ('delete', old.id, old.content);
        INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
    END""",
    """CREATE VIRTUAL TABLE chats_fts USING fts5(
        chat_id UNINDEXED, title, tokenize='unicode61 remove_diacritics 0')""",
    """CREATE TRIGGER chats_fts_insert AFTER INSERT ON chats BEGIN
        INSERT INTO chats_fts(chat_id, title) VALUES (new.id, new.title);
    END""",
    """CREATE TRIGGER chats_fts_delete AFTER DELETE ON chats BEGIN
        DELETE FROM chats_fts WHERE chat_id = old.id;
    END""",
    """CREATE TRIGGER chats_fts_update AFTER UPDATE OF title ON chats BEGIN
        UPDATE chats_fts SET title = new.title WHERE chat_id = old.id;
    END""",
]

POSTGRESQL_SEARCH = [
    """ALTER TABLE chats ADD COLUMN search tsvector
        GENERATED ALWAYS AS (to_tsvector('simple', title)) STORED""",
    "CREATE INDEX ix_chats_search ON chats USING gin (search)",
    """ALTER TABLE messages ADD COLUMN search tsvector
        GENERATED ALWAYS AS (to_tsvector('simple', content)) STORED""",
    "CREATE INDEX ix_messages_search ON messages USING gin (search)",
]


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("name", sa.String(255), nullable=True),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("subject", name=op.f("uq_users_subject")),
    )
    op.create_table(
        "chats",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("title", sa.String(200), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["owner_id"], ["users.id"], name=op.f("fk_chats_owner_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_chats")),
    )
    op.create_index("ix_chats_owner_id_updated_at", "chats", ["owner_id", "updated_at"])
    op.create_table(
        "messages",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("chat_id", sa.String(32), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("images", sa.JSON(), nullable=True),
        sa.Column("finish", sa.String(32), nullable=True),
        sa.Column("citations", sa.JSON(), nullable=True),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["chat_id"], ["chats.id"], name=op.f("fk_messages_chat_id_chats"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_messages")),
        sa.UniqueConstraint("chat_id", "position", name=op.f("uq_messages_chat_id_position")),
    )
    dialect = op.get_bind().dialect.name
    for statement in SQLITE_SEARCH if dialect == "sqlite" else POSTGRESQL_SEARCH:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for table in ("chats_fts", "messages_fts"):
            op.execute(f"DROP TABLE IF EXISTS {table}")  # their triggers go with the tables
    op.drop_table("messages")
    op.drop_index("ix_chats_owner_id_updated_at", table_name="chats")
    op.drop_table("chats")
    op.drop_table("users")
