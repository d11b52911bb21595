"""Indexing end to end on both engines, embeddings from a real sidecar's /v1/embeddings (the
tiny generated encoder): every format, refusals found while reading, a restart mid-document
(resumed, nothing twice), cancel, an encoder that is not there, then search by owner."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select, update

from chatapp.documents import library
from chatapp.documents.embedder import Embedder
from chatapp.documents.formats import Limits
from chatapp.documents.indexer import Indexer
from chatapp.documents.models import Chunk, Document
from chatapp.documents.retrieval import Searcher
from chatapp.documents.search_index import index_for
from chatapp.documents.tokens import EncoderTokens
from chatapp.store import Store
from scripts.run.services import Service

FILES = Path(__file__).parent / "files"
LIMITS = Limits(max_bytes=1_000_000, max_pages=50)
ENCODER_LIMIT = 32  # make_encoder's default --max-tokens


def make_indexer(store: Store, url: str, encoder_dir: Path, batch: int = 32) -> Indexer:
    return Indexer(
        store=store,
        index=index_for(store),
        embedder=Embedder(url, model="tiny"),
        counter=EncoderTokens(encoder_dir),
        limits=LIMITS,
        chunk_tokens=ENCODER_LIMIT,
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
        EncoderTokens(tiny_encoder_dir),
        ENCODER_LIMIT,
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
    assert claimed == document_id
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


CLAIM_IN_A_FRESH_PROCESS = """
import sys
from chatapp import settings
from chatapp.documents.service import make_indexer
from chatapp.store import Store, migrate

store = Store.open(sys.argv[1])
migrate.upgrade(store.engine)  # already migrated: Alembic's env.py never runs here
config = {**settings.DEFAULTS, "EMBED_TOKENIZER": ""}
print(make_indexer(store, config).claim())
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

    def counted(self: Indexer, document_id: int) -> None:
        taken.append(document_id)
        original(self, document_id)

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
