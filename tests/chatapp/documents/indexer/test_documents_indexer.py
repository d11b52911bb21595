"""Indexing end to end on both engines, embeddings from a real sidecar's /v1/embeddings (the
tiny generated encoder): every format, refusals found while reading, a restart mid-document
(resumed, nothing twice), cancel, an encoder that is not there, then search by owner."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import func, select, text, update

from chatapp.documents import library
from chatapp.documents.embedder import Embedder, InputType
from chatapp.documents.index.search_index import index_for
from chatapp.documents.indexer.claims import Claim
from chatapp.documents.indexer.worker import Indexer
from chatapp.documents.models import Chunk, Document
from chatapp.documents.reading.formats import Limits
from chatapp.documents.search.retrieval import Searcher
from chatapp.documents.sizing import PassageSizing
from chatapp.store import Store
from scripts.run.services import Service
from tests.chatapp.documents.reading.test_documents_reader import alive

FILES = Path(__file__).parents[1] / "files"
LIMITS = Limits(max_bytes=1_000_000, max_pages=50)
ENCODER_LIMIT = 32  # make_encoder's default --max-tokens


def make_indexer(
    store: Store, url: str, encoder_dir: Path, batch: int = 32, embedder: Embedder | None = None
) -> Indexer:
    return Indexer(
        store=store,
        index=index_for(store),
        embedder=embedder or Embedder(url, model="tiny"),
        sizing=PassageSizing(max_tokens=ENCODER_LIMIT, tokenizer=str(encoder_dir)),
        limits=LIMITS,
        batch=batch,
    )


def drain(indexer: Indexer) -> int:
    """Index every claimable document; how many were taken."""
    taken = 0
    while (claimed := indexer.claim()) is not None:
        indexer.index_document(claimed)
        taken += 1
    return taken


def add(store: Store, owner_id: int, name: str) -> int:
    return library.add(store, owner_id, name, (FILES / name).read_bytes(), None, LIMITS).document.id


def test_every_format_is_indexed_and_found_by_its_owner_only(
    store: Store, owners: tuple[int, int], encoder_sidecar: Service, tiny_encoder_dir: Path
) -> None:
    alice, bob = owners
    names = ["guide.txt", "guide.md", "guide.html", "guide.pdf", "guide.docx"]
    ids = {name: add(store, alice, name) for name in names}
    indexer = make_indexer(store, encoder_sidecar.url, tiny_encoder_dir)
    assert drain(indexer) == len(names)
    for name, document_id in ids.items():
        document = library.get(store, alice, document_id)
        assert document is not None
        assert (document.status, document.error_type, document.progress) == ("ready", None, 1.0), (
            name
        )
        assert document.chunks > 0
    with store.session() as session:
        tokens = session.scalars(select(Chunk.tokens)).all()
        assert max(tokens) <= ENCODER_LIMIT  # the encoder would refuse a longer one
        pages = session.scalars(select(Chunk.page).where(Chunk.document_id == ids["guide.pdf"]))
        assert sorted({page for page in pages if page is not None}) == [1, 2, 3]
    searcher = Searcher(
        store,
        index_for(store),
        Embedder(encoder_sidecar.url, model="tiny"),
        PassageSizing(max_tokens=ENCODER_LIMIT, tokenizer=str(tiny_encoder_dir)),
        "fusion",
    )
    found = searcher.search(alice, "How long does the warranty last?", 5)
    assert found and {p.document_id for p in found} <= set(ids.values())
    assert any("24 months" in p.text for p in found)
    assert searcher.search(bob, "How long does the warranty last?", 5) == []


def test_refusals_found_while_reading_say_why(
    store: Store, owners: tuple[int, int], encoder_sidecar: Service, tiny_encoder_dir: Path
) -> None:
    alice, _ = owners
    expected = {
        "scanned.pdf": "no_text",
        "encrypted.pdf": "encrypted",
        "broken.docx": "broken",
        "blank.txt": "no_text",
    }
    ids = {name: add(store, alice, name) for name in expected}
    drain(make_indexer(store, encoder_sidecar.url, tiny_encoder_dir))
    for name, code in expected.items():
        document = library.get(store, alice, ids[name])
        assert document is not None
        assert (document.status, document.error_type) == ("failed", code), name
        assert document.error and document.chunks == 0


class Crash(BaseException):
    """The indexer's process dying mid-document (what a restart does to it)."""


class CrashingEmbedder(Embedder):
    """The real embedder, until its `calls`-th call, which dies instead."""

    def __init__(self, url: str, calls: int) -> None:
        super().__init__(url, model="tiny")
        self.calls_left = calls
        self.texts: list[str] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls_left -= 1
        if self.calls_left < 0:
            raise Crash
        self.texts.extend(texts)
        return super().embed(texts)


def test_a_restart_mid_document_resumes_without_duplicates(
    store: Store, owners: tuple[int, int], encoder_sidecar: Service, tiny_encoder_dir: Path
) -> None:
    alice, _ = owners
    document_id = add(store, alice, "guide.md")
    first = make_indexer(store, encoder_sidecar.url, tiny_encoder_dir, batch=1)
    crashing = CrashingEmbedder(encoder_sidecar.url, calls=2)
    first.embedder = crashing
    claimed = first.claim()
    assert claimed is not None and claimed.document_id == document_id
    with pytest.raises(Crash):
        first.index_document(claimed)
    with store.session() as session:
        written = session.scalars(select(Chunk.ordinal).where(Chunk.document_id == document_id))
        assert sorted(written) == [0, 1]
    second = make_indexer(store, encoder_sidecar.url, tiny_encoder_dir, batch=1)
    assert second.claim() is None  # the first indexer's lease still holds
    with store.session(write=True) as session:  # ... until it lapses, as after a restart
        session.execute(
            update(Document).values(lease_until=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1))
        )
    resumed = CrashingEmbedder(encoder_sidecar.url, calls=1000)
    second.embedder = resumed
    assert drain(second) == 1
    document = library.get(store, alice, document_id)
    assert document is not None and document.status == "ready" and document.attempts == 2
    with store.session() as session:
        ordinals = session.scalars(select(Chunk.ordinal).where(Chunk.document_id == document_id))
        assert sorted(ordinals) == list(range(document.chunks))
    # The resumed run embedded only what the first had not written.
    assert len(resumed.texts) == document.chunks - 2
    assert not set(resumed.texts) & set(crashing.texts)


def test_cancel_between_batches_stops_and_leaves_no_passages(
    store: Store, owners: tuple[int, int], encoder_sidecar: Service, tiny_encoder_dir: Path
) -> None:
    alice, _ = owners
    document_id = add(store, alice, "guide.md")

    class CancellingEmbedder(Embedder):
        def embed(self, texts: Sequence[str]) -> np.ndarray:
            library.cancel(store, alice, document_id)  # the person presses Cancel meanwhile
            return super().embed(texts)

    indexer = make_indexer(store, encoder_sidecar.url, tiny_encoder_dir, batch=1)
    indexer.embedder = CancellingEmbedder(encoder_sidecar.url, model="tiny")
    drain(indexer)
    document = library.get(store, alice, document_id)
    assert document is not None and (document.status, document.error_type) == (
        "failed",
        "cancelled",
    )
    with store.session() as session:
        assert session.scalar(select(func.count()).select_from(Chunk)) == 0


def test_a_model_service_without_an_encoder_fails_the_document_with_its_reason(
    store: Store, owners: tuple[int, int], sidecar_service: Service, tiny_encoder_dir: Path
) -> None:
    alice, _ = owners
    document_id = add(store, alice, "guide.txt")
    drain(make_indexer(store, sidecar_service.url, tiny_encoder_dir))
    document = library.get(store, alice, document_id)
    assert document is not None
    assert (document.status, document.error_type) == ("failed", "embeddings_failed")
    assert "refused the embeddings (400)" in (document.error or "")


class Reversed(Embedder):
    """Another encoder of the same width: the tiny encoder's numbers in reverse order."""

    def _call(self, texts: list[str], input_type: InputType) -> list[list[float]]:
        return [row[::-1] for row in super()._call(texts, input_type)]


def vectors(store: Store) -> int:
    with store.session() as session:
        return int(session.scalar(text("SELECT count(*) FROM chunk_vectors")) or 0)


@pytest.mark.parametrize("noticed", ["before_reading", "at_the_write"])
def test_another_encoder_of_the_same_width_fails_its_document_and_writes_nothing(
    noticed: str,
    store: Store,
    owners: tuple[int, int],
    encoder_sidecar: Service,
    tiny_encoder_dir: Path,
) -> None:
    """All-MiniLM-L6-v2 and multilingual-e5-small both make 384 numbers: the width alone let
    one's vectors in beside the other's. Noticed before a file is read (the library's probe
    against the encoder's), or at the write itself (the probe checked in its transaction)."""
    alice, _ = owners
    first = add(store, alice, "guide.txt")
    drain(make_indexer(store, encoder_sidecar.url, tiny_encoder_dir))
    kept = vectors(store)
    second = add(store, alice, "guide.md")
    other = Reversed(encoder_sidecar.url, model="tiny")
    indexer = make_indexer(store, encoder_sidecar.url, tiny_encoder_dir, embedder=other)
    if noticed == "at_the_write":  # as if the library's first vector came meanwhile
        indexer.check.state = lambda store: "unknown"  # type: ignore[method-assign]
    assert drain(indexer) == 1
    assert (indexer._reader is None) == (noticed == "before_reading")  # not read for nothing
    document = library.get(store, alice, second)
    assert document is not None
    assert (document.status, document.error_type, document.chunks) == (
        "failed",
        "encoder_changed",
        0,
    )
    assert "python -m chatapp.documents reembed" in (document.error or "")
    with store.session() as session:
        assert session.scalar(select(func.count()).where(Chunk.document_id == second)) == 0
    assert vectors(store) == kept  # nothing of the other encoder
    ready = library.get(store, alice, first)
    assert ready is not None and ready.status == "ready"


CLAIM_IN_A_FRESH_PROCESS = """
import sys
from chatapp import settings
from chatapp.documents.service import make_indexer
from chatapp.store import Store, migrate

store = Store.open(sys.argv[1])
migrate.upgrade(store.engine)  # already migrated: Alembic's env.py never runs here
config = {**settings.DEFAULTS, "EMBED_TOKENIZER": ""}
print(make_indexer(store, config).claim().document_id)
"""


def test_the_indexer_process_claims_from_a_database_another_process_migrated(
    store: Store, owners: tuple[int, int]
) -> None:
    """`python -m chatapp.documents` imports what the indexer does and no more; the database is
    already at the newest revision (the web workers migrated it), and its first claim writes
    a document that refers to `users`."""
    import subprocess
    import sys

    added = library.add(store, owners[0], "a.txt", b"The kettle boils.", "text/plain", LIMITS)
    url = store.engine.url.render_as_string(hide_password=False)
    result = subprocess.run(
        [sys.executable, "-c", CLAIM_IN_A_FRESH_PROCESS, url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == str(added.document.id)


def test_indexers_side_by_side_read_each_document_once(
    store: Store, owners: tuple[int, int], encoder_sidecar: Service, tiny_encoder_dir: Path
) -> None:
    """The indexer process runs DOCUMENT_INDEXER_THREADS indexers (chatapp/documents/
    __main__.py): their claims never take the same document, and each is written once."""
    import threading
    import time

    alice, _ = owners
    names = ["guide.txt", "guide.md", "guide.html", "guide.pdf", "guide.docx"]
    documents = [add(store, alice, name) for name in names]
    taken: list[int] = []
    original = Indexer.index_document

    def counted(self: Indexer, claim: Claim) -> str:
        taken.append(claim.document_id)
        return original(self, claim)

    stop = threading.Event()
    indexers = []
    for _ in range(2):
        indexer = make_indexer(store, encoder_sidecar.url, tiny_encoder_dir)
        indexer.poll_s = 0.05
        indexer.index_document = counted.__get__(indexer)  # type: ignore[method-assign]
        indexers.append(threading.Thread(target=indexer.run, args=(stop,)))
    for thread in indexers:
        thread.start()
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            with store.session() as session:
                statuses = session.scalars(select(Document.status)).all()
            if all(status in ("ready", "failed") for status in statuses):
                break
            time.sleep(0.05)
    finally:
        stop.set()
        for thread in indexers:
            thread.join()
    assert sorted(taken) == sorted(documents)
    with store.session() as session:
        assert set(session.scalars(select(Document.status))) == {"ready"}
        pairs = session.execute(select(Chunk.document_id, Chunk.ordinal)).all()
        assert len(pairs) == len(set(pairs)) > len(documents)


def add_bytes(store: Store, owner_id: int, name: str, data: bytes) -> int:
    limits = Limits(max_bytes=30_000_000, max_pages=50)
    return library.add(store, owner_id, name, data, None, limits).document.id


def reading_indexer(store: Store, **fields: Any) -> Indexer:
    """An indexer whose documents never reach the model service (they end while read)."""
    indexer = make_indexer(store, "http://127.0.0.1:9", Path("unused"))
    indexer.sizing = PassageSizing(max_tokens=ENCODER_LIMIT)  # the byte bound
    indexer.limits = Limits(max_bytes=30_000_000, max_pages=50)
    for name, value in fields.items():
        setattr(indexer, name, value)
    return indexer


@pytest.mark.parametrize("stop", ["cancel", "delete"])
def test_cancel_and_delete_stop_a_reading_document_within_a_second(
    stop: str,
    store: Store,
    owners: tuple[int, int],
    slow_docx: bytes,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Cancel and DELETE were seen only at the next batch, which a file being read never
    reached: 27 minutes on, both threads still read it. Now the reader is killed."""
    import threading

    caplog.set_level(logging.INFO, logger="chatapp.documents.indexer")
    alice, _ = owners
    document_id = add_bytes(store, alice, f"{stop}.docx", slow_docx)
    indexer = reading_indexer(store)
    claim = indexer.claim()
    assert claim is not None and claim.document_id == document_id
    outcome: list[str] = []
    worker = threading.Thread(target=lambda: outcome.append(indexer.index_document(claim)))
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while indexer.reader.pid is None and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = indexer.reader.pid
        assert pid is not None
        time.sleep(0.3)  # reading
        if stop == "cancel":
            library.cancel(store, alice, document_id)
        else:
            library.delete_document(store, alice, document_id)
        stopped = time.monotonic()
        worker.join(10)
        assert outcome == ["lost"] and time.monotonic() - stopped < 1.5
        assert not alive(pid)
        read = [r for r in caplog.records if r.getMessage() == "read"]
        assert read[-1].fields["outcome"] == "stopped"  # type: ignore[attr-defined]
    finally:
        worker.join()
        indexer.close()
    with store.session() as session:
        assert session.scalar(select(func.count()).select_from(Chunk)) == 0


def test_a_file_over_its_time_fails_too_slow_and_is_not_claimed_again(
    store: Store, owners: tuple[int, int], slow_docx: bytes
) -> None:
    alice, _ = owners
    document_id = add_bytes(store, alice, "slow.docx", slow_docx)
    indexer = reading_indexer(store, read_timeout_s=1.0)
    try:
        claim = indexer.claim()
        assert claim is not None
        assert indexer.index_document(claim) == "too_slow"
        document = library.get(store, alice, document_id)
        assert document is not None
        assert (document.status, document.error_type, document.attempts) == (
            "failed",
            "too_slow",
            1,
        )
        assert "DOCUMENT_READ_TIMEOUT" in (document.error or "")
        assert indexer.claim() is None  # failed for good: not read again and again
        retried = library.retry(store, alice, document_id)
        assert retried is not None and retried.status == "queued"  # unless asked
    finally:
        indexer.close()


def test_the_quick_lane_gives_a_long_read_back_and_a_long_lane_finishes_it(
    store: Store, owners: tuple[int, int], encoder_sidecar: Service, tiny_encoder_dir: Path
) -> None:
    """A small file never waits for a large one: the quick lane works on a document for its
    time at most, then gives it back to the other lanes, passages written so far kept."""
    alice, _ = owners
    big = "\n\n".join(f"Paragraph {n}: the kettle boils a litre of water." for n in range(200))
    document_id = add_bytes(store, alice, "big.txt", big.encode())
    quick = make_indexer(store, encoder_sidecar.url, tiny_encoder_dir, batch=4)
    quick.quick_s = 0.0  # its time is up after the first batch
    long = make_indexer(store, encoder_sidecar.url, tiny_encoder_dir)
    try:
        claim = quick.claim()
        assert claim is not None
        assert quick.index_document(claim) == "handed_back"
        given = library.get(store, alice, document_id)
        assert given is not None and (given.status, given.long_read) == ("queued", True)
        assert quick.claim() is None
        assert drain(long) == 1
        done = library.get(store, alice, document_id)
        assert done is not None and (done.status, done.attempts) == ("ready", 1)
        with store.session() as session:
            ordinals = session.scalars(
                select(Chunk.ordinal).where(Chunk.document_id == document_id)
            )
            assert sorted(ordinals) == list(range(done.chunks))
    finally:
        quick.close()
        long.close()


def test_a_late_batch_of_a_deleted_document_never_lands_in_the_next_one(
    store: Store, owners: tuple[int, int], encoder_sidecar: Service, tiny_encoder_dir: Path
) -> None:
    """The batch's write checked only `status`, and SQLite gives a deleted document's id to the
    next: a late batch could land in another owner's new document. It names its claim now."""
    alice, bob = owners
    first = add(store, alice, "guide.md")
    other = make_indexer(store, encoder_sidecar.url, tiny_encoder_dir)
    replaced: list[int] = []

    class Replacing(Embedder):
        def embed(self, texts: Sequence[str]) -> np.ndarray:
            if not replaced:  # meanwhile: deleted, another added and claimed by another
                library.delete_document(store, alice, first)
                replaced.append(add(store, bob, "guide.txt"))
                assert other.claim() is not None
            return super().embed(texts)

    late = make_indexer(store, encoder_sidecar.url, tiny_encoder_dir)
    late.embedder = Replacing(encoder_sidecar.url, model="tiny")
    try:
        claim = late.claim()
        assert claim is not None
        assert late.index_document(claim) == "lost"
        if store.dialect == "sqlite":
            assert replaced == [first]  # the same id, another document
        with store.session() as session:
            assert session.scalar(select(func.count()).select_from(Chunk)) == 0
    finally:
        late.close()
        other.close()
