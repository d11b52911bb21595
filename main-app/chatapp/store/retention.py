"""Retention: chats not updated for CHAT_RETENTION_DAYS are deleted, with their messages.

No background thread: each app process sweeps when it starts and then at most once every
SWEEP_EVERY_S, from the first request after that (`Retention.maybe_sweep`), so a quiet
instance costs nothing and several instances only repeat an idempotent DELETE.
"""

from __future__ import annotations

import datetime as dt
import logging
import time

from sqlalchemy import delete

from chatapp.store.base import utcnow
from chatapp.store.database import Store
from chatapp.store.models import Chat

log = logging.getLogger(__name__)
SWEEP_EVERY_S = 3600.0


def delete_older_than(store: Store, cutoff: dt.datetime) -> int:
    """Delete every chat last updated before `cutoff`; how many went."""
    with store.session(write=True) as session:
        result = session.execute(delete(Chat).where(Chat.updated_at < cutoff))
        return int(result.rowcount)  # type: ignore[attr-defined]


class Retention:
    def __init__(self, store: Store, days: int | None, every_s: float = SWEEP_EVERY_S) -> None:
        self._store = store
        self._days = days
        self._every_s = every_s
        self._next = 0.0

    def maybe_sweep(self) -> int:
        """Sweep if it is time (never when retention is off); how many chats went."""
        if not self._days or time.monotonic() < self._next:
            return 0
        self._next = time.monotonic() + self._every_s
        deleted = delete_older_than(self._store, utcnow() - dt.timedelta(days=self._days))
        if deleted:
            log.info("retention", extra={"fields": {"deleted_chats": deleted}})
        return deleted
