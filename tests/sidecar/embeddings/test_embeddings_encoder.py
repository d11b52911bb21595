"""sidecar/embeddings/encoder.py and scheduler.py on the tiny generated encoder: pooling as
sentence-transformers does it, cuts that keep [SEP], batches by padded tokens, and a pool of
threads whose answers are each input's own vector whatever it was batched with."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sidecar.embeddings import scheduler
from sidecar.embeddings.encoder import Encoder, pool
from sidecar.embeddings.folder import EncoderFolderError, read_spec
from sidecar.embeddings.scheduler import EncoderPool


@pytest.fixture(scope="module")
def encoder(tiny_encoder_dir: Path) -> Encoder:
    return Encoder(read_spec(tiny_encoder_dir))


def test_pooling_modes_match_their_definitions(encoder: Encoder) -> None:
    rng = np.random.default_rng(1)
    hidden = rng.standard_normal((2, 4, 3)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]])
    spec = encoder.spec
    mean = pool(hidden, mask, spec)
    expected = np.stack([hidden[0, :3].mean(0), hidden[1, :2].mean(0)])
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    assert np.allclose(mean, expected, atol=1e-6)
    from dataclasses import replace

    cls = pool(hidden, mask, replace(spec, pooling="cls", normalize=False))
    assert np.array_equal(cls, hidden[:, 0])
    top = pool(hidden, mask, replace(spec, pooling="max", normalize=False))
    assert np.array_equal(top, np.stack([hidden[0, :3].max(0), hidden[1, :2].max(0)]))
    root = pool(hidden, mask, replace(spec, pooling="mean_sqrt_len", normalize=False))
    assert np.allclose(root[1], hidden[1, :2].sum(0) / np.sqrt(2), atol=1e-6)


def test_a_cut_keeps_the_closing_separator(encoder: Encoder) -> None:
    ids = encoder.tokenize(["the cat sat on the mat"])[0]  # [CLS] 6 words [SEP]
    assert len(ids) == 8
    assert encoder.cut(ids, 5) == [*ids[:4], ids[-1]]
    assert encoder.cut(ids, 8) == ids and encoder.cut(ids, 20) == ids


def test_batches_are_bounded_in_padded_tokens_and_shortest_first(encoder: Encoder) -> None:
    pool_ = EncoderPool(encoder, threads=1, nice=0, batch_tokens=12)
    try:
        inputs = [[2] * 6, [2] * 2, [2] * 3, [2] * 12, [2] * 13]
        assert pool_.batches(inputs) == [[1, 2], [0], [3], [4]]  # 3x2, 6, 12, 13 (alone)
    finally:
        pool_.stop()


def test_the_pool_gives_each_input_its_own_vector(encoder: Encoder) -> None:
    texts = [" ".join(["cat"] * n) for n in range(1, 25)]
    ids = encoder.tokenize(texts)
    alone = np.stack([encoder.encode([one])[0] for one in ids])
    pool_ = EncoderPool(encoder, threads=2, nice=5, batch_tokens=40)
    try:
        futures = [pool_.submit(ids) for _ in range(3)]  # several jobs interleaved
        for future in futures:
            assert np.allclose(future.result(timeout=30), alone, atol=1e-6)
    finally:
        pool_.stop()


def test_the_pool_threads_run_at_a_lower_priority(encoder: Encoder) -> None:
    seen: list[int] = []
    original = encoder.encode

    def spy(batch: Sequence[Any]) -> np.ndarray:
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return original(batch)

    encoder.encode = spy  # type: ignore[method-assign]
    pool_ = EncoderPool(encoder, threads=1, nice=7, batch_tokens=64)
    try:
        pool_.submit(encoder.tokenize(["cat"])).result(timeout=30)
    finally:
        pool_.stop()
        del encoder.encode
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert seen == [min(19, base + 7)]


def test_texts_are_tokenized_by_the_pool_in_pieces_at_its_priority(
    encoder: Encoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 58: texts were tokenized whole, in a thread of the event loop's pool, before the
    queue's bound; now by the encoder's threads, a bounded piece at a time."""
    monkeypatch.setattr(scheduler, "TOKENIZE_CHARS", 50)
    seen: list[tuple[int, int]] = []
    original = encoder.token_arrays

    def spy(texts: list[str]) -> list[np.ndarray]:
        seen.append(
            (sum(map(len, texts)), os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        )
        return original(texts)

    encoder.token_arrays = spy  # type: ignore[method-assign]
    pool_ = EncoderPool(encoder, threads=1, nice=7, batch_tokens=64)
    texts = ["the cat sat " * 2] * 7 + ["x" * 80]  # 24 characters each, then one over a piece
    try:
        ids = pool_.tokenize(texts).result(timeout=30)
    finally:
        pool_.stop()
        del encoder.token_arrays
    assert [one.tolist() for one in ids] == encoder.tokenize(texts)
    assert all(one.dtype == np.int32 for one in ids)
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert seen == [(48, min(19, base + 7))] * 3 + [
        (24, min(19, base + 7)),
        (80, min(19, base + 7)),
    ]


def test_a_batch_that_fails_fails_its_request_only(encoder: Encoder) -> None:
    pool_ = EncoderPool(encoder, threads=1, nice=0, batch_tokens=64)
    try:
        broken = pool_.submit([[10**6]])  # an id past the embedding table: onnxruntime raises
        with pytest.raises(Exception):  # noqa: B017  (onnxruntime's own exception type)
            broken.result(timeout=30)
        assert pool_.submit(encoder.tokenize(["cat"])).result(timeout=30).shape == (1, 32)
    finally:
        pool_.stop()


def test_a_graph_of_another_width_than_the_pooling_config_is_refused(
    tiny_encoder_dir: Path, tmp_path: Path
) -> None:
    import json
    import shutil

    folder = tmp_path / "encoder"
    shutil.copytree(tiny_encoder_dir, folder)
    config = folder / "1_Pooling" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "word_embedding_dimension": 8}))
    with pytest.raises(EncoderFolderError, match="vectors of 32 numbers"):
        Encoder(read_spec(folder))
