"""messages.sources: the passages a stored chat's grounded reply was given, cited or not

A grounded turn's stream starts with its sources (`{"sources": [{"n", "name", "page",
"document_id"}]}`); the page lists them under the reply and marks the cited ones. A chat kept
on the server stored only the `citations`, so when it was opened again the uncited sources
were gone, and a reply that cited nothing showed none. The reply now keeps the list it was
given (`[]` when nothing matched); NULL for a reply that was not grounded, and for the replies
stored before this revision.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("messages", sa.Column("sources", sa.JSON(), nullable=True))


def downgrade() -> None:
    # Not batch (0003's): on SQLite it copies `messages` and drops the old table, and with it
    # the triggers that keep `messages_fts`, so search no longer saw new messages. SQLite 3.35
    # drops a column in place (0005 needs it too).
    op.drop_column("messages", "sources")
