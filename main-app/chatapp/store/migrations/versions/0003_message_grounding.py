"""messages.grounding: the passages a stored chat's grounded user turn was sent with

A grounded turn (`POST /chat` with `chat_id` and `"documents": true`) keeps the block of
passages it was sent with, so the chat's later turns rebuild its prompt from what was stored
(the same tokens, read from the model service's cache), never from what a client says.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("messages", sa.Column("grounding", sa.Text(), nullable=True))


def downgrade() -> None:
    # batch: SQLite before 3.35 could not drop a column; Alembic copies the table where needed.
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("grounding")
