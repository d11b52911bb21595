"""Room for a new chat made while the worker is idle (model/kv/idle.py), in one process on the
real engine and the tiny model, by counting: idle work encodes one small piece at a time, a new
chat then compacts nothing on its own path, a user who returns during an early compaction finds
their conversation in its slot (nothing of it encoded or decoded for them), and a conversation
compacted early (losslessly, KV_COMPACT=fp32) replies as if it had stayed in its slot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sidecar.ipc import Generate
from sidecar.model.batch.scheduler import BatchScheduler
from sidecar.model.engine import Engine
from tests.sidecar.model.kv.test_sidecar_kv_tiers import NEW, Chat, make_engine, message
from tests.sidecar.support import worker_idle_until

PIECE = 16


def idle_chats(model: Path, **options: Any) -> tuple[Engine, BatchScheduler, list[Chat]]:
    """Three one-turn chats, idle in their slots, and a KV bound that leaves a new chat no
    room beside them: without idle work, the new chat's start compacts the oldest."""
    engine = make_engine(model, **options)
    batch = engine.batch
    assert batch is not None
    chats = [Chat(engine, f"idle-{i}", i) for i in range(3)]
    for chat in chats:
        chat.turn(0)
    assert all(batch.tiers.tier_of(e) == "ram" for e in batch.cache.entries)
    kept = batch.cache.stats().bytes
    request = new_request()
    new_chat = len(engine.prompts.fit(request.messages, NEW, engine.max_length).ids) + NEW
    batch.memory.bound_bytes = kept + new_chat * batch.pool.bytes_per_token - 1
    batch.idle.headroom_tokens = new_chat
    batch.idle.saw_new_chat(new_chat)  # as large a new chat was seen before
    batch.idle.piece_tokens = PIECE
    return engine, batch, chats


def tidy(engine: Engine) -> bool:
    assert engine.batch is not None
    return engine.batch.tidy()


def new_request() -> Generate:
    return Generate("new", (("user", message(9, 0)),), max_new_tokens=NEW, cache_scope="new")


def compactions_on_start(engine: Engine, batch: BatchScheduler) -> int:
    before = batch.tiers.compactions
    generation = engine.start(new_request())
    while generation.finish is None:
        batch.step()
    generation.release(reusable=True)
    return batch.tiers.compactions - before


def test_no_room_is_made_before_a_new_chat_was_seen(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    assert engine.batch is not None and engine.batch.idle.headroom_tokens > 0
    Chat(engine, "one", 0).turn(0)
    engine.batch.memory.bound_bytes = engine.batch.cache.stats().bytes  # no room at all
    engine.batch.idle._recent.clear()  # as before any new chat (the warm-up's, this one's)
    assert not tidy(engine)
    engine.batch.idle.saw_new_chat(64)
    assert tidy(engine)


def test_without_idle_work_a_new_chat_compacts_on_its_path(tiny_model_dir: Path) -> None:
    engine, batch, _ = idle_chats(tiny_model_dir)
    assert compactions_on_start(engine, batch) == 1  # what idle work takes off its path


def test_idle_work_comes_in_pieces_and_leaves_the_new_chat_nothing(tiny_model_dir: Path) -> None:
    engine, batch, _ = idle_chats(tiny_model_dir)
    oldest = min(batch.cache.entries, key=lambda e: e.last_used)
    tokens = oldest.generator.kv_len
    assert tidy(engine)
    kv = oldest.generator.holding.compact
    assert kv is not None and kv.tokens == PIECE  # one piece, the slot still held
    assert batch.tiers.tier_of(oldest) == "ram"
    while tidy(engine):  # then the new chat's pages mapped (kv/warm.py): counted apart
        pass
    steps = batch.idle.pieces
    assert steps == -(-tokens // PIECE)  # the whole conversation, a piece a step
    assert batch.tiers.tier_of(oldest) == "compact"
    assert all(batch.tiers.tier_of(e) == "ram" for e in batch.cache.entries if e is not oldest)
    assert compactions_on_start(engine, batch) == 0  # the room was made before it came
    warmed = batch.warm.pieces
    # nothing left, or new work only
    assert not tidy(engine) or batch.idle.pieces > steps or batch.warm.pieces > warmed


def test_a_user_returning_during_an_early_compaction_continues_in_the_slot(
    tiny_model_dir: Path,
) -> None:
    engine, _, chats = idle_chats(tiny_model_dir)
    _, _, control_chats = idle_chats(tiny_model_dir)
    assert tidy(engine) and tidy(engine)  # two pieces of the oldest, chats[0]
    returning = chats[0].turn(1)
    assert returning.restored.tier == "ram"  # nothing decoded: its slot, as it was
    assert returning.cached_tokens > 2 * PIECE
    same = control_chats[0].turn(1)
    assert chats[0].messages == control_chats[0].messages  # the same greedy reply
    assert returning.cached_tokens == same.cached_tokens
    entry = returning.lease.entry
    assert entry is not None
    kv = entry.generator.holding.compact
    assert kv is None or kv.tokens <= returning.cached_tokens  # kept only as far as reused


def test_a_conversation_compacted_early_replies_the_same(tiny_model_dir: Path) -> None:
    """Losslessly encoded (KV_COMPACT=fp32): early compaction changes no reply."""
    engine, _, chats = idle_chats(tiny_model_dir, kv_compact="fp32")
    _, _, control_chats = idle_chats(tiny_model_dir, kv_compact="fp32")
    while tidy(engine):
        pass
    returning = chats[0].turn(1)
    assert returning.restored.tier == "compact"
    same = control_chats[0].turn(1)
    assert same.restored.tier == "ram"
    assert chats[0].messages == control_chats[0].messages


def test_the_worker_makes_the_room_while_it_has_nothing_else_to_do(tiny_model_dir: Path) -> None:
    """The worker's own loop (worker.Scheduler, in a thread over real pipes): with no request,
    it compacts the oldest idle conversation a piece at a time, and answers a ping meanwhile."""
    engine, batch, _ = idle_chats(tiny_model_dir)
    oldest = min(batch.cache.entries, key=lambda e: e.last_used)
    pieces = -(-oldest.generator.kv_len // PIECE)
    worker_idle_until(engine, lambda: batch.tiers.tier_of(oldest) == "compact")
    assert batch.tiers.tier_of(oldest) == "compact"
    assert batch.idle.pieces == pieces  # a piece a step, and nothing more once there is room
    assert all(batch.tiers.tier_of(e) == "ram" for e in batch.cache.entries if e is not oldest)
