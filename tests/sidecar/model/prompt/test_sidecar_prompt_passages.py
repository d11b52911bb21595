"""Where a grounded request's passages stand in its prompt (model/prompt/passages.py): found by
their tokens after the reading prefix, allowing for a tokenizer that writes a text's first
word otherwise when it starts the text; left out where they are not there whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.ipc import Generate
from sidecar.model.engine import Engine
from sidecar.model.prompt.passages import common_start, find_spans, mark

PASSAGE = list(range(100, 130))


def test_a_passage_is_found_by_its_tokens_after_the_start() -> None:
    ids = [1, 2, 3, *PASSAGE, 9, *PASSAGE[:20], 8]
    assert find_spans(ids, 3, [PASSAGE]) == [(3, tuple(PASSAGE))]
    assert find_spans(ids, 10, [PASSAGE]) == []  # only after the reading prefix


def test_a_first_or_last_token_written_otherwise_is_left_out() -> None:
    alone = [777, *PASSAGE[1:]]  # "▁Word" alone where the prompt has "Word"
    ids = [1, 2, *PASSAGE, 5]
    assert find_spans(ids, 2, [alone]) == [(3, tuple(PASSAGE[1:]))]
    both = [777, *PASSAGE[1:-1], 778]
    assert find_spans(ids, 2, [both]) == [(3, tuple(PASSAGE[1:-1]))]


def test_short_absent_and_repeated_passages() -> None:
    ids = [1, *PASSAGE, *PASSAGE, 2]
    assert find_spans(ids, 1, [PASSAGE[:10]]) == []  # too short to be worth a lookup
    assert find_spans(ids, 1, [list(range(500, 540))]) == []
    # The same passage twice: each its own place, never overlapping
    assert find_spans(ids, 1, [PASSAGE, PASSAGE]) == [(1, tuple(PASSAGE)), (31, tuple(PASSAGE))]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Engine:
    return Engine(tiny_model_dir)


def test_the_prompt_marks_its_passages_and_reading_prefix(engine: Engine) -> None:
    passage = "Lists are mutable sequences, tuples are not; both keep their order. " * 2
    request = Generate(
        "t",
        (("system", "Answer from the passages."), ("user", f"[1] doc\n{passage}\n\nQuestion: ?")),
        8,
        passages=(passage,),
    )
    prompt = engine.prompts.build(request, engine.max_length)
    marked = mark(engine.prompts, request, prompt, engine.max_length)
    render = lambda turns: list(engine.prompts.fit(turns, 1, engine.max_length).ids)  # noqa: E731
    assert list(marked.reading_prefix) == common_start("Answer from the passages.", render)
    assert prompt.ids[: len(marked.reading_prefix)] == list(marked.reading_prefix)
    ((start, tokens),) = marked.passages
    assert tuple(prompt.ids[start : start + len(tokens)]) == tokens
    assert len(tokens) >= len(engine.prompts.encode_alone(passage)) - 2
    # Without passages, or for a plain prompt: nothing marked
    assert mark(engine.prompts, Generate("t", request.messages, 8), prompt, 4096) is prompt
