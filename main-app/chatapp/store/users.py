"""Users: one row per identity the app has seen (`subject`: the identity provider's principal
id, or `local` under AUTH_MODE=none)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from chatapp.store.base import utcnow
from chatapp.store.models import NAME_CHARS, User

LOCAL_SUBJECT = "local"


def ensure_user(session: Session, subject: str, name: str | None = None) -> User:
    """The user with this subject, made on first sight (two requests of a new user at once
    make one row: the insert does nothing on a conflict). A changed display name is kept."""
    name = name[:NAME_CHARS] if name else None
    user = session.scalars(select(User).where(User.subject == subject)).one_or_none()
    if user is None:
        dialect = session.get_bind().dialect.name
        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        session.execute(
            insert(User)
            .values(subject=subject, name=name, created_at=utcnow())
            .on_conflict_do_nothing(index_elements=["subject"])
        )
        user = session.scalars(select(User).where(User.subject == subject)).one()
    elif name and user.name != name:
        user.name = name
    return user
