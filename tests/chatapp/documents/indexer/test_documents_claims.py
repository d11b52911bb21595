"""Who reads which document, on both engines (issue 58): owners in turn, a quick lane that
gives documents back, claims a deleted document's reused id cannot satisfy, a lease kept
alive while a document is read, and a restarted indexer taking its documents over."""

from __future__ import annotations

import datetime as dt
import time

from sqlalchemy import select, update

from chatapp.documents import library
from chatapp.documents.indexer import claims
from chatapp.documents.indexer.claims import Watch
from chatapp.documents.models import STORING, Document
from chatapp.documents.reading.formats import Limits
from chatapp.store import Store
from chatapp.store.base import utcnow

LIMITS = Limits(max_bytes=1_000_000, max_pages=10)


def add(store: Store, owner: int, text: str) -> int:
    return library.add(store, owner, f"{text}.txt", text.encode(), None, LIMITS).document.id


def document(store: Store, document_id: int) -> Document:
    with store.session() as session:
        found = session.get(Document, document_id)
    assert found is not None
    return found


def test_owners_take_turns(store: Store, owners: tuple[int, int]) -> None:
    """Alice queued three files, then Bob one: Bob's is the second read, not the fourth (a
    49-byte note waited for minutes behind another user's files)."""
    alice, bob = owners
    mine = [add(store, alice, f"alice {n}") for n in range(3)]
    his = add(store, bob, "bob's note")
    first = claims.claim(store, "test", 60)
    second = claims.claim(store, "test", 60)
    third = claims.claim(store, "test", 60)
    assert first is not None and second is not None and third is not None
    assert [first.document_id, second.document_id, third.document_id] == [mine[0], his, mine[1]]


def test_the_quick_lane_gives_a_document_back_for_the_other_lanes(
    store: Store, owners: tuple[int, int]
) -> None:
    alice, _ = owners
    slow, note = add(store, alice, "a long read"), add(store, alice, "a note")
    taken = claims.claim(store, "test", 60, quick=True)
    assert taken is not None and taken.document_id == slow
    claims.hand_back(store, taken)
    given = document(store, slow)
    assert (given.status, given.claim, given.long_read, given.attempts) == (
        "queued",
        None,
        True,
        0,  # a hand-back is no attempt
    )
    quick = claims.claim(store, "test", 60, quick=True)
    assert quick is not None and quick.document_id == note  # never the long one again
    assert claims.claim(store, "test", 60, quick=True) is None
    long = claims.claim(store, "test", 60)
    assert long is not None and long.document_id == slow


def test_a_claim_holds_only_its_own_document_even_when_the_id_comes_back(
    store: Store, owners: tuple[int, int]
) -> None:
    """SQLite gives a deleted document's id to the next one: an indexer's late write named the
    id and `reading`, and could land in the new document."""
    alice, bob = owners
    old = add(store, alice, "deleted while read")
    stale = claims.claim(store, "one", 60)
    assert stale is not None
    assert library.delete_document(store, alice, old)
    new = add(store, bob, "bob's document")
    if store.dialect == "sqlite":
        assert new == old  # the id came back
    current = claims.claim(store, "two", 60)
    assert current is not None and current.document_id == new and current.id != stale.id
    with store.session() as session:
        assert session.scalar(select(Document.id).where(claims.holds(stale))) is None
        assert session.scalar(select(Document.id).where(claims.holds(current))) == new
    claims.finish(store, stale, "failed", "broken", "late")
    assert document(store, new).status == "reading"  # untouched by the stale claim


def test_the_watch_keeps_the_lease_and_sees_a_cancel_within_a_second(
    store: Store, owners: tuple[int, int]
) -> None:
    """The lease lapsed mid-read (renewed only at a batch) and a second indexer took the same
    file; a cancel was seen only at the next batch, which never came."""
    alice, _ = owners
    document_id = add(store, alice, "read for a while")
    claim = claims.claim(store, "one", lease_s=0.6)
    assert claim is not None
    with Watch(store, claim, lease_s=0.6, check_s=0.1) as watch:
        time.sleep(1.5)  # more than twice the lease
        assert claims.claim(store, "two", 0.6) is None  # still held
        assert not watch.lost.is_set()
        library.cancel(store, alice, document_id)
        cancelled = time.monotonic()
        assert watch.lost.wait(5)
        assert time.monotonic() - cancelled < 1.0


def test_a_restarted_indexer_takes_its_documents_over_at_once(
    store: Store, owners: tuple[int, int]
) -> None:
    alice, bob = owners
    mine = add(store, alice, "read when the indexer was killed")
    other = add(store, bob, "another instance's")
    dead = claims.claim(store, "abc", 60)
    elsewhere = claims.claim(store, "xyz", 60)
    assert dead is not None and elsewhere is not None
    assert claims.claim(store, "abc", 60) is None  # leases of a minute hold
    assert claims.take_over(store, "abc") == 1
    again = claims.claim(store, "abc", 60)
    assert again is not None and again.document_id == mine == dead.document_id
    assert document(store, mine).attempts == 2  # the death counts towards MAX_ATTEMPTS
    assert document(store, other).claim == elsewhere.id


def test_an_upload_that_died_while_storing_fails_once_stale(
    store: Store, owners: tuple[int, int]
) -> None:
    alice, _ = owners
    document_id = add(store, alice, "never finished")
    with store.session(write=True) as session:
        session.execute(
            update(Document)
            .where(Document.id == document_id)
            .values(claim=STORING, updated_at=utcnow() - dt.timedelta(hours=1))
        )
    assert claims.claim(store, "test", 60) is None
    failed = document(store, document_id)
    assert (failed.status, failed.error_type, failed.claim) == ("failed", "broken", None)


def test_a_claim_is_not_taken_while_its_upload_stores_it(
    store: Store, owners: tuple[int, int]
) -> None:
    alice, _ = owners
    document_id = add(store, alice, "half stored")
    with store.session(write=True) as session:
        session.execute(update(Document).where(Document.id == document_id).values(claim=STORING))
    assert claims.claim(store, "test", 60) is None
    assert document(store, document_id).status == "queued"
