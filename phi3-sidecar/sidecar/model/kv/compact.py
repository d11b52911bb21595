"""An idle conversation's KV cache kept compactly in RAM (and written as it is to the disk tier).

A KV pool slot (batch.decoder.KvPool) holds the model's KV type, fp32 on the CPU: 0.75 MiB a
token for Phi-3-mini. An idle conversation does not need that form until its user returns, so
the cache keeps it encoded here and copies it back into a slot (decoding) when it is lent
again: restore instead of re-read.

Encodings (KV_COMPACT; measured: restore times in docs/benchmarks/users-turns.md, the quality of a
chat continued from each, `python -m scripts.bench quality --kv-restore`, in
docs/benchmarks/quality.md, "Compact KV: quality of a restored conversation"):
- `int8`: each token's vector of each head, K and V alike, scaled by its own largest magnitude
  to -127..127 (symmetric, per token and head; one float32 scale per 96 or 64 values): 3.8x
  fewer bytes than fp32 (Phi-3-mini: 200 KiB a token);
- `fp16`: half the bytes; rounding only;
- `fp32`: the slot's bytes as they are (lossless: what PROMPT_CACHE_EXACT=true uses).
Tokens are encoded independently, so a conversation that grew by a turn encodes only its new
tokens (`extend`), and a shorter reuse keeps a prefix (`truncate`).

Decoding writes into the slot's first positions in place; numpy's arithmetic releases the GIL,
so the layers are split over the CPU's threads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np

from sidecar.model.batch.decoder import KvPool

Encoding = Literal["int8", "fp16", "fp32"]
ENCODINGS: tuple[Encoding, ...] = ("int8", "fp16", "fp32")
_FLOAT = {"fp16": np.float16, "fp32": np.float32}


@dataclass
class Block:
    """One K or V tensor of one layer for a run of tokens: [kv_heads, tokens, head_size] of
    the encoding's type, and for int8 the scales [kv_heads, tokens] (float32)."""

    data: np.ndarray
    scale: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes + (0 if self.scale is None else self.scale.nbytes))


@dataclass
class CompactKv:
    """The K and V of every layer for the first `tokens` positions of a conversation:
    `blocks[layer * 2]` is a layer's K, `blocks[layer * 2 + 1]` its V (each a list of runs)."""

    encoding: Encoding
    tokens: int
    blocks: list[list[Block]]

    @property
    def nbytes(self) -> int:
        return sum(block.nbytes for runs in self.blocks for block in runs)

    def extend(self, more: CompactKv) -> None:
        """Append the encoding of the positions right after these."""
        assert more.encoding == self.encoding
        for runs, added in zip(self.blocks, more.blocks, strict=True):
            runs.extend(added)
        self.tokens += more.tokens

    def truncate(self, tokens: int) -> None:
        """Keep the first `tokens` positions only."""
        if tokens >= self.tokens:
            return
        for index, runs in enumerate(self.blocks):
            kept: list[Block] = []
            left = tokens
            for block in runs:
                if left <= 0:
                    break
                size = block.data.shape[1]
                if size > left:
                    # A view when most of the block stays (no second copy of it while it is
                    # restored); a copy when most goes (the rest's memory is given back).
                    keep: Any = (lambda a: a) if 2 * left >= size else np.copy
                    scale = None if block.scale is None else keep(block.scale[:, :left])
                    block = Block(keep(block.data[:, :left]), scale)
                kept.append(block)
                left -= min(size, left)
            self.blocks[index] = kept
        self.tokens = tokens

    def arrays(self) -> Iterator[np.ndarray]:
        """Every array, in a fixed order (the disk tier writes them so)."""
        for runs in self.blocks:
            for block in runs:
                yield block.data
                if block.scale is not None:
                    yield block.scale


def bytes_per_token(pool: KvPool, encoding: Encoding) -> int:
    """What one position of one conversation costs in this encoding (every layer, K and V)."""
    layers = len(pool.keys)
    head_size = pool.keys[0].shape[3]
    if encoding == "int8":
        per_head = head_size + 4  # the values, and one float32 scale
    else:
        per_head = head_size * np.dtype(_FLOAT[encoding]).itemsize
    return 2 * layers * pool.kv_heads * per_head


def encode(pool: KvPool, slot: int, start: int, end: int, encoding: Encoding) -> CompactKv:
    """Positions start..end-1 of a pool slot, encoded."""
    tensors = _tensors(pool)

    def one(tensor: np.ndarray) -> list[Block]:
        return [_encode(tensor[slot, :, start:end], encoding)]

    return CompactKv(encoding, end - start, _parallel(one, tensors))


def restore(
    kv: CompactKv, pool: KvPool, slot: int, tokens: int | None = None, start: int = 0
) -> None:
    """Decode positions `start` to `tokens` - 1 (all by default) into the same positions of a
    pool slot; what the slot held elsewhere is left as it was."""
    count = kv.tokens if tokens is None else min(tokens, kv.tokens)

    def one(pair: tuple[np.ndarray, list[Block]]) -> None:
        tensor, runs = pair
        position = 0
        for block in runs:
            if position >= count:
                break
            _decode(block, tensor[slot], position, count, start)
            position += block.data.shape[1]

    _parallel(one, list(zip(_tensors(pool), kv.blocks, strict=True)))


class SlotFiller:
    """Decodes a conversation's tensors into a pool slot as a reader hands them over, one
    block per tensor in `restore`'s order (kv.disk.DiskTier.read), on a thread beside the
    reader's: one tensor is decoded while the next is read (a 900-token Phi-3-mini
    conversation from disk: 225 ms read then decoded, 150 ms so, AMD EPYC 2 vCPUs). The
    reader's own checks end after its last tensor: where they fail the slot holds garbage,
    and its caller frees it."""

    def __init__(self, pool: KvPool, slot: int, tokens: int) -> None:
        self._tensors = _tensors(pool)
        self._slot = slot
        self._tokens = tokens
        self._executor = ThreadPoolExecutor(1) if THREADS > 1 else None
        self._pending: list[Future[None]] = []

    def __call__(self, index: int, block: Block) -> None:
        target = self._tensors[index][self._slot]
        if self._executor is None:
            _decode(block, target, 0, self._tokens)
        else:
            self._pending.append(self._executor.submit(_decode, block, target, 0, self._tokens))

    def __enter__(self) -> SlotFiller:
        return self

    def __exit__(self, *_: object) -> None:
        """Waits for every tensor handed over (an error decoding one is raised here)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        for pending in self._pending:
            pending.result()


def _tensors(pool: KvPool) -> list[np.ndarray]:
    """Every layer's K then V: the order of CompactKv.blocks."""
    return [t for layer in zip(pool.keys, pool.values, strict=True) for t in layer]


def _decode(block: Block, slot: np.ndarray, position: int, count: int, start: int = 0) -> None:
    """Write a run that begins at `position` into a slot's tensor [kv_heads, length,
    head_size], up to position `count` - 1 and from position `start` on."""
    size = min(block.data.shape[1], count - position)
    skip = min(size, max(0, start - position))  # the run's positions before start
    if skip >= size:
        return
    target = slot[:, position + skip : position + size]
    data = block.data[:, skip:size]
    if block.scale is None:
        target[...] = data
    else:
        np.multiply(data, block.scale[:, skip:size, None], out=target)


_RUN = 128  # tokens encoded at a time: the temporaries stay in the CPU's cache


def _encode(values: np.ndarray, encoding: Encoding) -> Block:
    """[kv_heads, tokens, head_size] float values as one block."""
    if encoding != "int8":
        return Block(values.astype(_FLOAT[encoding], copy=True))
    heads, tokens, size = values.shape
    data = np.empty((heads, tokens, size), np.int8)
    scale = np.empty((heads, tokens), np.float32)
    work = np.empty((heads, min(tokens, _RUN), size), np.float32)
    for start in range(0, tokens, _RUN):
        end = min(tokens, start + _RUN)
        part, scratch = values[:, start:end], work[:, : end - start]
        np.abs(part, out=scratch)
        peak = scratch.max(axis=2)
        scale[:, start:end] = peak / 127
        inverse = np.divide(127, peak, out=np.zeros_like(peak), where=peak > 0)
        np.multiply(part, inverse[..., None], out=scratch)
        np.rint(scratch, out=scratch)
        data[:, start:end] = scratch
    return Block(data, scale)


_T = TypeVar("_T")
_R = TypeVar("_R")
THREADS = 2  # set by the engine to its CPU budget (cpus.py); numpy releases the GIL here


def _parallel(function: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
    if THREADS <= 1:
        return [function(item) for item in items]
    with ThreadPoolExecutor(THREADS) as executor:
        return list(executor.map(function, items))
