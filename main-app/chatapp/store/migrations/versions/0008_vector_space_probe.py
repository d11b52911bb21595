"""vector_space.probe: the fingerprint of the encoder the library's vectors were made with

`vector_space` kept the encoder's width only, so a later encoder of the same width (all-MiniLM-L6-v2
and multilingual-e5-small both make 384 numbers) mixed its vectors with the earlier one's without
a word, and searches compared a question and passages embedded by different encoders. The row
now keeps the vector the encoder gives a fixed text (documents/index/vector_space.py, JSON);
NULL for a library made before this revision, which takes the encoder of its first check as
its own.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-09
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("vector_space", sa.Column("probe", sa.Text(), nullable=True))


def downgrade() -> None:
    # In place, as 0005-0007 (SQLite 3.35 drops a column without copying the table).
    op.drop_column("vector_space", "probe")
