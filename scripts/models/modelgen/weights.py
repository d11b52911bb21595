"""Random weights streamed into the external data file: packed int4 matrices with fp32 scales,
fp32 tensors, and the LM head's per-token scales that mute unprintable tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from onnx import TensorProto

from scripts.models.modelgen.vocab import byte_chars, special_ids

BLOCK = 32  # int4 block size of the official model
ROWS_PER_CHUNK = 1024  # rows of a weight matrix generated at once: memory stays bounded
# Changing it changes tiny's replies: EOS_PROMPT and LONG_PROMPT (config.py) must be re-checked.
EOS_BOOST = 1.2  # multiplies the LM head scales of <|end|>: higher ends replies sooner


class DataFile:
    """Streams initializers into one external data file; with `path=None` it only counts bytes."""

    def __init__(self, path: Path | None, location: str, seed: int) -> None:
        self.file: BinaryIO | None = path.open("wb") if path else None
        self.location = location
        self.seed = seed
        self.offset = 0
        self.count = 0

    def rng(self) -> np.random.Generator:
        # One stream per tensor, so a tensor's values never depend on how it is chunked.
        self.count += 1
        return np.random.default_rng([self.seed, self.count])

    def tensor(self, name: str, dims: list[int], dtype: int, chunks: Any) -> TensorProto:
        """Write what `chunks()` yields (arrays, in order) as one tensor; skipped if counting."""
        item = 4 if dtype == TensorProto.FLOAT else 1  # float32 or uint8
        length = int(np.prod(dims)) * item
        if self.file is not None:
            written = 0
            for chunk in chunks():
                self.file.write(chunk.tobytes())
                written += chunk.nbytes
            assert written == length, (name, written, length)
        t = TensorProto(name=name, data_type=dtype, dims=dims)
        t.data_location = TensorProto.EXTERNAL
        where = {"location": self.location, "offset": str(self.offset), "length": str(length)}
        for key, value in where.items():
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        self.offset += length
        return t

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def int4_matrix(
    data: DataFile,
    name: str,
    k: int,
    n: int,
    row_scale: np.ndarray | None = None,
    block: int = BLOCK,
) -> list[TensorProto]:
    """MatMulNBits weights [N, K/block, block/2] of random nibbles (zero point 8) and fp32
    scales.

    Scales are chosen so an input of RMS 1 gives outputs of RMS about 1. `row_scale`
    multiplies each output row's scales (the LM head uses it to boost or mute tokens); such a
    matrix draws symmetric nibbles (1..15) so that no row gets a bias from the nibbles' mean.
    Every block of a row has the same scale, so the nibbles (drawn in the same order whatever
    the block) make the same matrix at every block size: block sizes compare like for like.
    """
    blocks = k // block
    scale = 1.0 / (4.61 * np.sqrt(k))
    rng = data.rng()

    def packed() -> Any:
        for start in range(0, n, ROWS_PER_CHUNK):
            rows = min(ROWS_PER_CHUNK, n - start)
            if row_scale is None:
                yield np.frombuffer(rng.bytes(rows * k // 2), np.uint8)
            else:
                nib = rng.integers(1, 16, size=(rows * k // 2, 2), dtype=np.uint8)
                yield nib[:, 0] | (nib[:, 1] << 4)

    def scales() -> Any:
        for start in range(0, n, ROWS_PER_CHUNK):
            rows = min(ROWS_PER_CHUNK, n - start)
            col = np.full((rows, 1), scale, np.float32)
            if row_scale is not None:
                col = col * row_scale[start : start + rows, None].astype(np.float32)
            yield np.repeat(col, blocks, axis=1)

    return [
        data.tensor(f"{name}.weight_Q4", [n, blocks, block // 2], TensorProto.UINT8, packed),
        data.tensor(f"{name}.weight_scales", [n, blocks], TensorProto.FLOAT, scales),
    ]


def quantize_int4_rows(rows: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int4 blocks along each row, as GatherBlockQuantized reads uint8 data: two
    nibbles a byte (the even element in the low one) with zero point 8, and one fp32 scale per
    block (its largest magnitude over 7)."""
    n, k = rows.shape
    blocks = rows.reshape(n, k // block, block)
    scales = np.abs(blocks).max(axis=2) / 7.0
    safe = np.where(scales == 0, 1.0, scales)
    signed = np.clip(np.rint(blocks / safe[..., None]), -8, 7).astype(np.int16)
    q = (signed + 8).astype(np.uint8).reshape(n, k // 2, 2)
    return q[..., 0] | (q[..., 1] << 4), scales.astype(np.float32)


def fp32(data: DataFile, name: str, dims: list[int], values: Any) -> TensorProto:
    return data.tensor(name, dims, TensorProto.FLOAT, values)


def lm_head_row_scales(tokens: list[str], eos: int) -> np.ndarray:
    """Mute (scale 0) the tokens a chat model should not print; keep <|end|> so replies end.

    Muted: <unk>, <s>, </s>, every special but <|end|>, control bytes other than newline and
    tab, and tokens that are not whole UTF-8 (lone or partial multi-byte sequences), so greedy
    replies are valid text without U+FFFD. A muted row's logit is 0 while the best live row's
    is well above 0, so greedy search never picks one. EOS_BOOST tunes how often <|end|> wins:
    at 1.2 about 40% of tiny's replies to short prompts end within 64 tokens (1.0: 10%,
    1.35: 70%).
    """
    decode = {c: b for b, c in enumerate(byte_chars())}
    rows = np.ones(len(tokens), np.float32)
    for i, tok in enumerate(tokens):
        if i < 3 or i >= min(special_ids(len(tokens)).values()):
            rows[i] = 0.0
            continue
        raw = bytes(decode[c] for c in tok)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            rows[i] = 0.0
            continue
        if any((ord(ch) < 32 and ch not in "\n\t") or ch == "\x7f" for ch in text):
            rows[i] = 0.0
    rows[eos] = EOS_BOOST
    return rows
