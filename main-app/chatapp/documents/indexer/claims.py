"""Who reads which document: claims, their order across owners, and keeping them.

A claim is an indexer's hold on one document: `Document.claim` set to a random claim id (its
indexer's `instance`, then random hex) while the document is `reading`, and a lease
(`lease_until`) the indexer keeps renewing. An id is never used twice, where a document's id may
be (SQLite gives the highest id again after a delete), so everything an indexer writes names
its claim: a late write for a document cancelled, deleted or taken by another is dropped.

The order (`claim`): owners in turn, so that no library waits behind another's whole queue.
The next document is the oldest of the owner with the fewest documents being read now, ties
to the owner whose oldest document has waited longest. A quick lane (`quick=True`) takes no
document another quick lane gave up (`long_read`).

Keeping it (`Watch`): while an indexer works on a document, a thread renews the lease every
third of `lease_s` and reads the document every `check_s`; once it is cancelled, deleted,
retried or taken (its lease lapsed), `lost` is set and the indexer stops, its reader killed.

A claim ends with the document (`finish`), given back (`hand_back`: queued again, passages
kept), or by the indexer's death: its lease lapses and the document is claimed again, counted
in `attempts` (`MAX_ATTEMPTS` such claims and it fails `broken`); an indexer process started
again under the same instance name takes over at once (`take_over`).
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import threading
import time
from dataclasses import dataclass
from types import TracebackType

from sqlalchemy import ColumnElement, delete, func, or_, select, update

from chatapp.documents.models import STORING, Chunk, Document
from chatapp.store import Store
from chatapp.store.base import utcnow

# The name its log lines have always carried, not the module's path.
log = logging.getLogger("chatapp.documents.claims")

MAX_ATTEMPTS = 3
# An upload still storing its bytes after this long died on the way: its document fails.
STALE_STORING = dt.timedelta(minutes=10)


@dataclass(frozen=True)
class Claim:
    document_id: int
    id: str  # Document.claim while it holds


def new_claim_id(instance: str) -> str:
    return f"{instance}:{secrets.token_hex(8)}"


def claimable(now: dt.datetime, *, quick: bool) -> ColumnElement[bool]:
    """Queued and held by nobody, or being read under a lease that lapsed."""
    condition = or_(
        (Document.status == "queued") & Document.claim.is_(None),
        (Document.status == "reading") & (Document.lease_until < now),
    )
    return condition & Document.long_read.is_(False) if quick else condition


def claim(store: Store, instance: str, lease_s: float, *, quick: bool = False) -> Claim | None:
    """Take the next document (the order: this module's docstring), or None."""
    now = utcnow()
    ready = claimable(now, quick=quick)
    stale = (
        (Document.status == "queued")
        & (Document.claim == STORING)
        & (Document.updated_at < now - STALE_STORING)
    )
    # Read first: an indexer with nothing to do takes no write lock (SQLite has one).
    with store.session() as session:
        waiting = dict(
            session.execute(
                select(Document.owner_id, func.min(Document.updated_at))
                .where(ready)
                .group_by(Document.owner_id)
            ).all()
        )
        failed_uploads = session.scalar(select(Document.id).where(stale).limit(1))
        if not waiting and failed_uploads is None:
            return None
        reading = dict(
            session.execute(
                select(Document.owner_id, func.count())
                .where(Document.status == "reading", Document.lease_until >= now)
                .group_by(Document.owner_id)
            ).all()
        )
    owners = sorted(waiting, key=lambda owner: (reading.get(owner, 0), waiting[owner], owner))
    with store.session(write=True) as session:
        if failed_uploads is not None:
            session.execute(
                update(Document)
                .where(stale)
                .values(
                    status="failed",
                    error_type="broken",
                    error="The upload did not finish; add the file again.",
                    claim=None,
                )
            )
        for owner in owners:
            query = (
                select(Document)
                .where(ready, Document.owner_id == owner)
                .order_by(Document.updated_at, Document.id)
                .limit(1)
            )
            if store.dialect == "postgresql":  # another indexer's pick is skipped, not waited on
                query = query.with_for_update(skip_locked=True)
            document = session.scalars(query).first()
            if document is not None:
                break
        else:
            return None
        document.attempts += 1
        if document.attempts > MAX_ATTEMPTS:
            document.status = "failed"
            document.error_type = "broken"
            document.error = (
                f"Reading this file stopped the indexer {MAX_ATTEMPTS} times; it is not read."
            )
            document.lease_until = document.claim = None
            document.updated_at = now
            return None
        document.status = "reading"
        document.claim = new_claim_id(instance)
        document.lease_until = now + dt.timedelta(seconds=lease_s)
        # updated_at is left as it was: the document keeps its place should it be given back.
        return Claim(document.id, document.claim)


def holds(claim: Claim) -> ColumnElement[bool]:
    """The document is still this claim's."""
    return (
        (Document.id == claim.document_id)
        & (Document.status == "reading")
        & (Document.claim == claim.id)
    )


def finish(
    store: Store,
    claim: Claim,
    status: str,
    error_type: str | None = None,
    error: str | None = None,
    chunks: int = 0,
) -> None:
    """The claim ends with the document `ready` or `failed` (its passages then dropped)."""
    with store.session(write=True) as session:
        ended = session.execute(
            update(Document)
            .where(holds(claim))
            .values(
                status=status,
                error_type=error_type,
                error=error,
                lease_until=None,
                claim=None,
                updated_at=utcnow(),
                chunks=chunks,
                progress=1.0 if status == "ready" else 0.0,
            )
            .returning(Document.id)
        ).first()
        if status == "failed" and ended is not None:
            session.execute(delete(Chunk).where(Chunk.document_id == claim.document_id))


def hand_back(store: Store, claim: Claim) -> None:
    """A quick lane gives the document up: queued again for the other lanes only, in its old
    place, its passages kept, the claim not counted as an attempt."""
    with store.session(write=True) as session:
        session.execute(
            update(Document)
            .where(holds(claim))
            .values(
                status="queued",
                claim=None,
                lease_until=None,
                long_read=True,
                attempts=Document.attempts - 1,
            )
        )


def take_over(store: Store, instance: str) -> int:
    """An indexer process of `instance` starts: every document its predecessor (dead, or it
    would not have been replaced) was reading is claimable now, not when its lease lapses.
    The claim it had still counts as an attempt. How many there were."""
    with store.session(write=True) as session:
        taken = session.execute(
            update(Document)
            .where(Document.status == "reading", Document.claim.startswith(f"{instance}:"))
            .values(lease_until=utcnow() - dt.timedelta(seconds=1))
            .returning(Document.id)
        ).all()
        return len(taken)


class Watch:
    """A claim kept while its indexer works: the lease renewed every third of `lease_s`, the
    document read every `check_s`; `lost` is set once the document is not this claim's."""

    def __init__(self, store: Store, claim: Claim, lease_s: float, check_s: float) -> None:
        self.store = store
        self.claim = claim
        self.lease_s = lease_s
        self.check_s = check_s
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="claim-watch", daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        renewed = time.monotonic()
        while not self._stop.wait(self.check_s):
            try:
                if time.monotonic() - renewed >= self.lease_s / 3:
                    held = self._renew()
                    renewed = time.monotonic()
                else:
                    with self.store.session() as session:
                        found = session.scalar(select(Document.id).where(holds(self.claim)))
                    held = found is not None
            except Exception:  # a busy database: the next look tries again
                log.warning("claim not checked", exc_info=True)
                continue
            if not held:
                self.lost.set()
                return

    def _renew(self) -> bool:
        until = utcnow() + dt.timedelta(seconds=self.lease_s)
        with self.store.session(write=True) as session:
            renewed = session.execute(
                update(Document)
                .where(holds(self.claim))
                .values(lease_until=until)
                .returning(Document.id)
            ).first()
            return renewed is not None
