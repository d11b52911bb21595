"""Warming the passage store ahead of questions (ipc.Generate.warm, Engine.warm_passages,
kv/passages.py's warming wishes) on the tiny model: a grounded prompt cut after its passage is
read while idle, and a later question whose best passage it is finds it; a question's own wish
goes first; warming never puts anything out of the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.ipc import Generate
from sidecar.model.engine import Engine
from sidecar.model.kv.passages import PassageStore, Wanted
from tests.sidecar.model.kv.test_sidecar_passages import (
    a_run,
    engine_with,
    grounded,
    idle,
    run,
    store_of,
)


def warm_item(index: int, scope: str = "lib") -> Generate:
    """What the chat app sends for one passage: a first question's prompt, cut before the
    question's text (chatapp/documents/warming.py)."""
    request = grounded("", [index], scope)
    return Generate(
        "w", request.messages, 1, passages=request.passages, passage_scope=scope, warm=True
    )


@pytest.fixture()
def engine(tiny_model_dir: Path) -> Engine:
    return engine_with(tiny_model_dir)


def test_a_warmed_passage_serves_the_first_question_it_leads(engine: Engine) -> None:
    store = store_of(engine)
    tokens, reason = engine.warm_passages(warm_item(1), None)
    assert reason is None and tokens > 40
    assert store.stats().warming == 1 and store.stats().entries == 0
    idle(engine)
    assert store.stats().warming == 0 and store.stats().entries == 1
    # A question whose best passage it is: its prompt up to that passage's end is copied
    _, _, placed = run(engine, grounded("what is a tuple?", [1, 0]))
    assert placed == tokens
    # Sent again: nothing to do; another owner's is its own
    assert engine.warm_passages(warm_item(1), None) == (0, "stored already")
    assert engine.warm_passages(warm_item(1, "other"), None)[0] == tokens
    # A question led by another passage finds nothing of it
    assert run(engine, grounded("what is a dict?", [2, 1]))[2] == 0


def test_nothing_is_warmed_without_the_store_or_a_passage(tiny_model_dir: Path) -> None:
    exact = engine_with(tiny_model_dir, prompt_cache_exact=True)
    assert exact.warm_passages(warm_item(0), None)[1] == (
        "the passage store is off (it needs batched decode, PROMPT_CACHE_EXACT off)"
    )
    engine = engine_with(tiny_model_dir)
    short = Generate("w", (("user", "Hi there, x"),), 1, passages=("x",), warm=True)
    assert engine.warm_passages(short, None) == (0, "no passage was found in the prompt")


def wish(first: int, tokens: int = 20) -> Wanted:
    ran = a_run(first, tokens=tokens)
    return Wanted(ran.scope, ran.tokens, ran.prefix, ran.passages)


def test_questions_go_first_and_warming_waits_for_room() -> None:
    one = a_run(0).nbytes  # a 20-token run's bytes
    store = PassageStore(None, 2 * one, "fp32", 0)
    store.warm(wish(100))
    store.want(wish(200))
    bytes_per_token = one // 20
    assert store.next_wanted(bytes_per_token) == wish(200)  # the question's wish first
    store.wanted.clear()
    assert store.next_wanted(bytes_per_token) == wish(100)
    store.put(a_run(300))
    store.put(a_run(400))  # the store is full: warming waits, nothing is put out for it
    assert store.next_wanted(bytes_per_token) is None
    assert store.stats().warming == 1 and store.stats().entries == 2
