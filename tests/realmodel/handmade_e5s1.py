"""A hand-made E5S1 file, written byte by byte from the format scripts/models/realmodel/e5s1.py
documents: a one-layer BERT of width 64 with a small SentencePiece vocabulary, every matrix in
Q4_0 from integers and scales chosen here, so its weights are known exactly (no download)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

HIDDEN, HEADS, FFN, LAYERS, POSITIONS, TYPES = 64, 4, 128, 1, 16, 2
EPSILON = 1e-12
META = "\u2581"
PIECES = [
    ("<s>", 0.0),
    ("<pad>", 0.0),
    ("</s>", 0.0),
    ("<unk>", 0.0),
    (META, -2.0),
    (META + "the", -1.0),
    (META + "cat", -1.5),
    (META + "ca", -3.0),
    ("t", -2.5),
    ("s", -2.0),
    (META + "fi", -2.2),
    ("sh", -2.4),
    (":", -1.2),
    (META + "query", -1.1),
    ("\uff5e", -3.0),
    ("<mask>", 0.0),
]
ROWS = len(PIECES) + 3  # the embedding table padded past the vocabulary, as the real one is


@dataclass
class Handmade:
    path: Path
    weights: dict[str, NDArray[np.float32]]  # each tensor as the file holds it, float32


def q4_0(rng: np.random.Generator, rows: int, cols: int) -> tuple[bytes, NDArray[np.float32]]:
    """Random Q4_0 blocks and the weights they stand for: d * (q - 8), byte j of a block
    holding q of weight j in its low nibble and of weight j + 16 in its high one."""
    q = rng.integers(0, 16, size=(rows * cols // 32, 32))
    d = (rng.random(rows * cols // 32) * 0.1 + 0.01).astype(np.float16)
    out = bytearray()
    for block, scale in zip(q, d, strict=True):
        out += scale.tobytes() + bytes(int(block[j]) | int(block[j + 16]) << 4 for j in range(16))
    weights = ((q - 8) * d.astype(np.float32)[:, None]).astype(np.float32)
    return bytes(out), weights.reshape(rows, cols)


def write_e5s1(path: Path, table: dict[int, str], seed: int = 0) -> Handmade:
    """The file at `path`, its normalisation table `table` (codepoint -> what it becomes)."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, tuple[int, bytes]] = {}
    weights: dict[str, NDArray[np.float32]] = {}

    def f32(name: str, *shape: int, scale: float = 0.1, base: float = 0.0) -> None:
        value = (base + rng.standard_normal(shape) * scale).astype(np.float32)
        tensors[name], weights[name] = (0, value.tobytes()), value

    def q4(name: str, rows: int, cols: int) -> None:
        data, value = q4_0(rng, rows, cols)
        tensors[name], weights[name] = (1, data), value

    q4("emb.word", ROWS, HIDDEN)
    f32("emb.pos", POSITIONS, HIDDEN)
    f32("emb.type", TYPES, HIDDEN)
    f32("emb.ln.w", HIDDEN, base=1.0)
    f32("emb.ln.b", HIDDEN)
    for layer in range(LAYERS):
        for part in ("q", "k", "v", "ao"):
            q4(f"l{layer}.{part}.w", HIDDEN, HIDDEN)
            f32(f"l{layer}.{part}.b", HIDDEN)
        for norm in ("aln", "oln"):
            f32(f"l{layer}.{norm}.w", HIDDEN, base=1.0)
            f32(f"l{layer}.{norm}.b", HIDDEN)
        q4(f"l{layer}.fi.w", FFN, HIDDEN)
        f32(f"l{layer}.fi.b", FFN)
        q4(f"l{layer}.fo.w", HIDDEN, FFN)
        f32(f"l{layer}.fo.b", HIDDEN)

    text = b"".join(piece.encode() for piece, _ in PIECES)
    offsets = [0]
    for piece, _ in PIECES:
        offsets.append(offsets[-1] + len(piece.encode()))
    header = b"E5S1" + struct.pack("<I", 1)
    header += struct.pack("<7i", HIDDEN, LAYERS, HEADS, FFN, ROWS, POSITIONS, TYPES)
    header += struct.pack("<fi", EPSILON, 32)
    header += struct.pack("<5i", len(PIECES), 0, 2, 1, 3) + struct.pack("<Q", len(text))
    header += struct.pack(f"<{len(offsets)}I", *offsets)
    header += struct.pack(f"<{len(PIECES)}f", *(score for _, score in PIECES)) + text
    entries = b"".join(
        struct.pack("<IB", cp, len(out)) + struct.pack(f"<{len(out)}I", *map(ord, out))
        for cp, out in sorted(table.items())
    )
    header += struct.pack("<iI", len(table), len(entries)) + entries
    directory_size = 4 + sum(2 + len(name) + 1 + 4 + 16 for name in tensors)
    at = len(header) + directory_size
    directory = struct.pack("<i", len(tensors))
    for name, (kind, data) in tensors.items():
        numbers = weights[name].size
        directory += struct.pack("<H", len(name)) + name.encode()
        directory += struct.pack("<BIQQ", kind, numbers, at, len(data))
        at += len(data)
    path.write_bytes(header + directory + b"".join(data for _, data in tensors.values()))
    return Handmade(path, weights)
