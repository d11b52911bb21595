"""The next prompt's KV pages mapped while the worker is idle (model/kv/warm.py), in one
process on the real engine and the tiny model: which pages are resident is read from the
kernel (mincore), and replies are compared with an engine that maps nothing ahead."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
from pathlib import Path

import pytest

from sidecar.ipc import Generate
from sidecar.model.batch.decoder import KvPool
from sidecar.model.batch.row import BatchGeneration, SlotHolder
from sidecar.model.batch.scheduler import BatchScheduler
from sidecar.model.engine import Engine
from tests.sidecar.model.kv.test_sidecar_kv_tiers import NEW, Chat, make_engine, message
from tests.sidecar.support import worker_idle_until

_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def resident_pages(pool: KvPool, slot: int) -> int:
    """Pages of the slot (every layer's K and V) that are mapped now."""
    size = pool.slot_bytes
    vector = (ctypes.c_ubyte * (size // mmap.PAGESIZE))()
    count = 0
    for buffer in (*pool.keys, *pool.values):
        address = buffer.ctypes.data + slot * size
        assert _LIBC.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vector) == 0
        count += sum(byte & 1 for byte in vector)
    return count


def pages_for(pool: KvPool, positions: int) -> int:
    """The pages a slot's first `positions` take: each head's run of positions in each buffer."""
    position_bytes = pool.slot_bytes // pool.kv_heads // pool.length
    per_head = -(-positions * position_bytes // mmap.PAGESIZE)
    return 2 * len(pool.keys) * pool.kv_heads * per_head


def batch_of(engine: Engine) -> BatchScheduler:
    assert engine.batch is not None
    return engine.batch


def warmed_engine(model: Path) -> tuple[Engine, BatchScheduler, Chat]:
    """One chat replied and idle in its slot, then the idle work run to its end."""
    engine = make_engine(model)
    batch = batch_of(engine)
    first = Chat(engine, "first", 0)
    first.turn(0)
    while batch.tidy():
        pass
    if not batch.warm.supported:
        pytest.skip("this kernel cannot populate pages (MADV_POPULATE_WRITE: Linux 5.14)")
    return engine, batch, first


def test_idle_work_maps_the_pages_the_next_new_chats_prompt_writes(tiny_model_dir: Path) -> None:
    _, batch, _ = warmed_engine(tiny_model_dir)
    slot = batch.next_new_slot()
    assert slot is not None and batch.warm.slot == slot
    room = batch.warm.target
    assert 0 < room < batch.pool.length and batch.warm.warmed == room
    assert resident_pages(batch.pool, slot) == pages_for(batch.pool, room)


def new_chat(engine: Engine) -> tuple[str, int, int]:
    """A new chat to its end (greedy): its reply, the slot its prompt was read into, and the
    pages of that slot mapped once it started (before its prompt was read)."""
    batch = batch_of(engine)
    request = Generate(
        "new", (("user", message(1, 0)),), max_new_tokens=NEW, min_new_tokens=NEW,
        cache_scope="new",
    )  # fmt: skip
    generation = engine.start(request)
    assert isinstance(generation, BatchGeneration)
    slot = generation.holder.index
    mapped = resident_pages(batch.pool, slot)
    pieces = []
    while generation.finish is None:
        for stepped, text in batch.step():
            if stepped is generation and text:
                pieces.append(text)
    generation.release(reusable=True)
    return "".join(pieces), slot, mapped


def test_a_new_chat_in_a_warmed_slot_replies_the_same_and_keeps_only_its_reservation(
    tiny_model_dir: Path,
) -> None:
    engine, batch, _ = warmed_engine(tiny_model_dir)
    control = make_engine(tiny_model_dir)
    control_batch = batch_of(control)
    control_batch.warm.supported = False  # maps nothing ahead
    Chat(control, "first", 0).turn(0)
    while control_batch.tidy():
        pass
    warmed, room = batch.warm.slot, batch.warm.warmed
    assert warmed is not None and resident_pages(control_batch.pool, warmed) == 0

    text, slot, mapped = new_chat(engine)
    control_text, control_slot, control_mapped = new_chat(control)
    assert text == control_text  # the same greedy reply
    assert slot == control_slot == warmed  # its prompt was read into the warmed slot
    assert control_mapped == 0 and mapped == pages_for(batch.pool, room)
    assert batch.warm.slot is None  # settled


def test_settling_gives_back_the_pages_past_the_reservation(tiny_model_dir: Path) -> None:
    _, batch, _ = warmed_engine(tiny_model_dir)
    slot, room = batch.warm.slot, batch.warm.warmed
    assert slot is not None and room > 2
    batch._slots[slot] = SlotHolder(slot)  # taken, as a start takes it
    batch.warm.settle(2)
    assert batch.warm.slot is None
    assert resident_pages(batch.pool, slot) == pages_for(batch.pool, 2)


def test_a_warmed_slot_nobody_takes_is_given_back(tiny_model_dir: Path) -> None:
    _, batch, first = warmed_engine(tiny_model_dir)
    slot = batch.warm.slot
    assert slot is not None and resident_pages(batch.pool, slot) > 0
    returning = first.turn(1)  # continues in its own slot
    assert returning.holder.index != slot
    assert batch.warm.slot is None
    assert resident_pages(batch.pool, slot) == 0


def test_a_conversation_restored_from_compact_ram_is_written_into_the_warmed_slot(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, batch, first = warmed_engine(tiny_model_dir)
    entry = next(e for e in batch.cache.entries if e.cache_scope == "first")
    assert batch.tiers.compact(entry)  # its slot freed, as idle work or a new chat would
    while batch.tidy():
        pass
    slot = batch.warm.slot
    assert slot is not None and batch.warm.warmed == batch.warm.target
    holders: list[object] = []  # who holds the warmed slot when the start settles it
    settle = batch.warm.settle

    def noting(keep_tokens: int) -> None:
        holders.append(batch.slots_held()[slot])
        settle(keep_tokens)

    monkeypatch.setattr(batch.warm, "settle", noting)
    returning = first.turn(1)
    assert returning.restored.tier == "compact" and returning.cached_tokens > 0
    assert holders == [returning.holder]  # restored into the slot mapped for it
    assert batch.warm.slot is None
    assert batch.warm.target >= len(returning.prompt.ids)  # the next one maps as far


def test_nothing_is_mapped_where_the_kept_conversations_leave_no_room(
    tiny_model_dir: Path,
) -> None:
    engine = make_engine(tiny_model_dir)
    batch = batch_of(engine)
    Chat(engine, "first", 0).turn(0)
    batch.memory.bound_bytes = batch.cache.stats().bytes  # the bound holds what is kept
    batch.idle.headroom_tokens = 0  # and no room is made for a new chat
    assert not batch.warm.step()
    slot = batch.next_new_slot()
    assert slot is not None and resident_pages(batch.pool, slot) == 0


def test_the_worker_maps_the_pages_while_it_has_nothing_else_to_do(tiny_model_dir: Path) -> None:
    """The worker's own loop (worker.Scheduler, in a thread over real pipes)."""
    engine = make_engine(tiny_model_dir)
    batch = batch_of(engine)
    Chat(engine, "first", 0).turn(0)
    worker_idle_until(engine, lambda: batch.warm.warmed == batch.warm.target)
    slot = batch.warm.slot
    assert slot is not None and resident_pages(batch.pool, slot) > 0
