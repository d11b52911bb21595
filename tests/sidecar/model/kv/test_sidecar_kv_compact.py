"""kv_compact on a real KV pool: the tiny generated model's decoder (batch/decoder.py) reads a
prompt into a slot, and its K/V go through each encoding. fp32 comes back bit for bit; int8
within half a scale step of every value; fp16 as numpy rounds it; an encoding grown by
`extend` and cut by `truncate` is the encoding of those positions at once; a restore of N
positions leaves the slot's others as they were; a slot filled as the disk tier reads a file
is the restore of it. (The quality of a chat continued from them:
python -m scripts.bench quality --kv-restore, tests/realmodel/test_realmodel_kv_restore.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from sidecar.model.batch.decoder import BatchDecoder, KvPool, read_spec
from sidecar.model.folder import read_genai_config
from sidecar.model.kv import compact as kv_compact
from sidecar.model.kv.compact import ENCODINGS, CompactKv, Encoding
from sidecar.model.kv.disk import DiskTier, Shape

TOKENS = 100  # positions read into slot 0 (two prefill chunks and a part)


@pytest.fixture(scope="module")
def pool(tiny_model_dir: Path) -> KvPool:
    """Slot 0 holds a prompt's real K/V; slots 1.. are free."""
    spec = read_spec(read_genai_config(tiny_model_dir))
    decoder = BatchDecoder(tiny_model_dir, spec, {}, threads=1, slots=4, length=256)
    ids = np.random.default_rng(7).integers(10, 1000, TOKENS)
    for start in range(0, TOKENS, 64):
        chunk = ids[None, start : start + 64]
        decoder.run(0, chunk, [start])
    return decoder.pool


def tensors(pool: KvPool) -> Iterator[np.ndarray]:
    """Every layer's K and V, in the order kv_compact keeps them."""
    for key, value in zip(pool.keys, pool.values, strict=True):
        yield key
        yield value


def restored(pool: KvPool, kv: CompactKv, slot: int, tokens: int | None = None) -> None:
    pool.free(slot)
    kv_compact.restore(kv, pool, slot, tokens)


def test_the_pool_holds_real_kv(pool: KvPool) -> None:
    for tensor in tensors(pool):
        assert (np.abs(tensor[0, :, :TOKENS]).max(axis=2) > 0).all()  # every position written
        assert not tensor[0, :, TOKENS:].any()  # nothing written past the prompt


def test_fp32_comes_back_bit_for_bit(pool: KvPool) -> None:
    kv = kv_compact.encode(pool, 0, 0, TOKENS, "fp32")
    assert (
        kv.nbytes
        == TOKENS * kv_compact.bytes_per_token(pool, "fp32")
        == TOKENS * (pool.bytes_per_token)
    )
    restored(pool, kv, 1)
    for tensor in tensors(pool):
        original, back = tensor[0, :, :TOKENS], tensor[1, :, :TOKENS]
        assert original.tobytes() == back.tobytes()


def test_int8_is_within_half_a_step_of_every_value(pool: KvPool) -> None:
    kv = kv_compact.encode(pool, 0, 0, TOKENS, "int8")
    assert kv.nbytes == TOKENS * kv_compact.bytes_per_token(pool, "int8")
    restored(pool, kv, 1)
    for tensor, (block,) in zip(tensors(pool), kv.blocks, strict=True):
        original, back = tensor[0, :, :TOKENS], tensor[1, :, :TOKENS]
        assert block.scale is not None and block.scale.shape == original.shape[:2]
        # One step per token and head: its largest magnitude maps to 127.
        peak = np.abs(original).max(axis=2)
        np.testing.assert_allclose(block.scale, peak / 127, rtol=1e-6)
        assert np.abs(block.data.astype(np.int16)).max() <= 127
        error = np.abs(back - original)
        # Half a step, and float32's rounding of the scaling and the product.
        bound = block.scale[..., None] / 2 + 4 * np.finfo(np.float32).eps * peak[..., None]
        assert (error <= bound).all(), float((error - bound).max())
        assert error.max() > 0  # int8 is lossy here: the bound above is what is tested


def test_fp16_is_numpys_rounding(pool: KvPool) -> None:
    kv = kv_compact.encode(pool, 0, 0, TOKENS, "fp16")
    assert kv.nbytes == TOKENS * kv_compact.bytes_per_token(pool, "fp16")
    restored(pool, kv, 1)
    for tensor in tensors(pool):
        original, back = tensor[0, :, :TOKENS], tensor[1, :, :TOKENS]
        assert np.array_equal(back, original.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_extend_then_truncate_is_one_encode(pool: KvPool, encoding: Encoding) -> None:
    grown = kv_compact.encode(pool, 0, 0, 30, encoding)
    grown.extend(kv_compact.encode(pool, 0, 30, 70, encoding))
    grown.extend(kv_compact.encode(pool, 0, 70, TOKENS, encoding))
    assert grown.tokens == TOKENS
    grown.truncate(55)  # inside the second run
    whole = kv_compact.encode(pool, 0, 0, 55, encoding)
    assert grown.tokens == whole.tokens == 55
    assert grown.nbytes == whole.nbytes == 55 * kv_compact.bytes_per_token(pool, encoding)
    restored(pool, grown, 1)
    restored(pool, whole, 2)
    for tensor in tensors(pool):
        assert tensor[1, :, :55].tobytes() == tensor[2, :, :55].tobytes()
        assert not tensor[1, :, 55:].any()  # truncated: nothing past 55 was written


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_restoring_n_of_m_positions_leaves_the_rest_of_the_slot(
    pool: KvPool, encoding: Encoding
) -> None:
    # Two runs, [0, 45) and [45, 100): 40 positions end inside the first, 60 in the second.
    kv = kv_compact.encode(pool, 0, 0, 45, encoding)
    kv.extend(kv_compact.encode(pool, 0, 45, TOKENS, encoding))
    whole = kv_compact.encode(pool, 0, 0, TOKENS, encoding)
    for count in (40, 60):
        pool.free(3)
        for tensor in tensors(pool):
            tensor[3] = 7.5  # what the slot held before (another conversation's positions)
        kv_compact.restore(kv, pool, 3, count)
        restored(pool, whole, 2)
        assert kv.tokens == TOKENS  # a restore does not cut the encoding
        for tensor in tensors(pool):
            assert tensor[3, :, :count].tobytes() == tensor[2, :, :count].tobytes()
            assert (tensor[3, :, count:] == 7.5).all()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_slot_filled_as_a_file_is_read_is_the_restore_of_it(
    pool: KvPool, tmp_path: Path, encoding: Encoding, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversation kept in runs (a turn at a time) is written joined; SlotFiller decodes
    each tensor as DiskTier.read hands it over (on a thread of its own where there are two):
    the slot ends as a restore of the file's KV, N of M positions too."""
    monkeypatch.setattr(kv_compact, "THREADS", threads)
    kv = kv_compact.encode(pool, 0, 0, 30, encoding)
    kv.extend(kv_compact.encode(pool, 0, 30, 70, encoding))
    kv.extend(kv_compact.encode(pool, 0, 70, TOKENS, encoding))
    spec = Shape(len(pool.keys), pool.kv_heads, pool.keys[0].shape[3], encoding)
    disk = DiskTier(tmp_path / "kv", 2**30, "f" * 64, spec)
    writing = disk.begin(kv, list(range(TOKENS)), None, False, TOKENS)
    assert writing is not None
    stored = writing.finish()
    assert stored is not None
    for count in (TOKENS, 60):
        pool.free(3)
        for tensor in tensors(pool):
            tensor[3] = 7.5  # what the slot held before
        with kv_compact.SlotFiller(pool, 3, count) as filler:
            read = disk.read(stored, filler)
        assert read is not None and read.tokens == TOKENS
        whole = kv_compact.encode(pool, 0, 0, TOKENS, encoding)
        assert [a.tobytes() for a in read.arrays()] == [a.tobytes() for a in whole.arrays()]
        kv_compact.restore(kv, pool, 2, count)
        for tensor in tensors(pool):
            assert tensor[3, :, :count].tobytes() == tensor[2, :, :count].tobytes()
            assert (tensor[3, :, count:] == 7.5).all()
