"""Shared prefixes (SHARED_PREFIXES, model/kv/shared_prefix.py) on the real tiny model: a declared
system message is read once at start, a new chat that sends it reads only the rest, the reply
is the one without it token for token, `cached_tokens` does not count it, and a scope's own
tokens never reach another scope through it; while the worker is idle the prefix is written
ahead into a free slot, and the new chat that takes it writes none of it on its own path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sidecar.ipc import Generate
from sidecar.model.batch.row import BatchGeneration
from sidecar.model.engine import Engine
from sidecar.model.kv import compact as kv_compact
from sidecar.model.kv import shared_prefix
from tests.sidecar.support import worker_idle_until

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


def count_restores(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The first position of each write of K/V from a compact copy into a slot, from now."""
    starts: list[int] = []
    real = kv_compact.restore

    def counted(*args: Any, **options: Any) -> None:
        starts.append(options.get("start", 0))
        real(*args, **options)

    monkeypatch.setattr(kv_compact, "restore", counted)
    return starts


def idle(engine: Engine) -> int:
    """Run the worker's idle work to its end (worker._tidy); the pieces it did, less those
    that mapped the next new chat's pages (kv/warm.py, counted apart)."""
    assert engine.batch is not None
    pieces, warmed = 0, engine.batch.warm.pieces
    while engine.batch.tidy():
        pieces += 1
    return pieces - (engine.batch.warm.pieces - warmed)


def test_the_prefix_is_written_ahead_while_idle_and_a_new_chat_takes_it(
    tiny_model_dir: Path, plain: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shared_prefix, "STAGE_PIECE_TOKENS", 8)  # several pieces
    engine = engine_with(tiny_model_dir, shared_prefixes=[SYSTEM])
    batch = engine.batch
    assert batch is not None
    (prefix,) = batch.shared
    assert idle(engine) == -(-len(prefix.ids) // 8)  # a piece a step, then nothing more
    staged = batch.staged
    assert staged is not None and staged.done and staged.nbytes > 0
    assert batch.memory.set_aside == prefix.nbytes + staged.nbytes  # counted while it waits
    restores = count_restores(monkeypatch)
    for i, question in enumerate(QUESTIONS):
        restores.clear()
        text, read, cached, reason = run(engine, chat(question, f"ahead-{i}"))
        assert restores == []  # the new chat's slot was written already
        alone, read_alone, _, _ = run(plain, chat(question, f"ahead-{i}"))
        assert text == alone  # the same bits in the slot: the same reply
        assert read == read_alone - len(prefix.ids)
        assert (cached, reason) == (0, "shared")
        assert batch.staged is None and batch.memory.set_aside == prefix.nbytes
        assert idle(engine) > 0  # written ahead again for the next new chat


def test_a_chat_arriving_while_it_is_written_reads_only_the_rest(
    tiny_model_dir: Path, plain: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shared_prefix, "STAGE_PIECE_TOKENS", 8)
    engine = engine_with(tiny_model_dir, shared_prefixes=[SYSTEM])
    batch = engine.batch
    assert batch is not None
    (prefix,) = batch.shared
    assert batch.tidy()  # one piece only
    staged = batch.staged
    assert staged is not None and not staged.done and staged.written == 8
    restores = count_restores(monkeypatch)
    text, read, _, reason = run(engine, chat(QUESTIONS[1], "midway"))
    assert restores == [8]  # only what was not written ahead yet
    alone, read_alone, _, _ = run(plain, chat(QUESTIONS[1], "midway"))
    assert (text, read, reason) == (alone, read_alone - len(prefix.ids), "shared")


def test_any_other_request_gives_the_written_slot_back(tiny_model_dir: Path, plain: Engine) -> None:
    engine = engine_with(tiny_model_dir, shared_prefixes=[SYSTEM])
    batch = engine.batch
    assert batch is not None
    (prefix,) = batch.shared
    idle(engine)
    staged = batch.staged
    assert staged is not None and staged.done
    slot = staged.slot
    pages_before = int(np.count_nonzero(batch.pool.keys[0][slot]))
    assert pages_before > 0
    other = chat(QUESTIONS[0], "other", SYSTEM + " Be brief.")
    generation = engine.start(other)
    assert isinstance(generation, BatchGeneration)
    assert batch.staged is None and batch.memory.set_aside == prefix.nbytes
    assert generation.cache_reason == "miss"
    if generation.holder.index != slot:  # not reused: its pages were given back
        assert not np.any(batch.pool.keys[0][slot])
    generation.release(reusable=False)
    text, _, _, _ = run(engine, other)
    alone, _, _, _ = run(plain, other)
    assert text == alone


def test_nothing_is_written_ahead_where_the_bound_has_no_room_for_it(
    tiny_model_dir: Path,
) -> None:
    engine = engine_with(tiny_model_dir, shared_prefixes=[SYSTEM])
    batch = engine.batch
    assert batch is not None
    (prefix,) = batch.shared
    run(engine, chat(QUESTIONS[0], "kept"))  # a kept conversation, and a new chat's room
    kept = batch.cache.stats().bytes
    headroom = batch.idle.headroom * batch.pool.bytes_per_token
    staged_bytes = len(prefix.ids) * batch.pool.bytes_per_token
    # Room for the kept conversation and a new chat, not for the prefix written ahead too
    batch.memory.bound_bytes = prefix.nbytes + kept + headroom + staged_bytes - 1
    idle(engine)
    assert batch.staged is None
    assert batch.cache.stats().bytes == kept  # nothing moved down for it either


def test_the_worker_writes_it_ahead_while_it_has_nothing_else_to_do(tiny_model_dir: Path) -> None:
    """The worker's own loop (worker.Scheduler, in a thread over real pipes) writes the
    prefix ahead with no request to run, and answers a ping meanwhile."""
    engine = engine_with(tiny_model_dir, shared_prefixes=[SYSTEM])
    batch = engine.batch
    assert batch is not None
    worker_idle_until(engine, lambda: batch.staged is not None and batch.staged.done)
    assert batch.staged is not None and batch.staged.done


def test_new_chats_returning_turns_and_other_prompts_mixed_with_idle_time(
    tiny_model_dir: Path, plain: Engine
) -> None:
    """Chats with the prefix, without it, and coming back for a second turn, with the idle
    work run between them: every reply is the one without shared prefixes, and the bound's
    books always hold the prefix, plus the copy written ahead only while it waits."""
    engine = engine_with(tiny_model_dir, shared_prefixes=[SYSTEM])
    batch = engine.batch
    assert batch is not None
    (prefix,) = batch.shared
    first_turns = [
        chat(QUESTIONS[0], "mix-a"),
        chat(QUESTIONS[1], "mix-b", "Another system message."),
        chat(QUESTIONS[2], "mix-c"),
    ]
    replies: dict[str, str] = {}
    for request in first_turns:
        assert request.cache_scope is not None
        replies[request.cache_scope], _, _, _ = run(engine, request)
        assert replies[request.cache_scope] == run(plain, request)[0]
        assert batch.memory.set_aside == prefix.nbytes
        idle(engine)
        staged = batch.staged
        assert staged is not None and staged.done
        assert batch.slots_held()[staged.slot] is None  # nobody's slot
        assert batch.memory.set_aside == prefix.nbytes + staged.nbytes
    for request in first_turns:  # second turns: each scope's own conversation comes back
        assert request.cache_scope is not None
        turn = Generate(
            "t",
            (*request.messages, ("assistant", replies[request.cache_scope]), ("user", "More?")),
            24,
            cache_scope=request.cache_scope,
        )
        text, _, _, reason = run(engine, turn)
        assert reason == "reused" and text == run(plain, turn)[0]
        assert batch.staged is None and batch.memory.set_aside == prefix.nbytes
        idle(engine)
    assert batch.memory.reserved_bytes == 0
