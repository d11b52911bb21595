"""messages.model: the model that answered a stored chat's reply

One model service may serve several chat models by name (issue 56: the sidecar's
`MODELS_FILE`, or an OpenAI-compatible server's list), and the page picks one per chat. A chat
kept on the server stored the reply without saying which model wrote it, so a chat opened
again could not show it, nor go on with the model it was having. Each reply now keeps the id
of the model it was asked of (`POST /chat`'s `model`); NULL for a reply asked of the model
service's default, and for the replies stored before this revision.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-08
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("messages", sa.Column("model", sa.String(256), nullable=True))


def downgrade() -> None:
    # Not batch (0003's): on SQLite it copies `messages` and drops the old table, and with it
    # the triggers that keep `messages_fts`, so search no longer saw new messages. SQLite 3.35
    # drops a column in place (0005 and 0006 need it too).
    op.drop_column("messages", "model")
