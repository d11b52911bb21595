"""The conversation cache's tiers on the batched path (model/kv/tiers.py), in one process on the
real engine and the tiny model: idle conversations move from their KV slot to compact RAM and
to the disk tier, least recently used first, with their bytes counted as they really are; a
returning conversation is restored instead of read again; the disk tier keeps scopes apart,
survives a restart, and ignores files it cannot trust; the one KV bound makes a request wait
instead of exceeding it."""

from __future__ import annotations

import logging
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sidecar.ipc import Generate
from sidecar.model.batch.row import BatchGeneration
from sidecar.model.engine import Engine
from sidecar.model.kv.compact import bytes_per_token
from sidecar.model.kv.tiers import NoRoom
from tests.sidecar.support import words

NEW = 8


def message(user: int, turn: int) -> str:
    return words(60, user * 5 + turn)


def to_disk(engine: Engine) -> None:
    """Every idle conversation out of RAM: one byte of PROMPT_CACHE_MB."""
    assert engine.batch is not None
    engine.batch.cache.budget_bytes = 1
    engine.batch.cache.shrink(engine.batch.cache.limit())


def make_engine(model: Path, **options: Any) -> Engine:
    engine = Engine(
        model, num_threads=1, decode_batch_rows=4, max_concurrency=4, prompt_cache_mb=64, **options
    )
    engine.warm_up()
    return engine


def reply(
    engine: Engine, messages: list[tuple[str, str]], scope: str
) -> tuple[BatchGeneration, str]:
    """One request to its end (exactly NEW tokens, greedy), given back to the cache."""
    request = Generate(
        f"{scope}-{len(messages)}",
        tuple(messages),  # type: ignore[arg-type]
        max_new_tokens=NEW,
        min_new_tokens=NEW,
        cache_scope=scope,
    )
    generation = engine.start(request)
    assert isinstance(generation, BatchGeneration)
    assert engine.batch is not None
    pieces = []
    while generation.finish is None:
        for stepped, text in engine.batch.step():
            if stepped is generation and text:
                pieces.append(text)
    generation.release(reusable=True)
    return generation, "".join(pieces)


class Chat:
    def __init__(self, engine: Engine, scope: str, user: int) -> None:
        self.engine, self.scope, self.user = engine, scope, user
        self.messages: list[tuple[str, str]] = []

    def turn(self, turn: int) -> BatchGeneration:
        self.messages.append(("user", message(self.user, turn)))
        generation, text = reply(self.engine, self.messages, self.scope)
        self.messages.append(("assistant", text))
        return generation


def chat_on_disk(model: Path, directory: Path, scope: str, user: int) -> tuple[Chat, Path]:
    """A one-turn chat on a new engine with a disk tier, pushed out of RAM: the chat, its file."""
    engine = make_engine(model, prompt_cache_dir=directory)
    chat = Chat(engine, scope, user)
    chat.turn(0)
    to_disk(engine)
    (path,) = directory.glob("*.kv")
    return chat, path


def tiers(engine: Engine) -> dict[str | None, str]:
    assert engine.batch is not None
    cache = engine.batch.cache
    return {e.cache_scope: engine.batch.tiers.tier_of(e) for e in cache.entries}


def test_idle_conversations_are_compacted_before_any_leaves_ram(tiny_model_dir: Path) -> None:
    """Over the budget, every idle conversation in a slot is encoded to compact RAM (oldest
    first) before any is written to disk or dropped; the books count what each really holds."""
    engine = make_engine(tiny_model_dir)
    batch = engine.batch
    assert batch is not None
    chats = [Chat(engine, f"s{i}", i) for i in range(3)]
    chats[0].turn(0)
    per_token = batch.pool.bytes_per_token
    one = batch.cache.entries[0].kv_len * per_token
    batch.cache.budget_bytes = int(one * 1.5)  # one conversation in its slot, not two
    chats[1].turn(0)
    assert tiers(engine) == {"s0": "compact", "s1": "ram"}
    chats[2].turn(0)
    assert tiers(engine) == {"s0": "compact", "s1": "compact", "s2": "compact"}
    compact = bytes_per_token(batch.pool, "int8")
    for entry in batch.cache.entries:
        assert entry.nbytes == entry.kv_len * compact
    assert batch.cache.stats().bytes <= batch.cache.budget_bytes
    assert batch.cache.evictions == 0  # nothing dropped
    assert all(not key.any() for key in batch.pool.keys)  # every slot's pages given back


def test_a_start_that_moves_a_kept_conversation_down_says_how_long_it_took(
    tiny_model_dir: Path,
) -> None:
    """The room a reply's start makes on its own path (its log line's room_ms): none while the
    bound has room; the time compacting the idle conversation took when it has not."""
    engine = make_engine(tiny_model_dir)
    batch = engine.batch
    assert batch is not None
    first = Chat(engine, "s0", 0).turn(0)
    assert first.room_s == 0  # nothing kept yet
    kept = batch.cache.entries[0].nbytes
    # About one reply's reservation beside s0 in its slot, not two: the next start compacts it
    batch.memory.bound_bytes = int(kept * 1.5)
    second = Chat(engine, "s1", 1).turn(0)
    assert tiers(engine)["s0"] == "compact"
    assert second.room_s > 0 and second.room_moves == (1, 0)


def test_a_returning_conversation_is_restored_and_reuses_its_whole_history(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    engine = make_engine(tiny_model_dir, prompt_cache_dir=tmp_path / "kv")
    batch = engine.batch
    assert batch is not None
    chats = [Chat(engine, f"s{i}", i) for i in range(4)]
    first = [chat.turn(0) for chat in chats]
    per_token = batch.pool.bytes_per_token
    # RAM for about one conversation in compact form: the oldest go to disk
    batch.cache.budget_bytes = int(batch.cache.entries[0].kv_len * per_token * 0.5)
    batch.cache.shrink(batch.cache.limit())
    found = tiers(engine)
    assert "disk" in found.values()
    assert len(list((tmp_path / "kv").glob("*.kv"))) == list(found.values()).count("disk")
    for chat, earlier in zip(chats, first, strict=True):
        before = tiers(engine)[chat.scope]
        generation = chat.turn(1)
        assert generation.restored.tier == before
        # the whole previous prompt, and its reply as far as it tokenizes the same again
        assert generation.cached_tokens >= len(earlier.prompt.ids)
        if before in ("compact", "disk"):
            assert generation.restored.seconds > 0
    assert batch.cache.evictions == 0


def test_a_restored_conversation_replies_as_one_kept_in_fp32_when_exact(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """PROMPT_CACHE_EXACT=true keeps conversations lossless (fp32) in RAM and on disk: the next
    turn's reply is the one a conversation that never left its slot gives."""
    kept = make_engine(tiny_model_dir, prompt_cache_exact=True)
    moved = make_engine(tiny_model_dir, prompt_cache_exact=True, prompt_cache_dir=tmp_path)
    assert moved.batch is not None and moved.batch.tiers.encoding == "fp32"
    for user in range(3):
        one, other = Chat(kept, "a", user), Chat(moved, "a", user)
        for turn in range(3):
            other.turn(turn)
            one.turn(turn)
            assert one.messages == other.messages
            to_disk(moved)
            assert tiers(moved) == {"a": "disk"}
        kept.batch.cache.entries.clear()  # type: ignore[union-attr]
        moved.batch.cache.entries.clear()
        moved.batch.cache.budget_bytes = 64 * 2**20


def test_int8_restore_stays_close_to_fp32(tiny_model_dir: Path) -> None:
    """The default encoding is lossy: the logits after a restored int8 prefix stay within a
    small distance of the fp32 prefix's (the agreement on a real model:
    docs/benchmarks/quality.md)."""
    engine = make_engine(tiny_model_dir)
    batch = engine.batch
    assert batch is not None
    chat = Chat(engine, "q", 0)
    chat.turn(0)
    entry = batch.cache.entries[0]
    holder = entry.generator
    pool = batch.pool
    tokens = holder.kv_len
    ids = np.array([holder.tokens[tokens : tokens + 1] or [5]], dtype=np.int64)
    spare = pool.slots - 1
    for key, value in zip(pool.keys, pool.values, strict=True):  # an fp32 copy of the slot
        key[spare, :, :tokens] = key[holder.slot, :, :tokens]
        value[spare, :, :tokens] = value[holder.slot, :, :tokens]
    reference = batch.decoder.run(spare, ids, [tokens])[0]
    batch.tiers.compact(entry)
    pool.free(spare)
    batch.tiers.restore(entry, spare, tokens)
    restored = batch.decoder.run(spare, ids, [tokens])[0]
    assert np.abs(restored - reference).max() < 0.05 * np.abs(reference).max()


def test_scopes_never_cross_through_the_disk_tier(tiny_model_dir: Path, tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    engine = make_engine(tiny_model_dir, prompt_cache_dir=directory)
    assert engine.batch is not None
    Chat(engine, "alice", 0).turn(0)
    to_disk(engine)
    assert tiers(engine) == {"alice": "disk"}
    (path,) = directory.iterdir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert "alice" not in path.name and len(path.stem) == 32
    # The same words from another scope read everything again
    generation = Chat(engine, "mallory", 0).turn(0)
    assert generation.cached_tokens == 0 and generation.restored.tier is None
    generation = Chat(engine, "alice", 0).turn(0)  # the same first turn again: reused
    assert generation.restored.tier == "disk" and generation.cached_tokens > 0


def test_a_restart_keeps_this_models_files_and_drops_the_rest(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "kv"
    chat, kept = chat_on_disk(tiny_model_dir, directory, "carol", 1)
    # Files this model cannot trust: another model's (or encoding's), a truncated copy,
    # random bytes, a half-written file left by a crash.
    foreign = directory / ("f" * 32 + ".kv")
    data = kept.read_bytes()
    foreign.write_bytes(data.replace(b'"model": "', b'"model": "0', 1))
    (directory / ("a" * 32 + ".kv")).write_bytes(data[: len(data) // 2])
    (directory / ("b" * 32 + ".kv")).write_bytes(os.urandom(4096))
    (directory / ("c" * 32 + ".tmp")).write_bytes(data[:100])
    with caplog.at_level(logging.INFO):
        second = make_engine(tiny_model_dir, prompt_cache_dir=directory)
    assert sorted(directory.iterdir()) == [kept]
    assert sum("conversation cache file ignored" in r.message for r in caplog.records) == 3
    chat.engine = second
    generation = chat.turn(1)
    assert generation.restored.tier == "disk"
    assert generation.cached_tokens > 0


def test_a_file_corrupted_after_indexing_is_never_served(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The file's tensors are decoded into a slot as they are read, before the CRC at its end
    is checked: the turn that finds it bad reads its prompt again and replies exactly as a
    turn that found nothing kept."""
    chat, path = chat_on_disk(tiny_model_dir, tmp_path / "kv", "dave", 2)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the middle of the K/V
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        generation = chat.turn(1)
    assert generation.restored.tier is None and generation.cached_tokens == 0  # read again
    assert any("conversation cache file ignored" in r.message for r in caplog.records)
    assert not path.exists()
    fresh = Chat(make_engine(tiny_model_dir), "dave", 2)
    fresh.messages = chat.messages[:2]
    fresh.turn(1)
    assert fresh.messages[-1] == chat.messages[-1]


def test_an_unwritable_disk_tier_leaves_the_cache_in_ram(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A directory that cannot be made, or one that vanishes (a full or read-only disk fails
    the same write), turns the tier off with one log line; the cache goes on in RAM."""
    with caplog.at_level(logging.ERROR):
        engine = make_engine(tiny_model_dir, prompt_cache_dir=Path("/proc/phi3-kv"))
    assert engine.batch is not None and engine.batch.tiers.disk is not None
    assert not engine.batch.tiers.disk.enabled
    directory = tmp_path / "kv"
    engine = make_engine(tiny_model_dir, prompt_cache_dir=directory)
    assert engine.batch is not None
    chats = [Chat(engine, f"e{i}", i) for i in range(2)]
    for chat in chats:
        chat.turn(0)
    shutil.rmtree(directory)
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        engine.batch.cache.budget_bytes = 1
        engine.batch.cache.shrink(engine.batch.cache.limit())
    messages = [r.message for r in caplog.records]
    assert messages.count("conversation cache disk tier off: RAM only") == 1
    assert not engine.batch.cache.entries  # nothing could stay within one byte of RAM
    engine.batch.cache.budget_bytes = 64 * 2**20
    for chat in chats:
        generation = chat.turn(1)
        assert generation.cached_tokens == 0  # read again, no error
    assert tiers(engine) == {"e0": "ram", "e1": "ram"}


def test_a_request_waits_when_the_running_replies_hold_the_bound(tiny_model_dir: Path) -> None:
    """Running replies reserve their whole length against KV_MEMORY_MB; a request that does not
    fit beside them raises NoRoom (the worker keeps it queued) and leaves nothing changed."""
    engine = make_engine(tiny_model_dir)
    batch = engine.batch
    assert batch is not None
    first = Generate("one", (("user", message(0, 0)),), max_new_tokens=40)
    second = Generate("two", (("user", message(1, 0)),), max_new_tokens=40)
    running = engine.start(first)
    assert isinstance(running, BatchGeneration)
    batch.memory.bound_bytes = int(running.reserved * 1.5)
    entries = list(batch.cache.entries)
    with pytest.raises(NoRoom):
        engine.start(second)
    assert batch.cache.entries == entries and batch.memory.waits == 1
    assert batch.memory.reserved_bytes == running.reserved
    while running.finish is None:
        batch.step()
    running.release(reusable=True)
    assert batch.memory.reserved_bytes == 0
    waiting = engine.start(second)  # room now: the kept conversation moves down if it must
    assert batch.memory.reserved_bytes + batch.cache.stats().bytes <= batch.memory.bound_bytes
    waiting.release(reusable=False)
