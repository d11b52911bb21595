"""documents.language and chunks.language: keyword search stems each passage in its own language

Until now keyword search stemmed every passage as English (SQLite: FTS5's Porter tokenizer;
PostgreSQL: the `english` configuration), so German and French passages were cut by English
rules. Now a document's language is detected when it is read (chatapp/documents/language.py)
and kept on it and on its passages:

- SQLite: `chunks.keywords` holds the passage's heading and text stemmed in its language; the
  FTS5 table indexes that column (its tokenizer only splits words and folds case and accents).
- PostgreSQL: `chunks.language` is a `regconfig` (`english`, `german`, ..., `simple`), and the
  generated `search` column stems by it.

The documents already read are detected here, from their passages, and indexed again.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _sqlite_search(columns: str, tokenizer: str) -> list[str]:
    """The FTS5 table over `columns` of `chunks` (external content), kept by triggers."""
    values = ", ".join(f"new.{name.strip()}" for name in columns.split(","))
    old = values.replace("new.", "old.")
    return [
        f"""CREATE VIRTUAL TABLE chunks_fts USING fts5(
            {columns}, content='chunks', content_rowid='id', tokenize='{tokenizer}')""",
        f"""CREATE TRIGGER chunks_fts_insert AFTER INSERT ON chunks BEGIN
            INSERT INTO chunks_fts(rowid, {columns}) VALUES (new.id, {values});
        END""",
        f"""CREATE TRIGGER chunks_fts_delete AFTER DELETE ON chunks BEGIN
            INSERT INTO chunks_fts(chunks_fts, rowid, {columns}) VALUES ('delete', old.id, {old});
        END""",
        "INSERT INTO chunks_fts(chunks_fts) VALUES ('rebuild')",
    ]


def _drop_sqlite_search() -> None:
    op.execute("DROP TRIGGER IF EXISTS chunks_fts_insert")
    op.execute("DROP TRIGGER IF EXISTS chunks_fts_delete")
    op.execute("DROP TABLE IF EXISTS chunks_fts")


def _postgresql_search(language: str) -> list[str]:
    return [
        f"""ALTER TABLE chunks ADD COLUMN search tsvector GENERATED ALWAYS AS (
            setweight(to_tsvector({language}, coalesce(heading, '')), 'A')
            || to_tsvector({language}, text)) STORED""",
        "CREATE INDEX ix_chunks_search ON chunks USING gin (search)",
    ]


def _detect_documents(bind: sa.engine.Connection, sqlite: bool) -> None:
    """Each document read so far: its language from its first passages, on it and them; on
    SQLite its passages' stemmed keywords too."""
    from chatapp.documents.language import document_language, keywords

    documents = bind.execute(sa.text("SELECT DISTINCT document_id FROM chunks")).scalars().all()
    for document_id in documents:
        rows = bind.execute(
            sa.text("SELECT id, heading, text FROM chunks WHERE document_id = :d ORDER BY ordinal"),
            {"d": document_id},
        ).all()
        language = document_language(text for _, _, text in rows)
        bind.execute(
            sa.text("UPDATE documents SET language = :l WHERE id = :d"),
            {"l": language, "d": document_id},
        )
        if sqlite:
            bind.execute(
                sa.text("UPDATE chunks SET language = :l, keywords = :k WHERE id = :c"),
                [
                    {"l": language, "k": keywords(f"{heading}\n{text}", language), "c": chunk}
                    for chunk, heading, text in rows
                ],
            )
        else:
            bind.execute(
                sa.text(
                    "UPDATE chunks SET language = CAST(:l AS regconfig) WHERE document_id = :d"
                ),
                {"l": language, "d": document_id},
            )


def upgrade() -> None:
    bind = op.get_bind()
    sqlite = bind.dialect.name == "sqlite"
    op.add_column("documents", sa.Column("language", sa.String(16), nullable=True))
    if sqlite:
        _drop_sqlite_search()
        op.add_column(
            "chunks",
            sa.Column("language", sa.String(16), nullable=False, server_default="english"),
        )
        op.add_column("chunks", sa.Column("keywords", sa.Text(), nullable=True))
        _detect_documents(bind, sqlite=True)
        for statement in _sqlite_search("keywords, owner_id", "unicode61 remove_diacritics 2"):
            op.execute(statement)
        return
    op.execute("ALTER TABLE chunks ADD COLUMN language regconfig NOT NULL DEFAULT 'english'")
    op.add_column("chunks", sa.Column("keywords", sa.Text(), nullable=True))
    _detect_documents(bind, sqlite=False)
    op.execute("DROP INDEX IF EXISTS ix_chunks_search")
    op.execute("ALTER TABLE chunks DROP COLUMN search")
    for statement in _postgresql_search("language"):
        op.execute(statement)


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:
        _drop_sqlite_search()
        op.execute("ALTER TABLE chunks DROP COLUMN keywords")
        op.execute("ALTER TABLE chunks DROP COLUMN language")
        for statement in _sqlite_search("heading, text, owner_id", "porter unicode61"):
            op.execute(statement)
    else:
        op.execute("DROP INDEX IF EXISTS ix_chunks_search")
        op.execute("ALTER TABLE chunks DROP COLUMN search")
        op.execute("ALTER TABLE chunks DROP COLUMN keywords")
        op.execute("ALTER TABLE chunks DROP COLUMN language")
        for statement in _postgresql_search("'english'"):
            op.execute(statement)
    op.drop_column("documents", "language")
