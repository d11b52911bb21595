"""Who is asking: the request's identity under `AUTH_MODE`, and its user row (`current_user`).

See `chatapp.accounts` for the modes. The routes that keep or read a person's things (`/chat`,
`/api/...`) call `current_user()`; the page and the probes need nobody.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from flask import Flask, current_app, g, request
from sqlalchemy import select

from chatapp.errors import ApiError
from chatapp.relay.wire import FORBIDDEN_CHARS
from chatapp.store import current_store
from chatapp.store.models import NAME_CHARS, SUBJECT_CHARS, User
from chatapp.store.users import LOCAL_SUBJECT, ensure_user

AUTH_MODES = ("none", "appservice", "header")
PRINCIPAL_ID = "X-MS-CLIENT-PRINCIPAL-ID"
PRINCIPAL_NAME = "X-MS-CLIENT-PRINCIPAL-NAME"
# The mode's prefix of a stored subject; room for it is kept out of SUBJECT_CHARS.
PREFIX_CHARS = 16

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Never in a subject: a control character (FORBIDDEN_CHARS spares the tab and new lines, which
# text may hold and an id may not), nor a comma: the server joins two headers of one name with
# one ("alice,bob"), which would otherwise be a user of its own.
NOT_IN_SUBJECT = re.compile(r"[\x00-\x1f\x7f-\x9f,]")


@dataclass(frozen=True)
class Identity:
    subject: str  # as stored: with its mode's prefix
    name: str | None


@dataclass(frozen=True)
class CurrentUser:
    id: int
    subject: str
    name: str | None


def not_signed_in(message: str = "Sign in to use this chat.") -> ApiError:
    return ApiError("unauthenticated", message, status=401)


def _clean(value: str | None, limit: int) -> str | None:
    """A header's value as an identity part: trimmed, never empty, never with control
    characters, at most `limit` characters (else None: not an identity)."""
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > limit or FORBIDDEN_CHARS.search(value):
        return None
    return value


def _subject(value: str | None, limit: int) -> str | None:
    """A header's value as a subject: `_clean`, and one value without any control character."""
    subject = _clean(value, limit)
    if subject is None or NOT_IN_SUBJECT.search(subject):
        return None
    return subject


def from_proxy(remote_addr: str | None, proxies: Sequence[Network]) -> bool:
    """Whether the connection comes from one of the trusted proxies."""
    try:
        address = ipaddress.ip_address(remote_addr or "")
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in proxies)


class Headers(Protocol):
    def get(self, key: str) -> str | None: ...


def identify(config: Mapping[str, Any], headers: Headers, remote_addr: str | None) -> Identity:
    """The identity of a request with these headers from this address; raises the 401."""
    mode = config["AUTH_MODE"]
    if mode == "none":
        return Identity(LOCAL_SUBJECT, None)
    limit = SUBJECT_CHARS - PREFIX_CHARS
    if mode == "appservice":
        subject = _subject(headers.get(PRINCIPAL_ID), limit)
        if subject is None:
            raise not_signed_in()
        return Identity(f"appservice:{subject}", _clean(headers.get(PRINCIPAL_NAME), NAME_CHARS))
    # header: the proxy's word counts only on the proxy's own connections.
    if not from_proxy(remote_addr, config["TRUSTED_PROXIES"]):
        raise not_signed_in("Sign in through this site's sign-in proxy.")
    subject = _subject(headers.get(config["AUTH_HEADER"]), limit)
    if subject is None:
        raise not_signed_in()
    name_header = config["AUTH_NAME_HEADER"]
    name = _clean(headers.get(name_header), NAME_CHARS) if name_header else None
    return Identity(f"header:{subject}", name or subject)


def current_user() -> CurrentUser:
    """The user asking (made on first sight), once per request; raises the 401."""
    user: CurrentUser | None = g.get("user")
    if user is None:
        identity = identify(current_app.config, request.headers, request.remote_addr)
        store = current_store()
        with store.session() as session:  # most requests: a user seen before, as they were
            row = session.scalars(select(User).where(User.subject == identity.subject)).first()
            if row is not None and (identity.name is None or row.name == identity.name):
                user = CurrentUser(row.id, row.subject, row.name)
        if user is None:
            with store.session(write=True) as session:
                row = ensure_user(session, identity.subject, identity.name)
                user = CurrentUser(row.id, row.subject, row.name)
        g.user = user
    return user


def install(app: Flask) -> None:
    """Check that the mode's settings hold together (at start, not on the first request)."""
    app.config["TRUSTED_PROXIES"] = [
        ipaddress.ip_network(p, strict=False) if isinstance(p, str) else p
        for p in app.config["TRUSTED_PROXIES"] or []
    ]
    if app.config["AUTH_MODE"] == "header" and not app.config["TRUSTED_PROXIES"]:
        from chatapp.settings import SettingsError

        raise SettingsError(
            "AUTH_MODE=header needs TRUSTED_PROXIES: the addresses of the proxy that signs "
            "people in (else anyone who reaches the app could name any user)"
        )
