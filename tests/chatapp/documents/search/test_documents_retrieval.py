"""documents/search/retrieval.py: a question is embedded as a query (its prompt, issue 55), cut
to the room the encoder leaves it after that prompt; hybrid search on both engines."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select, update

from chatapp.documents.embedder import Embedder, InputType
from chatapp.documents.encoder_check import EncoderCheck
from chatapp.documents.index.search_index import index_for
from chatapp.documents.models import Chunk, Document
from chatapp.documents.search.retrieval import Method, Searcher
from chatapp.documents.sizing import PassageSizing
from chatapp.store import Store, migrate
from tests.chatapp.documents.index.test_documents_index import add_document, unit


class Recording(Embedder):
    """What the searcher asks the model service for, answered with one fixed vector."""

    def __init__(self) -> None:
        super().__init__("http://unused", model="m", send_input_type=True)
        self.asked: list[tuple[list[str], InputType]] = []

    def _call(self, texts: list[str], input_type: InputType) -> list[list[float]]:
        self.asked.append((texts, input_type))
        return [[0.5] * 4 for _ in texts]


def test_a_question_is_a_query_cut_to_its_room(wordpiece_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "encoder"
    shutil.copytree(wordpiece_dir, folder)
    prompts = {"query": "the kettle boils: ", "passage": "a litre: "}  # 4 and 3 tokens
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"prompts": prompts}))
    sizing = PassageSizing(max_tokens=12, tokenizer=str(folder), prompted=True)
    assert sizing.current().question_limit == 8
    store = Store.open(f"sqlite:///{tmp_path / 'app.db'}")
    try:
        migrate.upgrade(store.engine)
        embedder = Recording()
        searcher = Searcher(store, index_for(store), embedder, sizing, "dense")
        question = "how long does the kettle take to boil a litre of water in hard water areas"
        assert searcher.search(1, question, 5) == []
    finally:
        store.close()
    [(texts, kind)] = embedder.asked
    assert kind == "query"
    assert question.startswith(texts[0]) and 2 < sizing.count(texts[0]) <= 8


class Fixed(Embedder):
    """Every question embeds to one vector."""

    def __init__(self, vector: np.ndarray) -> None:
        super().__init__("http://unused", model="m", send_input_type=True)
        self.vector = vector

    def _call(self, texts: list[str], input_type: InputType) -> list[list[float]]:
        return [self.vector.tolist() for _ in texts]


def test_hybrid_weighs_a_documents_words_with_its_passages_cosines(
    store: Store, owners: tuple[int, int], wordpiece_dir: Path
) -> None:
    alice, bob = owners
    near = add_document(store, alice, [("tea leaves", unit(1.0, 0.05))])
    # The encoder's second find, in a document whose other passage has the question's words
    second, worded = add_document(
        store, alice, [("tea bags", unit(1.0, 0.3)), ("descale the kettle", unit(0.0, 1.0))]
    )
    far = add_document(store, alice, [("cups", unit(0.2, 1.0))])
    add_document(store, bob, [("descale descale kettle", unit(1.0))])  # another owner's
    not_ready = add_document(store, alice, [("descale the kettle monthly", unit(1.0, 0.01))])
    with store.session(write=True) as session:
        document_id = session.scalars(select(Chunk.document_id).where(Chunk.id == not_ready[0]))
        reading = update(Document).where(Document.id == document_id.one()).values(status="reading")
        session.execute(reading)
    sizing = PassageSizing(max_tokens=64, tokenizer=str(wordpiece_dir))
    question = "how do I descale the kettle"
    searcher = Searcher(store, index_for(store), Fixed(unit(1.0)), sizing, "hybrid")
    found = searcher.search(alice, question, 5)
    assert [p.chunk_id for p in found][:2] == [second, near[0]]  # words lift the second
    assert {p.chunk_id for p in found} == {near[0], second, worded, far[0]}
    by_id = {p.chunk_id: p for p in found}
    assert by_id[second].similarity == pytest.approx(float(unit(1.0) @ unit(1.0, 0.3)), abs=1e-5)
    assert all(p.similarity is not None for p in found)
    dense = Searcher(store, index_for(store), Fixed(unit(1.0)), sizing, "dense")
    assert [p.chunk_id for p in dense.search(alice, question, 5)][:2] == [near[0], second]
    # Keyword weight 0: the encoder's order
    plain = Searcher(store, index_for(store), Fixed(unit(1.0)), sizing, "hybrid", 0.0)
    assert [p.chunk_id for p in plain.search(alice, question, 5)][:2] == [near[0], second]


def test_another_encoder_than_the_librarys_is_not_searched_with(
    store: Store, owners: tuple[int, int], wordpiece_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Same width, another encoder: its question vector means nothing among these passages, so
    dense and hybrid search by keywords instead, said once in the log (not the question)."""
    alice, _ = owners
    kettle = add_document(store, alice, [("descale the kettle", unit(0.0, 1.0))])
    add_document(store, alice, [("green tea", unit(1.0))])
    sizing = PassageSizing(max_tokens=64, tokenizer=str(wordpiece_dir))
    question = "how do I descale the kettle"

    def searcher(embedder: Embedder, method: Method) -> Searcher:
        return Searcher(
            store, index_for(store), embedder, sizing, method, encoder=EncoderCheck(embedder)
        )

    # The library's own encoder (taken at its first check: vectors written before 0008)
    own = searcher(Fixed(unit(1.0)), "dense").search(alice, question, 5)
    assert own and all(p.similarity is not None for p in own)
    keyword = searcher(Fixed(unit(1.0)), "keyword").search(alice, question, 5)
    assert [p.chunk_id for p in keyword] == kettle
    other = Fixed(unit(0.0, 0.0, 1.0))
    with caplog.at_level(logging.INFO, logger="chatapp.documents.encoder"):
        for method in ("dense", "hybrid", "fusion"):
            found = searcher(other, method).search(alice, question, 5)
            assert found == keyword, method
    lines = [r for r in caplog.records if r.getMessage() == "encoder changed"]
    assert len(lines) == 3  # one per searcher (a process has one)
    assert all("descale" not in str(line.__dict__) for line in lines)
    one = searcher(other, "hybrid")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="chatapp.documents.encoder"):
        one.search(alice, question, 5)
        one.search(alice, question, 5)
    assert [r.getMessage() for r in caplog.records] == ["encoder changed"]
