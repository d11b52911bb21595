"""The library's bookkeeping on both engines: content-hash skip, refusals at once, the owner
filter on every id, cancel, retry, delete."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from chatapp.documents import library
from chatapp.documents.models import PART_BYTES, STORING, Chunk, Document, DocumentFile
from chatapp.documents.reading.formats import Limits
from chatapp.store import Store

FILES = Path(__file__).parent / "files"
LIMITS = Limits(max_bytes=100_000, max_pages=10)


def test_the_same_bytes_twice_are_one_document_per_owner(
    store: Store, owners: tuple[int, int]
) -> None:
    alice, bob = owners
    data = (FILES / "guide.md").read_bytes()
    first = library.add(store, alice, "guide.md", data, None, LIMITS)
    again = library.add(store, alice, "copy.md", data, None, LIMITS)
    bobs = library.add(store, bob, "guide.md", data, None, LIMITS)
    assert first.document.status == "queued" and not first.already_held
    assert again.already_held and again.document.id == first.document.id
    assert not bobs.already_held and bobs.document.id != first.document.id
    assert first.document.mime == "text/markdown"
    with store.session() as session:
        assert session.scalar(select(func.count()).select_from(DocumentFile)) == 2


def test_too_large_and_unknown_types_fail_at_once_without_keeping_bytes(
    store: Store, owners: tuple[int, int]
) -> None:
    alice, _ = owners
    big = library.add(store, alice, "big.txt", b"x" * 100_001, None, LIMITS).document
    png = library.add(
        store, alice, "image.png", (FILES / "image.png").read_bytes(), "image/png", LIMITS
    ).document
    assert (big.status, big.error_type) == ("failed", "too_large")
    assert (png.status, png.error_type) == ("failed", "unsupported_type")
    assert "100001 bytes" in (big.error or "")
    with store.session() as session:
        assert session.scalar(select(func.count()).select_from(DocumentFile)) == 0


def test_another_owner_s_ids_are_not_found(store: Store, owners: tuple[int, int]) -> None:
    alice, bob = owners
    data = (FILES / "guide.txt").read_bytes()
    document = library.add(store, alice, "guide.txt", data, None, LIMITS).document
    assert library.get(store, bob, document.id) is None
    assert library.cancel(store, bob, document.id) is None
    assert library.retry(store, bob, document.id) is None
    assert library.delete_document(store, bob, document.id) is False
    assert [d.id for d in library.listing(store, bob)] == []
    held = library.get(store, alice, document.id)
    assert held is not None and held.status == "queued"  # untouched by bob's attempts


def test_cancel_retry_delete(store: Store, owners: tuple[int, int]) -> None:
    alice, _ = owners
    data = (FILES / "guide.txt").read_bytes()
    document = library.add(store, alice, "guide.txt", data, None, LIMITS).document
    cancelled = library.cancel(store, alice, document.id)
    assert cancelled is not None
    assert (cancelled.status, cancelled.error_type) == ("failed", "cancelled")
    retried = library.retry(store, alice, document.id)
    assert retried is not None and (retried.status, retried.error_type) == ("queued", None)
    assert library.delete_document(store, alice, document.id) is True
    assert library.get(store, alice, document.id) is None
    assert library.delete_document(store, alice, document.id) is False
    with store.session() as session:
        assert session.scalar(select(func.count()).select_from(Document)) == 0
        assert session.scalar(select(func.count()).select_from(DocumentFile)) == 0
        assert session.scalar(select(func.count()).select_from(Chunk)) == 0


def test_a_file_is_stored_a_part_per_transaction_and_held_until_its_last(
    store: Store, owners: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 uploads of 6 MB each held SQLite's one writer for a whole file: the last waited past
    the busy timeout (500). Each part is a transaction of its own now, and the document is
    not the indexers' (`claim` `storing`) until the last part is in."""
    alice, _ = owners
    data = bytes(range(256)) * (PART_BYTES * 5 // 2 // 256)  # two and a half parts
    transactions: list[bool] = []
    seen_claims: list[str | None] = []
    session = store.session

    def counted(*, write: bool = False) -> Iterator[Session]:
        transactions.append(write)
        with session(write=write) as opened:
            seen_claims.extend(opened.scalars(select(Document.claim)).all())
            yield opened

    monkeypatch.setattr(store, "session", contextlib.contextmanager(counted))
    added = library.add(store, alice, "data.txt", data, "text/plain", Limits(10_000_000, 10))
    assert transactions == [True] * (1 + 3)  # the document, then each part
    assert STORING in seen_claims  # held while its parts went in
    monkeypatch.undo()
    with store.session() as opened:
        parts = opened.execute(
            select(DocumentFile.part, DocumentFile.data)
            .where(DocumentFile.document_id == added.document.id)
            .order_by(DocumentFile.part)
        ).all()
        document = opened.get(Document, added.document.id)
    assert [part for part, _ in parts] == [0, 1, 2]
    assert all(len(piece) <= PART_BYTES for _, piece in parts)
    assert b"".join(piece for _, piece in parts) == data
    assert document is not None and document.claim is None and document.status == "queued"
