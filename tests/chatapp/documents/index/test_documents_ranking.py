"""The keyword query a question becomes, reciprocal rank fusion and relative score fusion."""

from __future__ import annotations

import sqlite3

import pytest

from chatapp.documents.index.ranking import blend, fts5_query, fuse


def test_a_question_becomes_quoted_terms_sqlite_accepts() -> None:
    query = fts5_query('How do I "NEAR" (x* OR y): the kettle\'s fuse?')
    assert query == '"near" OR "x" OR "y" OR "kettle" OR "s" OR "fuse"'
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE t USING fts5(text, tokenize='porter unicode61')")
    db.execute("INSERT INTO t VALUES ('the kettle fuse trips'), ('green tea')")
    rows = db.execute("SELECT rowid FROM t WHERE t MATCH ? ORDER BY bm25(t)", (query,))
    assert [row[0] for row in rows] == [1]
    assert fts5_query("how is it?") is None


def test_fusion_rewards_agreement() -> None:
    fused = fuse([["a", "b", "c"], ["c", "a", "d"]])
    assert [item for item, _ in fused] == ["a", "c", "b", "d"]
    assert fused[0][1] == 1 / 61 + 1 / 62


def test_blend_scales_each_method_over_its_candidates() -> None:
    # Cosines 0.9 / 0.5 / 0.1 scale to 1 / 0.5 / 0; BM25 12 / 4 to 1 / 0, whatever their units
    dense = [("a", 0.9), ("b", 0.5), ("c", 0.1)]
    keyword = [("c", 12.0), ("b", 4.0)]
    documents = {"a": 1, "b": 2, "c": 3}
    blended = dict(blend(dense, keyword, documents, 0.3))
    assert blended == pytest.approx({"a": 0.7, "b": 0.35, "c": 0.3})
    assert blend(dense, keyword, documents, 0.0)[0][0] == "a"
    assert [item for item, _ in blend(dense, keyword, documents, 1.0)][:1] == ["c"]


def test_a_documents_words_lift_every_passage_the_encoder_found_in_it() -> None:
    # b1 and b2 share document B; only b2 has the question's words, b1 is the encoder's find
    dense = [("a", 0.80), ("b1", 0.78), ("x", 0.2)]
    keyword = [("b2", 9.0), ("x", 1.0)]
    documents = {"a": "A", "b1": "B", "b2": "B", "x": "X"}
    ranked = [item for item, _ in blend(dense, keyword, documents, 0.3)]
    assert ranked[0] == "b1"  # 0.7 * 0.97 + 0.3 * 1 beats a's 0.7 * 1
    assert ranked.index("b2") > ranked.index("a")  # by words alone: 0.3 of its own
    assert dict(blend(dense, keyword, documents, 0.3))["b2"] == pytest.approx(0.3)


def test_blend_of_nothing_and_of_ties() -> None:
    assert blend([], [], {}, 0.3) == []
    # One candidate, or all tied: each scales to 1
    assert blend([("a", 0.4)], [], {"a": 1}, 0.3) == [("a", pytest.approx(0.7))]
    tied = dict(blend([("a", 0.4), ("b", 0.4)], [("a", 2.0)], {"a": 1, "b": 2}, 0.5))
    assert tied == pytest.approx({"a": 1.0, "b": 0.5})


def test_blend_scales_over_documents_not_a_documents_every_passage() -> None:
    # A's second passage (0.1) does not set the scale: B's best (0.5) is its 0
    dense = [("a1", 0.9), ("b", 0.5), ("a2", 0.1)]
    documents = {"a1": "A", "a2": "A", "b": "B"}
    assert dict(blend(dense, [], documents, 0.3)) == pytest.approx({"a1": 0.7, "b": 0.0, "a2": 0.0})
