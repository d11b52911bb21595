"""Shared prefixes (SHARED_PREFIXES, model/shared_prefix.py) on the real tiny model: a declared
system message is read once at start, a new chat that sends it reads only the rest, the reply
is the one without it token for token, `cached_tokens` does not count it, and a scope's own
tokens never reach another scope through it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.ipc import Generate
from sidecar.model.batch_scheduler import BatchGeneration
from sidecar.model.engine import Engine

SYSTEM = (
    "You answer questions about the weather in one short sentence. You never make up a "
    "forecast; when you do not know, say so. Cities are named as their people name them."
)
QUESTIONS = ["Weather in Paris?", "And in Tokyo, tomorrow?", "Describe London in one line."]


def engine_with(model: Path, **options: Any) -> Engine:
    engine = Engine(
        model,
        prompt_cache_mb=64,
        prefill_chunk=16,
        decode_batch_rows=4,
        max_concurrency=4,
        **options,
    )
    engine.warm_up()
    return engine


@pytest.fixture(scope="module")
def shared(tiny_model_dir: Path) -> Engine:
    return engine_with(tiny_model_dir, shared_prefixes=[SYSTEM])


@pytest.fixture(scope="module")
def plain(tiny_model_dir: Path) -> Engine:
    return engine_with(tiny_model_dir)


def chat(question: str, scope: str, system: str = SYSTEM) -> Generate:
    return Generate("t", (("system", system), ("user", question)), 24, cache_scope=scope)


def run(engine: Engine, request: Generate) -> tuple[str, int, int, str]:
    """The greedy reply, the prompt tokens it read, its cached_tokens and cache reason."""
    generation = engine.start(request)
    assert isinstance(generation, BatchGeneration)
    read = generation.prompt_left
    text = ""
    while generation.finish is None:
        text += generation.step() or ""
    generation.release(reusable=True)
    return text, read, generation.cached_tokens, generation.cache_reason


def test_a_new_chat_starts_from_the_declared_prefix_and_replies_the_same(
    shared: Engine, plain: Engine
) -> None:
    assert shared.batch is not None
    (prefix,) = shared.batch.shared
    assert len(prefix.ids) > 2 * shared.prefill_chunk  # the system message, in the template
    for i, question in enumerate(QUESTIONS):
        text, read, cached, reason = run(shared, chat(question, f"new-{i}"))
        alone, read_alone, _, _ = run(plain, chat(question, f"new-{i}"))
        assert text == alone  # greedy: the same reply, token for token
        assert read == read_alone - len(prefix.ids)  # only the rest of the prompt was read
        assert (cached, reason) == (0, "shared")  # not the scope's own tokens: not counted


def test_the_prefix_is_counted_against_the_kv_bound(shared: Engine) -> None:
    assert shared.batch is not None
    (prefix,) = shared.batch.shared
    assert shared.batch.memory.set_aside == prefix.nbytes > 0
    room = shared.batch.memory.room() - prefix.nbytes
    assert shared.batch.cache.limit() <= room


def test_another_system_message_or_none_reads_its_whole_prompt(shared: Engine) -> None:
    for system in (SYSTEM[:-1], SYSTEM + " Be brief."):
        _, read, cached, reason = run(shared, chat(QUESTIONS[0], f"other-{len(system)}", system))
        assert (cached, reason) == (0, "miss")
        assert read == len(
            shared.prompts.fit(chat(QUESTIONS[0], "x", system).messages, 24, shared.max_length).ids
        )


def test_a_scopes_own_tokens_never_reach_another_scope(shared: Engine) -> None:
    """Scope A's whole conversation is cached; scope B, sending the same system message and
    the same first question, gets the declared prefix only, none of A's tokens after it."""
    assert shared.batch is not None
    (prefix,) = shared.batch.shared
    first = chat(QUESTIONS[1], "scope-a")
    reply, _, _, _ = run(shared, first)
    turn = (*first.messages, ("assistant", reply), ("user", QUESTIONS[2]))
    _, _, cached_a, reason_a = run(shared, Generate("t", turn, 24, cache_scope="scope-a"))
    assert reason_a == "reused" and cached_a > len(prefix.ids)  # its own scope's tokens
    prompt_b = shared.prompts.fit(turn, 24, shared.max_length).ids
    _, read_b, cached_b, reason_b = run(shared, Generate("t", turn, 24, cache_scope="scope-b"))
    assert (cached_b, reason_b) == (0, "shared")
    assert read_b == len(prompt_b) - len(prefix.ids)  # A's question and reply read again


def test_exact_mode_uses_whole_chunks_of_the_prefix(tiny_model_dir: Path, plain: Engine) -> None:
    exact = engine_with(tiny_model_dir, shared_prefixes=[SYSTEM], prompt_cache_exact=True)
    assert exact.batch is not None
    (prefix,) = exact.batch.shared
    whole = len(prefix.ids) // exact.prefill_chunk * exact.prefill_chunk
    text, read, _, reason = run(exact, chat(QUESTIONS[0], "exact"))
    alone, read_alone, _, _ = run(plain, chat(QUESTIONS[0], "exact"))
    assert (text, read, reason) == (alone, read_alone - whole, "shared")
