"""documents/search/retrieval.py: a question is embedded as a query (its prompt, issue 55), cut
to the room the encoder leaves it after that prompt."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from chatapp.documents.embedder import Embedder, InputType
from chatapp.documents.index.search_index import index_for
from chatapp.documents.search.retrieval import Searcher
from chatapp.documents.sizing import PassageSizing
from chatapp.store import Store, migrate


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
