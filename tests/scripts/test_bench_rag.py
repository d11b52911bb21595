"""The retrieval evaluation: the FAQ's pairs, the measures, and the keyword run's shape."""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scripts.bench import rag, rag_encoders, rag_sets
from scripts.bench.common import BadArguments
from scripts.bench.rag_baseline import recursive_split
from scripts.bench.rag_faq import FAQ, _page_pairs, faq_pairs, rank_of, score
from scripts.bench.rag_sets import SETS
from scripts.run.services import Service

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


def suite_args(**fields: Any) -> argparse.Namespace:
    defaults: dict[str, Any] = {
        "embeddings_url": None,
        "embeddings_model": "",
        "tokenizer": None,
        "chunk_tokens": 256,
        "sets": "python-faq",
        "limit": 40,
        "indexing": False,
        "encoder": None,
        "no_input_type": False,
    }
    return argparse.Namespace(**(defaults | fields))


@pytest.mark.skipif(not FAQ.is_dir(), reason="python3.11-doc is not installed")
def test_keyword_run_finds_most_answers(capsys: pytest.CaptureFixture[str]) -> None:
    result = rag.main(suite_args())
    faq = result["sets"]["python-faq"]
    keyword = faq["scores"]["keyword"]
    assert faq["questions"] == 40 and keyword["queries"] == 40
    assert result["counted_by"] == "byte_bound"  # no model service: the app's safe bound
    # BM25 on its own finds far more than chance (1/40) puts first.
    assert keyword["recall_at_5"] > 0.5
    assert "| python-faq | en |" in capsys.readouterr().out


def test_the_suite_s_every_row_on_the_tiny_encoder(
    encoder_sidecar: Service, capsys: pytest.CaptureFixture[str]
) -> None:
    """The shape of a run with an encoder: each set that this machine has, every method,
    passages sized by the tokenizer the sidecar gave (documents/sizing.py)."""
    names = [name for name in SETS if name != "man-en"]  # English pages: many to render
    result = rag.main(suite_args(embeddings_url=encoder_sidecar.url, sets=",".join(names)))
    out = capsys.readouterr().out
    assert result["counted_by"] == "encoder" and result["passage_tokens"] == 32
    assert result["sets"], out  # at least one set is on this machine
    for name, measured in result["sets"].items():
        methods = {"keyword", rag.PORTER, "hybrid", "dense", "fusion", rag.OPEN_WEBUI}
        assert set(measured["scores"]) == methods
        assert 15 <= measured["questions"] <= 40 and measured["passages"] >= measured["questions"]
        for scores in measured["scores"].values():
            assert 0 <= scores["recall_at_1"] <= scores["recall_at_5"] <= 1
        assert f"| {name} | {measured['language']} |" in out
    assert "| dense |" in out and "points |" in out


def test_an_encoder_of_its_own_or_a_url_not_both() -> None:
    with pytest.raises(BadArguments, match="leave --embeddings-url out"):
        rag.main(suite_args(encoder="multilingual", embeddings_url="http://127.0.0.1:1"))
    with pytest.raises(BadArguments, match="one or more of minilm, multilingual"):
        rag.main(suite_args(encoder="minilm,bge"))


def test_encoders_are_compared_set_by_set() -> None:
    def scores(recall: float, mrr: float) -> dict[str, Any]:
        return {"scores": {"dense": {"recall_at_5": recall, "mrr_at_10": mrr}}}

    runs = {
        "all-minilm-l6-v2": {"sets": {"man-de": scores(0.617, 0.491)}},
        "multilingual-e5-small": {"sets": {"man-de": scores(0.85, 0.731)}},
    }
    table = rag_encoders.comparison(runs).splitlines()
    assert table[0].startswith("| set | search | all-minilm-l6-v2 recall@5, MRR@10 |")
    assert table[2] == "| man-de | dense | 0.617, 0.491 | 0.850, 0.731 (+23.3, +24.0) |"


@pytest.mark.parametrize(
    ("input_types", "kinds"), [(True, ["passage", "query"]), (False, [None, None])]
)
def test_dense_says_what_passages_and_questions_are(
    monkeypatch: pytest.MonkeyPatch, input_types: bool, kinds: list[str | None]
) -> None:
    """As the app's requests to its sidecar (issue 55): the encoder's prompts, unless
    --no-input-type (the app with UPSTREAM_API=openai)."""
    sent: list[str | None] = []

    def embed(texts: list[str], url: str, model: str, *, kind: str | None = None) -> Any:
        sent.append(kind)
        return np.eye(len(texts), 4, dtype=np.float32)

    monkeypatch.setattr(rag, "_embed", embed)
    passages = [rag.Passage(0, "a kettle", "kettle", "a kettle", "en")]
    dense = rag._dense(["kettle?"], passages, "http://x", "m", input_types=input_types)
    assert dense == [[(0, 1.0)]]
    assert sent == kinds


STATUS = """\
Package: kettle
Status: install ok installed
Source: kettle-src
Description: boils water for tea
 The kettle boils a litre of water in three minutes and switches itself
 off. It has a light that says when it is on.
 .
 Descale it once a month in hard water areas, with citric acid. The warranty
 lasts 24 months from the date on the receipt.

Package: kettle-doc
Source: kettle-src
Description: boils water for tea (documentation)
 The kettle boils a litre of water in three minutes and switches itself
 off. It has a light that says when it is on. And a manual, with pictures of it all.

Package: debian-faq-de
Description: The Debian FAQ, in German
 Held out of every set: this text must never be read into one, whatever its length, and so
 the builder skips it by its name before it looks at anything else it says at all.

Package: short
Description: too short to be a document
 A line.
"""


def test_package_descriptions_one_per_source_the_debian_faq_held_out(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text(STATUS)
    cases = rag_sets.debian_packages(None, status)
    assert [(c.question, c.name) for c in cases] == [("boils water for tea", "kettle.txt")]
    assert cases[0].document.startswith("The kettle boils")
    assert "\n\nDescale it" in cases[0].document  # " ." is a paragraph break


@pytest.mark.skipif(not (rag_sets.MAN / "man7" / "gitfaq.7.gz").is_file(), reason="no git-man")
def test_git_s_faq_gives_its_questions_whole() -> None:
    cases = rag_sets.git_faq(None)
    assert len(cases) >= 15 and all(c.question.endswith("?") and c.document for c in cases)
    assert any(c.question.startswith("I’ve made a change with a bug") for c in cases)  # wrapped


@pytest.mark.parametrize("language", ["de", "fr"])
def test_manual_pages_in_another_language(language: str) -> None:
    if not list((rag_sets.MAN / language / "man1").glob("*.gz")):
        pytest.skip(f"no {language} manual pages")
    cases = rag_sets.manual_pages(language, 3)
    assert 1 <= len(cases) <= 3
    for case in cases:
        assert case.name.endswith(".txt") and len(case.document) >= rag_sets.MIN_DOCUMENT_CHARS
        assert " - " not in case.question and case.question  # the NAME line's words only


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
