"""Whose library a request reads: the accounts' user of the request (chatapp/accounts/).

Under `AUTH_MODE=none` that is the one local user; under a sign-in mode the signed-in person,
and a request without one is `401 unauthenticated` before anything of the library is read.
"""

from __future__ import annotations

from chatapp.accounts import current_user


def current_owner_id() -> int:
    """The request's user id (made on first sight, kept for the request); raises the 401."""
    return current_user().id
