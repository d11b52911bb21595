"""The keyword query a question becomes, and reciprocal rank fusion."""

from __future__ import annotations

import sqlite3

from chatapp.documents.index.ranking import fts5_query, fuse


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
