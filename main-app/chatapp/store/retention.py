"""Retention: chats and library documents not updated for CHAT_RETENTION_DAYS are deleted, the
chats with their messages, the documents with their kept bytes and their passages (the
passages' vectors and keywords go with them in the same transaction: triggers on SQLite,
foreign keys on PostgreSQL, as `documents.library.delete_document`).

No background thread: each app process sweeps when it starts and then at most once every
SWEEP_EVERY_S, from the first request after that (`Retention.maybe_sweep`), so a quiet
instance costs nothing and several instances only repeat an idempotent DELETE.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass

from sqlalchemy import delete

from chatapp.documents.models import Document
from chatapp.store.base import utcnow
from chatapp.store.database import Store
from chatapp.store.models import Chat

log = logging.getLogger(__name__)
SWEEP_EVERY_S = 3600.0


@dataclass(frozen=True)
class Swept:
    chats: int
    documents: int


def delete_older_than(store: Store, cutoff: dt.datetime) -> Swept:
    """Delete every chat and every document last updated before `cutoff`; how many went."""
    with store.session(write=True) as session:
        chats = session.execute(delete(Chat).where(Chat.updated_at < cutoff))
        documents = session.execute(delete(Document).where(Document.updated_at < cutoff))
        return Swept(
            int(chats.rowcount),  # type: ignore[attr-defined]
            int(documents.rowcount),  # type: ignore[attr-defined]
        )


class Retention:
    def __init__(self, store: Store, days: int | None, every_s: float = SWEEP_EVERY_S) -> None:
        self._store = store
        self._days = days
        self._every_s = every_s
        self._next = 0.0

    def maybe_sweep(self) -> int:
        """Sweep if it is time (never when retention is off); how many chats and documents
        went."""
        if not self._days or time.monotonic() < self._next:
            return 0
        self._next = time.monotonic() + self._every_s
        swept = delete_older_than(self._store, utcnow() - dt.timedelta(days=self._days))
        if swept.chats or swept.documents:
            fields = {"deleted_chats": swept.chats, "deleted_documents": swept.documents}
            log.info("retention", extra={"fields": fields})
        return swept.chats + swept.documents
