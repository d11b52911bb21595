"""Room for a returning user made while the worker is idle (model/kv/idle.py, kv/tiers.py,
kv.disk.Writing), in one process on the real engine and the tiny model with a disk tier: a user
whose conversation is on disk needs RAM for its copy read back, and without idle work their
start wrote another conversation to disk on its own path. Idle work writes that conversation a
piece at a time instead, so the start moves nothing; a start that comes mid-write finishes the
same file (never begins it again); a user who returns while their own conversation is being
written waits for no write and replies exactly as if it had never begun (KV_COMPACT=fp32)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sidecar.model.batch.scheduler import BatchScheduler
from sidecar.model.engine import Engine
from tests.sidecar.model.kv.test_sidecar_kv_tiers import Chat, make_engine, tiers, to_disk


def returning_users(
    model: Path, directory: Path, **options: Any
) -> tuple[Engine, BatchScheduler, list[Chat]]:
    """Three one-turn chats on disk, and a cache budget for two and a half of them: the first
    returns (its copy read back into RAM), and the next returning user's start must then write
    the first to disk again to make room for its own copy."""
    engine = make_engine(model, prompt_cache_dir=directory, kv_compact="fp32", **options)
    batch = engine.batch
    assert batch is not None
    chats = [Chat(engine, f"u{i}", i) for i in range(3)]
    for chat in chats:
        chat.turn(0)
    to_disk(engine)
    longest = max(e.kv_len for e in batch.cache.entries)
    batch.cache.budget_bytes = int(longest * batch.pool.bytes_per_token * 2.5)
    assert chats[0].turn(1).restored.tier == "disk"
    assert tiers(engine) == {"u0": "compact", "u1": "disk", "u2": "disk"}
    batch.idle.piece_bytes = 1  # a tensor a step
    return engine, batch, chats


def tidy_all(batch: BatchScheduler) -> int:
    steps = 0
    while batch.tidy():
        steps += 1
    return steps


def temporary_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.tmp"))


def test_without_idle_work_a_returning_user_writes_another_to_disk_first(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    _, _, chats = returning_users(tiny_model_dir, tmp_path / "kv")
    second = chats[1].turn(1)
    assert second.restored.tier == "disk"
    assert second.room_moves == (0, 1) and second.room_s > 0  # what idle work takes off


def test_idle_work_writes_it_in_pieces_and_leaves_the_returning_user_nothing(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    engine, batch, chats = returning_users(tiny_model_dir, tmp_path / "kv")
    assert batch.tidy()
    assert batch.tiers.writing is not None and tiers(engine)["u0"] == "compact"  # begun only
    assert len(temporary_files(tmp_path / "kv")) == 1
    tidy_all(batch)
    tensors = 2 * len(batch.pool.keys)
    assert batch.idle.written_pieces > tensors  # a tensor a step (and the header first)
    assert tiers(engine)["u0"] == "disk" and not temporary_files(tmp_path / "kv")
    assert batch.cache.stats().bytes == 0
    second = chats[1].turn(1)
    assert second.restored.tier == "disk"
    assert second.room_moves == (0, 0)  # the room was made before the user came


def test_a_start_mid_write_finishes_the_same_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine, batch, chats = returning_users(tiny_model_dir, tmp_path / "kv")
    assert batch.tidy() and batch.tidy()
    assert batch.tiers.writing is not None
    _, writing = batch.tiers.writing
    disk = batch.tiers.disk
    assert disk is not None
    writes = disk.writes
    second = chats[1].turn(1)
    assert second.room_moves == (0, 1)  # the rest of the write, on its path
    assert disk.writes == writes + 1 and batch.tiers.writing is None
    first = next(e for e in batch.cache.entries if e.cache_scope == "u0")
    assert first.generator.holding.stored is writing.stored  # the very file begun while idle
    assert writing.stored.path.exists() and not temporary_files(tmp_path / "kv")
    assert tiers(engine)["u0"] == "disk"


def test_a_user_returning_mid_write_of_their_own_conversation_waits_for_no_write(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    _, batch, chats = returning_users(tiny_model_dir, tmp_path / "kv")
    _, _, control = returning_users(tiny_model_dir, tmp_path / "control")
    assert batch.tidy() and batch.tidy()  # part of u0's file written
    again = chats[0].turn(2)
    assert again.restored.tier == "compact"  # from RAM: nothing of the write waited for
    assert again.room_moves == (0, 0)  # nor any other move on its path
    assert batch.tiers.writing is None and not temporary_files(tmp_path / "kv")
    same = control[0].turn(2)
    assert same.restored.tier == "compact"
    assert chats[0].messages == control[0].messages  # the same greedy reply
    assert again.cached_tokens == same.cached_tokens


def test_no_room_is_kept_for_returning_users_before_one_needed_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    engine, batch, _ = returning_users(tiny_model_dir, tmp_path / "kv")
    batch.idle._returns.clear()  # as before any returning user
    steps = tidy_all(batch)
    assert batch.idle.written_pieces == 0 and tiers(engine)["u0"] == "compact"
    assert steps == batch.warm.pieces  # only the slot pages mapped (kv/warm.py)


def test_without_a_disk_tier_idle_work_writes_nothing(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    batch = engine.batch
    assert batch is not None
    Chat(engine, "u0", 0).turn(0)
    batch.idle.saw_return(batch.memory.bound_bytes, batch.memory.bound_bytes)  # no room at all
    tidy_all(batch)
    assert batch.idle.written_pieces == 0
    assert tiers(engine) == {"u0": "ram"}
