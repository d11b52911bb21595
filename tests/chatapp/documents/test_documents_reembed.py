"""documents/reembed.py and `python -m chatapp.documents reembed` on both engines: after the
encoder changed, the library's vectors and fingerprint are forgotten, the documents whose
passages came from the encoder queued again (a file's own refusal left as it is), and the
indexer then makes every one ready with the new encoder, which search uses again."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from chatapp.documents import library
from chatapp.documents.embedder import Embedder
from chatapp.documents.encoder_check import EncoderCheck
from chatapp.documents.index import vector_space
from chatapp.documents.index.search_index import index_for
from chatapp.documents.indexer import claims
from chatapp.documents.models import Chunk, Document
from chatapp.documents.reembed import Reembedded, reembed
from chatapp.documents.search.retrieval import Searcher
from chatapp.documents.sizing import PassageSizing
from chatapp.store import Store
from scripts.run import services
from scripts.run.services import Service
from tests.chatapp.documents.index.test_documents_index import add_document, unit
from tests.chatapp.documents.indexer.test_documents_indexer import (
    ENCODER_LIMIT,
    Reversed,
    add,
    drain,
    make_indexer,
)

WARRANTY = "How long does the warranty last?"


def statuses(store: Store) -> dict[int, tuple[str, str | None]]:
    with store.session() as session:
        rows = session.execute(select(Document.id, Document.status, Document.error_type))
        return {id: (status, error_type) for id, status, error_type in rows}


def test_reembed_indexes_the_library_again_with_the_new_encoder(
    store: Store, owners: tuple[int, int], encoder_sidecar: Service, tiny_encoder_dir: Path
) -> None:
    alice, bob = owners
    ready = [add(store, alice, "guide.txt"), add(store, bob, "guide.md")]
    blank = add(store, alice, "blank.txt")  # refused while read: no_text
    drain(make_indexer(store, encoder_sidecar.url, tiny_encoder_dir))
    cancelled = add(store, alice, "guide.html")
    library.cancel(store, alice, cancelled)
    # The operator serves another encoder of the same width: a new document is refused
    other = Reversed(encoder_sidecar.url, model="tiny")
    refused = add(store, alice, "guide.docx")
    drain(make_indexer(store, encoder_sidecar.url, tiny_encoder_dir, embedder=other))
    reading = add(store, bob, "guide.pdf")  # being read by an indexer when the command runs
    claimed = claims.claim(store, "elsewhere", 60.0)
    assert claimed is not None and claimed.document_id == reading
    before = statuses(store)
    assert before[refused] == ("failed", "encoder_changed")
    with store.session() as session:
        passages = session.scalar(select(func.count()).select_from(Chunk))

    done = reembed(store)

    assert done == Reembedded(queued=4, passages=passages or 0, left=2)
    assert "queued 4 documents" in done.summary()
    after = statuses(store)
    for document_id in (*ready, refused, reading):
        assert after[document_id] == ("queued", None)
    assert after[blank] == before[blank] == ("failed", "no_text")  # its own file's refusal
    assert after[cancelled] == ("failed", "cancelled")  # not wanted
    with store.session() as session:
        assert vector_space.space(session) is None
        assert session.scalar(select(func.count()).select_from(Chunk)) == 0
        assert session.scalar(select(Document.claim).where(Document.id == reading)) is None
    # The indexer reads them again, with the encoder now served
    indexer = make_indexer(store, encoder_sidecar.url, tiny_encoder_dir, embedder=other)
    assert drain(indexer) == 4
    for document_id in (*ready, refused, reading):
        assert statuses(store)[document_id] == ("ready", None)
    with store.session() as session:
        found = vector_space.space(session)
    assert found is not None and found.probe is not None
    assert vector_space.state(found, EncoderCheck(other).probe()) == "same"
    sizing = PassageSizing(max_tokens=ENCODER_LIMIT, tokenizer=str(tiny_encoder_dir))

    def search(embedder: Embedder) -> list[float | None]:
        check = EncoderCheck(embedder)
        searcher = Searcher(store, index_for(store), embedder, sizing, "dense", encoder=check)
        return [p.similarity for p in searcher.search(alice, WARRANTY, 5)]

    assert all(s is not None for s in search(other)) and search(other)  # dense again
    old = make_indexer(store, encoder_sidecar.url, tiny_encoder_dir).embedder
    assert search(old) and all(s is None for s in search(old))  # the old one: keywords


def test_the_command_says_what_it_did(
    database_url: str, store: Store, owners: tuple[int, int], tmp_path: Path
) -> None:
    alice, _ = owners
    add_document(store, alice, [("kettle", unit(1.0)), ("warranty", unit(0.0, 1.0))])
    environ = {**os.environ, "DATABASE_URL": database_url, "DATA_DIR": str(tmp_path)}
    command = [sys.executable, "-m", "chatapp.documents"]
    result = subprocess.run(
        [*command, "reembed"], capture_output=True, text=True, env=environ, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "2 passages" in result.stdout and "queued 1 documents" in result.stdout
    with store.session() as session:
        assert session.scalars(select(Document.status)).all() == ["queued"]
        assert vector_space.space(session) is None
    wrong = subprocess.run(
        [*command, "re-embed"], capture_output=True, text=True, env=environ, timeout=120
    )
    assert wrong.returncode != 0 and "usage: python -m chatapp.documents [reembed]" in wrong.stderr


def test_nothing_to_forget_is_fine(store: Store) -> None:
    assert reembed(store) == Reembedded(queued=0, passages=0, left=0)


@pytest.fixture(scope="module")
def other_encoder_sidecar(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    """A sidecar of another tiny encoder: the same shapes and tokenizer, other weights."""
    out = tmp_path_factory.mktemp("encoders") / "other-encoder"
    command = [sys.executable, "-m", "scripts.models.make_encoder", "--out", str(out)]
    subprocess.run([*command, "--seed", "1"], check=True, capture_output=True)
    log = tmp_path_factory.mktemp("logs") / "sidecar-other-encoder.log"
    with services.sidecar(tiny_model_dir, log, EMBED_MODEL_PATH=str(out)) as running:
        services.wait_for_embeddings(running)
        yield running


def test_two_real_encoders_of_one_width_through_their_sidecars(
    store: Store,
    owners: tuple[int, int],
    encoder_sidecar: Service,
    other_encoder_sidecar: Service,
    tiny_encoder_dir: Path,
) -> None:
    """The operator points the app at a sidecar serving another encoder of the same width:
    refused until reembed, then every document ready with it."""
    alice, _ = owners
    first = add(store, alice, "guide.txt")
    drain(make_indexer(store, encoder_sidecar.url, tiny_encoder_dir))
    now = make_indexer(store, other_encoder_sidecar.url, tiny_encoder_dir)
    assert (
        now.check.probe().shape
        == EncoderCheck(Embedder(encoder_sidecar.url, model="tiny")).probe().shape
    )
    second = add(store, alice, "guide.md")
    drain(now)
    assert statuses(store)[second] == ("failed", "encoder_changed")
    assert EncoderCheck(now.embedder).state(store) == "changed"
    assert reembed(store).queued == 2
    assert drain(now) == 2
    assert statuses(store)[first] == statuses(store)[second] == ("ready", None)
    assert EncoderCheck(now.embedder).state(store) == "same"
    assert EncoderCheck(Embedder(encoder_sidecar.url, model="tiny")).state(store) == "changed"
