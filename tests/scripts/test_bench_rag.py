"""The retrieval evaluation: the FAQ's pairs, the measures, and the keyword run's shape."""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import pytest

from scripts.bench import rag
from scripts.bench.rag_baseline import recursive_split
from scripts.bench.rag_faq import FAQ, _page_pairs, faq_pairs, rank_of, score

PAGE = """\
=====
Title
=====

Section
=======

How do I boil water?
--------------------

Use a kettle.

Why not?
--------

Then a pan.
"""


def test_a_page_becomes_question_answer_pairs() -> None:
    pairs = _page_pairs("p", PAGE)
    assert [(p.question, p.answer) for p in pairs] == [
        ("How do I boil water?", "Use a kettle."),
        ("Why not?", "Then a pan."),
    ]


@pytest.mark.skipif(not FAQ.is_dir(), reason="python3.11-doc is not installed")
def test_the_faq_gives_about_170_pairs() -> None:
    pairs = faq_pairs()
    assert 165 <= len(pairs) <= 185
    assert all(p.question.endswith("?") and p.answer for p in pairs)
    assert not any(p.answer.startswith(("---", "===")) for p in pairs)


def test_measures() -> None:
    assert rank_of(7, [3, 3, 7, 1]) == 2  # repeats of one document count once
    assert rank_of(9, [3, 7]) is None
    scores = score([1, 2, None, 11])
    assert (scores.recall_at_1, scores.recall_at_3, scores.recall_at_5) == (0.25, 0.5, 0.5)
    assert scores.mrr_at_10 == round((1 + 1 / 2) / 4, 3)


@pytest.mark.skipif(not FAQ.is_dir(), reason="python3.11-doc is not installed")
def test_keyword_run_finds_most_answers(capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(
        embeddings_url=None, embeddings_model="", tokenizer=None, chunk_tokens=256, limit=40
    )
    result = rag.main(args)
    keyword = result["results"]["keyword"]
    assert result["pairs"] == 40 and keyword["queries"] == 40
    # BM25 on its own finds far more than chance (1/40) puts first.
    assert keyword["recall_at_5"] > 0.5
    assert "| keyword |" in capsys.readouterr().out


def test_scale_run_counts_and_times_on_sqlite(capsys: pytest.CaptureFixture[str]) -> None:
    from scripts.bench import rag_scale

    args = argparse.Namespace(
        passages=300,
        owners=3,
        dimensions=8,
        queries=5,
        k=3,
        postgres_url=None,
        no_postgres=True,
        no_sqlite=False,
    )
    result = rag_scale.main(args)
    sqlite = result["engines"]["sqlite"]
    assert set(result["engines"]) == {"sqlite"}
    assert sqlite["write_per_s"] > 0 and sqlite["dense_p95_ms"] >= sqlite["dense_p50_ms"] > 0
    assert "| sqlite |" in capsys.readouterr().out


@pytest.mark.skipif(not FAQ.is_dir(), reason="python3.11-doc is not installed")
def test_turn_run_grounds_and_reuses_the_cache(
    tiny_model_dir: Path, tiny_encoder_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from scripts.bench import rag_turn

    args = argparse.Namespace(
        model=str(tiny_model_dir),
        preset="tiny",
        encoder=str(tiny_encoder_dir),
        documents=3,
        turns=1,
        max_new_tokens=2,
    )
    result = rag_turn.main(args)
    assert result["turns"] == 1 and result["documents"] == 3
    assert result["passage_prompt_tokens_p50"] > 0  # the passages went into the turn
    assert result["follow_up_cached_tokens_p50"] > 0  # and the follow-up read them from cache
    # Issue 44's comparison: the grounded turn against its own prompt sent bare, same tokens,
    # nothing of the one read from the other's cache.
    assert result["same_prompt_tokens_equal"] is True
    assert result["same_prompt_cached_tokens_max"] == 0
    assert result["grounding_overhead_p95_ms"] >= result["grounding_overhead_p50_ms"]
    assert 0 < result["grounding_ms_p50"] <= result["grounding_ms_p95"]  # the app's chat line
    assert result["added_above_model_p95_ms"] >= result["added_above_model_p50_ms"]
    # Issue 54: the sources line came (its time measured), the progress gap is a number or
    # None (a prompt under 256 tokens to read is not reported)
    assert 0 < result["sources_line_p50_ms"] <= result["sources_line_p95_ms"]
    gap = result["progress_gap_max_s"]
    assert (gap is None) == (result["progress_turns"] == 0) and (gap is None or gap >= 0)
    out = capsys.readouterr().out
    assert "| grounded |" in out and "| bare, the grounded turn's prompt |" in out
    assert "grounded minus bare with the same prompt (issue 44: at most 150 ms)" in out
    assert "| the sources line, ms from the request |" in out


def test_the_baseline_splitter_cuts_as_open_webui_does() -> None:
    paragraphs = [f"Paragraph {n:02d}. " + "word " * 6 for n in range(60)]  # 43 characters
    text = "\n\n".join(paragraphs)
    chunks = recursive_split(text)
    assert len(chunks) > 1
    assert all(len(c) <= 1000 for c in chunks)
    # paragraphs are never cut while they fit, and neighbours share up to 100 characters
    assert all(c.startswith("Paragraph") for c in chunks)
    for a, b in itertools.pairwise(chunks):
        shared = [p for p in b.split("\n\n") if p in a.split("\n\n")]
        assert shared and sum(len(p) for p in shared) <= 100 + 2
    assert {p.strip() for c in chunks for p in c.split("\n\n")} == {p.strip() for p in paragraphs}
    # a piece with no separator left is cut anywhere
    assert [len(c) for c in recursive_split("x" * 2500)] == [1000, 1000, 700]
