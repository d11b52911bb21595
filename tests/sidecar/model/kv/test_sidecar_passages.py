"""The passage store (model/kv/passages.py, batch/passages.py) on the real tiny model: a passage a
request missed is read alone while the worker is idle and placed when a later prompt holds it,
wherever it stands; placed where it was read it is the exact read's K/V bit for bit; the store
keeps its bound, survives a restart through its files, and never serves one owner's, one
prefix's or one model's passages for another."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sidecar.ipc import Generate, Role
from sidecar.model.batch.decoder import BatchDecoder, read_spec
from sidecar.model.batch.passages import PassageReading
from sidecar.model.batch.row import BatchGeneration
from sidecar.model.batch.setup import PassageOptions, passage_reuse
from sidecar.model.engine import Engine
from sidecar.model.kv import compact as kv_compact
from sidecar.model.kv import rotary
from sidecar.model.kv.disk import DiskTier, Shape
from sidecar.model.kv.passages import PassageStore, Run, Wanted
from tests.sidecar.support import worker_idle_until

SYSTEM = "You answer from the passages given, and cite them."
PASSAGES = [
    "The quick brown fox jumps over the lazy dog near the river bank at dawn, every day. " * 2,
    "Python lists are mutable sequences; tuples are immutable, and hashable when their items "
    "are. " * 2,
    "A dictionary maps hashable keys to values and keeps the order keys were inserted in. " * 2,
]


def grounded(question: str, order: list[int], scope: str = "lib", **fields: Any) -> Generate:
    block = "Passages:\n\n" + "\n\n".join(
        f"[{n}] doc\n{PASSAGES[i]}" for n, i in enumerate(order, 1)
    )
    messages: tuple[tuple[Role, str], ...] = (
        ("system", SYSTEM),
        ("user", f"{block}\n\nQuestion: {question}"),
    )
    return Generate(
        "t",
        messages,
        16,
        cache_scope=f"once-{question}-{order}-{scope}",
        passages=tuple(PASSAGES[i] for i in order),
        passage_scope=scope,
        **fields,
    )


def engine_with(model: Path, reuse: str = "exact", **options: Any) -> Engine:
    engine = Engine(
        model,
        prompt_cache_mb=64,
        prefill_chunk=16,
        decode_batch_rows=4,
        max_concurrency=4,
        kv_compact="fp32",
        passages=PassageOptions(64 * 2**20, 0, 4, reuse),  # type: ignore[arg-type]
        **options,
    )
    engine.warm_up()
    return engine


def run(engine: Engine, request: Generate) -> tuple[str, int, int]:
    """The greedy reply, the prompt tokens it read, and those from the passage store."""
    generation = engine.start(request)
    assert isinstance(generation, BatchGeneration)
    text, left = "", generation.prompt_left
    while generation.finish is None:
        text += generation.step() or ""
    generation.release(reusable=True)
    return text, left, generation.passage_cached_tokens


def idle(engine: Engine) -> None:
    assert engine.batch is not None
    while engine.batch.tidy():
        pass


def store_of(engine: Engine) -> PassageStore:
    assert engine.batch is not None and engine.batch.passages is not None
    return engine.batch.passages


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Engine:
    return engine_with(tiny_model_dir)


@pytest.fixture(scope="module")
def moving(tiny_model_dir: Path) -> Engine:
    return engine_with(tiny_model_dir, "moved")


def test_a_grounded_prompt_missed_is_read_while_idle_and_then_found_exactly(
    engine: Engine,
) -> None:
    store = store_of(engine)
    assert passage_reuse(engine.batch) == "exact"
    first = run(engine, grounded("what is a list?", [0, 1, 2]))
    assert first[2] == 0  # nothing stored yet: read as without the store
    assert store.stats().wanted == 1 and store.stats().misses == 3
    idle(engine)
    assert store.stats().entries == 1 and store.stats().wanted == 0
    # The same passages in the same order, another question: their positions are the run's
    prompt = engine.prompts.build(grounded("and a dict?", [0, 1, 2]), engine.max_length)
    _, read, placed = run(engine, grounded("and a dict?", [0, 1, 2]))
    (stored,) = store.runs.values()
    assert placed == len(stored.tokens) and read == len(prompt.ids) - placed
    assert store.stats().hits == 3
    # Its best passage alone first: exact up to that passage's end, the rest read
    _, _, placed = run(engine, grounded("and a set?", [0, 2]))
    assert placed == stored.passages[0][0] + stored.passages[0][1]
    # Another order: exact reuse finds nothing (the first passage differs)
    assert run(engine, grounded("and a tuple?", [1, 0, 2]))[2] == 0


def test_moved_reuse_places_each_passage_where_it_now_stands(moving: Engine) -> None:
    store = store_of(moving)
    assert passage_reuse(moving.batch) == "exact+moved"
    run(moving, grounded("what is a list?", [0, 1, 2]))
    idle(moving)
    _, _, placed = run(moving, grounded("what is a dict?", [2, 0, 1]))
    (stored,) = store.runs.values()
    lengths = [length for _, length in stored.passages]
    assert placed == sum(lengths) - 3 * store.recompute  # each one's first tokens read again
    assert store.stats().hits == 3


def test_another_owner_or_system_message_finds_nothing(moving: Engine) -> None:
    run(moving, grounded("what is a tuple?", [1, 0], scope="mine"))
    idle(moving)
    assert run(moving, grounded("and a set?", [1, 0], scope="mine"))[2] > 0
    assert run(moving, grounded("and a set?", [1, 0], scope="theirs"))[2] == 0
    other = grounded("and a set?", [1, 0], scope="mine")
    other_system = Generate(
        "t",
        (("system", "Another system message."), other.messages[1]),
        16,
        passages=other.passages,
        passage_scope="mine",
    )
    assert run(moving, other_system)[2] == 0


def test_exact_replies_read_every_passage(tiny_model_dir: Path) -> None:
    exact = engine_with(tiny_model_dir, prompt_cache_exact=True)
    assert passage_reuse(exact.batch) == "off"
    run(exact, grounded("what is a list?", [0, 1]))
    idle(exact)
    assert run(exact, grounded("what is a dict?", [0, 1]))[2] == 0


def test_the_worker_reads_wanted_runs_while_it_has_nothing_else_to_do(
    tiny_model_dir: Path,
) -> None:
    engine = engine_with(tiny_model_dir)
    store = store_of(engine)
    run(engine, grounded("what is a list?", [0, 1, 2]))
    worker_idle_until(engine, lambda: store.stats().entries == 1)
    assert store.stats().wanted == 0
    assert engine.batch is not None and engine.batch.memory.set_aside == 0


def test_a_request_arriving_mid_reading_takes_the_slot_and_the_wish_stays(
    tiny_model_dir: Path,
) -> None:
    engine = engine_with(tiny_model_dir)
    assert engine.batch is not None
    run(engine, grounded("what is a list?", [0]))
    assert engine.batch.tidy()  # one piece of the reading
    assert engine.batch.reading is not None
    run(engine, Generate("t", (("user", "Hello"),), 8))
    assert engine.batch.reading is None and store_of(engine).stats().wanted == 1
    assert engine.batch.memory.set_aside == 0
    idle(engine)
    assert store_of(engine).stats().entries == 1


def spec_and_decoder(model: Path) -> tuple[Any, BatchDecoder]:
    spec = read_spec(json.loads((model / "genai_config.json").read_text()))
    return spec, BatchDecoder(model, spec, {}, 2, 3, 512)


def test_a_run_placed_where_it_was_read_is_the_exact_read_bit_for_bit(
    tiny_model_dir: Path,
) -> None:
    """A run read alone (its prefix, then the rest in chunks from the prefix's end), placed
    where it was read: the K/V of the exact read in the same calls, bit for bit; a passage
    of it moved elsewhere: values as they were, keys turned (and turned back, close)."""
    spec, decoder = spec_and_decoder(tiny_model_dir)
    tables = rotary.read(tiny_model_dir, spec.filename, spec.head_size)
    store = PassageStore(tables, 2**30, "fp32", 0, "moved")
    tokens = tuple(range(3, 23)) + tuple(range(100, 160))
    wanted = Wanted(None, tokens, 20, ((20, 60),))
    reading = PassageReading(store, decoder, wanted, 0, 16)
    while not reading.done:
        reading.step()
    stored = store.exact(None, tokens, 80)
    assert stored is not None and stored.kv is not None
    pool = decoder.pool
    decoder.run(1, np.array([tokens[:20]]), [0])
    for start in range(20, 80, 16):
        decoder.run(1, np.array([tokens[start : min(start + 16, 80)]]), [start])
    store.place(stored.kv, pool, 2, 0, 0, 80)
    for layer in range(spec.layers):
        for tensors in (pool.keys, pool.values):
            assert np.array_equal(tensors[layer][2, :, :80], tensors[layer][1, :, :80])
    moved = store.moved(None, tokens[:20], tokens[20:])
    assert moved is not None and moved[1] == 20
    pool.free(2)
    store.place(stored.kv, pool, 2, 20, 57, 60)  # the passage, 37 positions on
    for layer in range(spec.layers):
        assert np.array_equal(pool.values[layer][2, :, 57:117], pool.values[layer][1, :, 20:80])
        back = np.empty_like(pool.keys[layer][2, :, 57:117])
        tables.move(pool.keys[layer][2, :, 57:117], -37, back)
        np.testing.assert_allclose(back, pool.keys[layer][1, :, 20:80], atol=1e-4)


def kv_of(tokens: int, heads: int = 2, size: int = 8, layers: int = 2) -> kv_compact.CompactKv:
    data = np.ones((heads, tokens, size), np.float32)
    blocks = [[kv_compact.Block(data.copy())] for _ in range(2 * layers)]
    return kv_compact.CompactKv("fp32", tokens, blocks)


def a_run(first: int, scope: str | None = "s", tokens: int = 20) -> Run:
    ids = tuple(range(first, first + tokens))
    return Run(scope, ids, 4, ((4, tokens - 4),), kv_of(tokens))


def test_the_bound_holds_least_recently_used_first() -> None:
    one = kv_of(20).nbytes
    store = PassageStore(None, 2 * one, "fp32", 0)
    runs = [a_run(100 * i) for i in range(3)]
    for item in runs[:2]:
        store.put(item)
    assert store.exact("s", runs[0].tokens, 20) is not None  # now the most recently used
    store.put(runs[2])
    assert store.ram_bytes() <= 2 * one
    assert store.exact("s", runs[1].tokens, 20) is None
    assert store.exact("s", runs[0].tokens, 20) is not None


def kv_files(directory: Path) -> list[str]:
    """The store's files (a deleted one is renamed .del and unlinked on a thread)."""
    return [name for name in os.listdir(directory) if name.endswith(".kv")]


def disk_store(directory: Path, fingerprint: str, budget: int = 2**30) -> PassageStore:
    shape = Shape(2, 2, 8, "fp32")
    disk = DiskTier(directory, budget, fingerprint, shape, "passage store disk tier")
    store = PassageStore(None, 2**30, "fp32", 0, disk=disk)
    store.adopt(disk.scan())
    return store


def test_the_store_survives_a_restart_through_its_files_and_only_for_its_model(
    tmp_path: Path,
) -> None:
    item = a_run(7, "owner:x/s")
    first = disk_store(tmp_path / "passages", "model-a")
    first.put(item)
    assert not kv_files(tmp_path / "passages")  # written while idle, a piece a step
    while first.write_step():
        pass
    assert (tmp_path / "passages").stat().st_mode & 0o777 == 0o700
    files = kv_files(tmp_path / "passages")
    assert len(files) == 1 and os.stat(tmp_path / "passages" / files[0]).st_mode & 0o777 == 0o600
    again = disk_store(tmp_path / "passages", "model-a")  # a new worker
    found = again.exact("owner:x/s", item.tokens, 20)
    assert found is not None and found.passages == item.passages and found.kv is not None
    assert np.array_equal(found.kv.blocks[0][0].data, kv_of(20).blocks[0][0].data)
    assert again.exact("owner:y/s", item.tokens, 20) is None
    other = disk_store(tmp_path / "passages", "model-b")  # another model's worker
    assert other.exact("owner:x/s", item.tokens, 20) is None
    assert not kv_files(tmp_path / "passages")


def test_a_damaged_file_is_a_miss_never_a_crash(tmp_path: Path) -> None:
    item = a_run(1, None)
    store = disk_store(tmp_path, "m")
    store.put(item)
    while store.write_step():
        pass
    (name,) = kv_files(tmp_path)
    with open(tmp_path / name, "r+b") as file:
        file.seek(-40, os.SEEK_END)
        file.write(b"\x00" * 8)
    again = disk_store(tmp_path, "m")
    assert again.exact(None, item.tokens, 20) is None and not kv_files(tmp_path)
