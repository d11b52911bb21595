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

from sidecar.ipc import Generate
from sidecar.model.batch.decoder import BatchDecoder, read_spec
from sidecar.model.batch.passages import PassageReading
from sidecar.model.batch.row import BatchGeneration
from sidecar.model.batch.setup import PassageOptions
from sidecar.model.engine import Engine
from sidecar.model.kv import compact as kv_compact
from sidecar.model.kv import rotary
from sidecar.model.kv.disk import DiskTier, Shape
from sidecar.model.kv.passages import PassageKey, PassageStore, Wanted, digest
from tests.sidecar.support import worker_idle_until

SYSTEM = "You answer from the passages given, and cite them."
PASSAGES = [
    "The quick brown fox jumps over the lazy dog near the river bank at dawn, every day. " * 2,
    "Python lists are mutable sequences; tuples are immutable, and hashable when their items "
    "are. " * 2,
    "A dictionary maps hashable keys to values and keeps the order keys were inserted in. " * 2,
]


def grounded(question: str, order: list[int], scope: str = "lib", **fields: Any) -> Generate:
    block = "Passages:\n\n" + "\n\n".join(f"[{n}] doc\n{PASSAGES[i]}" for n, i in enumerate(order, 1))
    messages = (("system", SYSTEM), ("user", f"{block}\n\nQuestion: {question}"))
    return Generate(
        "t",
        messages,
        16,
        cache_scope=f"once-{question}-{order}-{scope}",
        passages=tuple(PASSAGES[i] for i in order),
        passage_scope=scope,
        **fields,
    )


def engine_with(model: Path, **options: Any) -> Engine:
    store = options.pop("store", PassageOptions(64 * 2**20, 0, 0))
    engine = Engine(
        model,
        prompt_cache_mb=64,
        prefill_chunk=16,
        decode_batch_rows=4,
        max_concurrency=4,
        kv_compact="fp32",
        passages=store,
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
    return text, left - generation.passage_cached_tokens, generation.passage_cached_tokens


def idle(engine: Engine) -> None:
    assert engine.batch is not None
    while engine.batch.tidy():
        pass


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Engine:
    return engine_with(tiny_model_dir)


def test_missed_passages_are_read_while_idle_and_placed_wherever_they_stand(
    engine: Engine,
) -> None:
    assert engine.batch is not None and engine.batch.passages is not None
    store = engine.batch.passages
    assert engine.passage_reuse() == "rotated"
    first = run(engine, grounded("what is a list?", [0, 1, 2]))
    assert first[2] == 0  # nothing stored yet: read in the prompt, as without the store
    assert store.stats().wanted == 3 and store.stats().misses == 3
    idle(engine)
    assert store.stats().entries == 3 and store.stats().wanted == 0
    # Another question, its passages in another order: each placed where it now stands
    _, read, placed = run(engine, grounded("what is a dict?", [2, 0, 1]))
    tokens = sum(len(key.tokens) for key in store.entries)
    assert placed == tokens - 1 or placed == tokens  # the prompt's last token is always read
    assert store.stats().hits == 3


def test_another_owner_or_system_message_finds_nothing(engine: Engine) -> None:
    assert engine.batch is not None and engine.batch.passages is not None
    run(engine, grounded("what is a tuple?", [1, 0], scope="mine"))
    idle(engine)
    assert run(engine, grounded("and a set?", [0, 1], scope="mine"))[2] > 0
    assert run(engine, grounded("and a set?", [0, 1], scope="theirs"))[2] == 0
    other = grounded("and a set?", [0, 1], scope="mine")
    other_system = Generate(
        "t",
        (("system", "Another system message."), other.messages[1]),
        16,
        passages=other.passages,
        passage_scope="mine",
    )
    assert run(engine, other_system)[2] == 0


def test_exact_replies_read_every_passage(tiny_model_dir: Path) -> None:
    exact = engine_with(tiny_model_dir, prompt_cache_exact=True)
    assert exact.passage_reuse() == "off"
    run(exact, grounded("what is a list?", [0, 1]))
    idle(exact)
    assert run(exact, grounded("what is a dict?", [1, 0]))[2] == 0


def test_the_worker_reads_wanted_passages_while_it_has_nothing_else_to_do(
    tiny_model_dir: Path,
) -> None:
    engine = engine_with(tiny_model_dir)
    assert engine.batch is not None and engine.batch.passages is not None
    store = engine.batch.passages
    run(engine, grounded("what is a list?", [0, 1, 2]))
    worker_idle_until(engine, lambda: store.stats().entries == 3)
    assert store.stats().wanted == 0
    assert engine.batch.memory.set_aside == sum(p.nbytes for p in engine.batch.shared)


def test_a_request_arriving_mid_reading_takes_the_slot_and_the_wish_stays(
    tiny_model_dir: Path,
) -> None:
    engine = engine_with(tiny_model_dir)
    assert engine.batch is not None and engine.batch.passages is not None
    run(engine, grounded("what is a list?", [0]))
    assert engine.batch.tidy()  # one piece of the reading
    assert engine.batch.reading is not None
    run(engine, Generate("t", (("user", "Hello"),), 8))
    assert engine.batch.reading is None and engine.batch.passages.stats().wanted == 1
    assert engine.batch.memory.set_aside == 0
    idle(engine)
    assert engine.batch.passages.stats().entries == 1


def spec_and_decoder(model: Path) -> tuple[Any, BatchDecoder]:
    spec = read_spec(json.loads((model / "genai_config.json").read_text()))
    return spec, BatchDecoder(model, spec, {}, 2, 3, 512)


def test_a_passage_placed_where_it_was_read_is_the_exact_read_bit_for_bit(
    tiny_model_dir: Path,
) -> None:
    """Read alone after its prefix, then placed right after the same prefix, with nothing read
    again: the K/V are the exact read's (the same calls: the prefix, then the passage in
    chunks from its end), bit for bit; moved elsewhere, values stay and keys turn."""
    spec, decoder = spec_and_decoder(tiny_model_dir)
    tables = rotary.read(tiny_model_dir, spec.filename, spec.head_size)
    store = PassageStore(tables, 2**30, "fp32", 0)
    prefix, tokens = tuple(range(3, 23)), tuple(range(100, 160))
    key = PassageKey(None, digest(prefix), tokens)
    reading = PassageReading(store, decoder, Wanted(key, prefix), 0, 16)
    while not reading.done:
        reading.step()
    found = store.find(key)
    assert found is not None
    entry, kv = found
    pool = decoder.pool
    # The exact read of [prefix; passage] in slot 1, in the same calls
    decoder.run(1, np.array([prefix]), [0])
    for start in range(0, len(tokens), 16):
        decoder.run(1, np.array([tokens[start : start + 16]]), [20 + start])
    store.place(entry, kv, pool, 2, 20, (0, len(tokens)))
    for layer in range(spec.layers):
        for tensors in (pool.keys, pool.values):
            assert np.array_equal(tensors[layer][2, :, 20:80], tensors[layer][1, :, 20:80])
    # Moved by 37 positions and read back: values as they were, keys turned and turned back
    pool.free(2)
    store.place(entry, kv, pool, 2, 57, (0, len(tokens)))
    for layer in range(spec.layers):
        assert np.array_equal(pool.values[layer][2, :, 57:117], pool.values[layer][1, :, 20:80])
        back = np.empty_like(pool.keys[layer][2, :, 57:117])
        tables.move(pool.keys[layer][2, :, 57:117], -37, back)
        np.testing.assert_allclose(back, pool.keys[layer][1, :, 20:80], atol=1e-4)


def kv_of(tokens: int, heads: int = 2, size: int = 8, layers: int = 2) -> kv_compact.CompactKv:
    data = np.ones((heads, tokens, size), np.float32)
    blocks = [[kv_compact.Block(data.copy())] for _ in range(2 * layers)]
    return kv_compact.CompactKv("fp32", tokens, blocks)


def test_the_bound_holds_least_recently_used_first() -> None:
    one = kv_of(20).nbytes
    store = PassageStore(None, 2 * one, "fp32", 0)
    keys = [PassageKey("s", "p", (i,) * 20) for i in range(3)]
    store.rotary = object()  # type: ignore[assignment]  # enabled: keys may move
    for key in keys[:2]:
        store.put(key, 5, kv_of(20))
    assert store.find(keys[0]) is not None  # now the most recently used
    store.put(keys[2], 5, kv_of(20))
    assert store.ram_bytes() <= 2 * one
    assert store.find(keys[1]) is None and store.find(keys[0]) is not None


def kv_files(directory: Path) -> list[str]:
    """The store's files (a deleted one is renamed .del and unlinked on a thread)."""
    return [name for name in os.listdir(directory) if name.endswith(".kv")]


def disk_store(directory: Path, fingerprint: str, budget: int = 2**30) -> PassageStore:
    shape = Shape(2, 2, 8, "fp32")
    disk = DiskTier(directory, budget, fingerprint, shape, "passage store disk tier")
    store = PassageStore(object(), 2**30, "fp32", 0, disk=disk)  # type: ignore[arg-type]
    store.adopt(disk.scan())
    return store


def test_the_store_survives_a_restart_through_its_files_and_only_for_its_model(
    tmp_path: Path,
) -> None:
    key = PassageKey("owner:x/s", digest((1, 2, 3)), tuple(range(20)))
    first = disk_store(tmp_path / "passages", "model-a")
    first.put(key, 3, kv_of(20))
    assert (tmp_path / "passages").stat().st_mode & 0o777 == 0o700
    files = os.listdir(tmp_path / "passages")
    assert len(files) == 1 and os.stat(tmp_path / "passages" / files[0]).st_mode & 0o777 == 0o600
    again = disk_store(tmp_path / "passages", "model-a")  # a new worker
    found = again.find(key)
    assert found is not None and found[0].at == 3
    assert np.array_equal(found[1].blocks[0][0].data, kv_of(20).blocks[0][0].data)
    assert again.find(PassageKey("owner:y/s", key.prefix, key.tokens)) is None
    other = disk_store(tmp_path / "passages", "model-b")  # another model's worker
    assert other.find(key) is None and not kv_files(tmp_path / "passages")


def test_a_damaged_file_is_a_miss_never_a_crash(tmp_path: Path) -> None:
    key = PassageKey(None, digest((1,)), tuple(range(20)))
    disk_store(tmp_path, "m").put(key, 1, kv_of(20))
    (name,) = os.listdir(tmp_path)
    with open(tmp_path / name, "r+b") as file:
        file.seek(-40, os.SEEK_END)
        file.write(b"\x00" * 8)
    again = disk_store(tmp_path, "m")
    assert again.find(key) is None and not kv_files(tmp_path)
