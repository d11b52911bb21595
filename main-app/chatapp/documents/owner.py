"""Whose library a request reads: the accounts user, or, until accounts land, the one local
user (`chatapp.store.users.LOCAL_SUBJECT`)."""

from __future__ import annotations

from flask import current_app, g

from chatapp.store import current_store
from chatapp.store.users import LOCAL_SUBJECT, ensure_user


def current_owner_id() -> int:
    """The request's user id. A request-scoped user set by the accounts code (`g.user_id`)
    wins; else the local user, made on first sight and remembered for the process."""
    user_id = g.get("user_id")
    if isinstance(user_id, int):
        return user_id
    cached = current_app.extensions.get("documents_local_user")
    if cached is None:
        with current_store().session(write=True) as session:
            cached = ensure_user(session, LOCAL_SUBJECT).id
        current_app.extensions["documents_local_user"] = cached
    return int(cached)
