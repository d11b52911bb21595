"""Moving cached keys to other positions: the model's rotary position embedding, read from its
graph (the passage store, kv/passages.py).

GroupQueryAttention with `do_rotary=1` rotates each key by its position before it writes the
key into the KV cache, with the cos/sin tables the graph holds (`cos_cache`, `sin_cache`,
[positions, rotary_dim / 2]). A key cached at position p stands at q after one more rotation
by q - p: cos and sin of a table row are those of position times each pair's frequency, so
R(q - p) R(p) = R(q). Values carry no position and move as they are.

The tables are read from the graph file itself (a few protobuf fields, below: the sidecar does
not depend on the `onnx` package) and checked: a graph whose attention does not rotate in the
op, whose tables are not plain initializers (LongRoPE picks one of two by the sequence's
length, so no single rotation moves a key), or whose rows are not one rotation per position is
refused with the reason, and the passage store then keeps to the exact path (`/readyz` says
which).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class NotRotatable(Exception):
    """The model's attention cannot take moved keys; str() says why."""


@dataclass(frozen=True)
class Rotary:
    """The model's rotary tables, float64: cos[p, i] and sin[p, i] of position p for pair i."""

    cos: np.ndarray
    sin: np.ndarray
    interleaved: bool  # pairs are (2i, 2i + 1), else (i, i + rotary_dim / 2)

    @property
    def positions(self) -> int:
        return int(self.cos.shape[0])

    @property
    def pairs(self) -> int:
        return int(self.cos.shape[1])

    def move(self, keys: np.ndarray, delta: int, out: np.ndarray) -> None:
        """Write `keys` [heads, tokens, head_size] rotated by `delta` positions into `out`
        (the same shape; may be a view of the KV pool). A delta of 0 copies them bit for bit."""
        if delta == 0:
            out[...] = keys
            return
        if abs(delta) >= self.positions:
            raise ValueError(f"a move of {delta} positions is past the model's tables")
        cos = self.cos[abs(delta)].astype(np.float32)
        sin = self.sin[abs(delta)].astype(np.float32) * (1 if delta > 0 else -1)
        half = self.pairs
        if self.interleaved:
            first, second = keys[..., 0 : 2 * half : 2], keys[..., 1 : 2 * half : 2]
            out_first, out_second = out[..., 0 : 2 * half : 2], out[..., 1 : 2 * half : 2]
        else:
            first, second = keys[..., :half], keys[..., half : 2 * half]
            out_first, out_second = out[..., :half], out[..., half : 2 * half]
        # Both results read both inputs: compute them before either is written (out may be keys)
        rotated_first = first * cos - second * sin
        rotated_second = second * cos + first * sin
        out_first[...] = rotated_first
        out_second[...] = rotated_second
        if 2 * half < keys.shape[-1]:  # partial rotary: the rest of each head is not rotated
            out[..., 2 * half :] = keys[..., 2 * half :]


def read(folder: Path, filename: str, head_size: int) -> Rotary:
    """The rotary tables of the decoder `folder / filename`; NotRotatable with the reason."""
    path = folder / filename
    try:
        graph = _Graph(path)
    except (OSError, ValueError, IndexError, struct.error) as exc:
        raise NotRotatable(f"the graph cannot be read ({type(exc).__name__})") from exc
    attention = [node for node in graph.nodes if node.op_type == "GroupQueryAttention"]
    if not attention:
        raise NotRotatable("the decoder has no GroupQueryAttention")
    tables: set[tuple[str, str]] = set()
    interleaved: set[int] = set()
    for node in attention:
        if node.ints.get("do_rotary", 0) != 1:
            raise NotRotatable("the attention does not rotate keys in the op (do_rotary=0)")
        if len(node.inputs) > 9 and any(node.inputs[9:]):
            raise NotRotatable("the attention takes more inputs than the rotary tables")
        if len(node.inputs) < 9 or not node.inputs[7] or not node.inputs[8]:
            raise NotRotatable("the attention names no cos/sin tables")
        tables.add((node.inputs[7], node.inputs[8]))
        interleaved.add(node.ints.get("rotary_interleaved", 0))
    if len(tables) != 1 or len(interleaved) != 1:
        raise NotRotatable("the layers do not share one rotary table")
    cos_name, sin_name = tables.pop()
    cos, sin = graph.initializer(cos_name), graph.initializer(sin_name)
    if cos is None or sin is None:
        raise NotRotatable("the rotary tables are computed in the graph, not stored (LongRoPE?)")
    if cos.ndim != 2 or cos.shape != sin.shape or 2 * cos.shape[1] > head_size:
        raise NotRotatable(f"rotary tables of shape {cos.shape} for heads of {head_size}")
    rotary = Rotary(cos.astype(np.float64), sin.astype(np.float64), bool(interleaved.pop()))
    _check_linear(rotary)
    return rotary


def _check_linear(rotary: Rotary) -> None:
    """Every row one rotation per position: row a + b is row a's rotation after row b's (within
    float32's rounding), for a spread of positions; else NotRotatable."""
    if rotary.positions < 3:
        raise NotRotatable("the rotary tables are too short to move keys")
    top = rotary.positions - 1
    angle = np.arctan2(rotary.sin, rotary.cos)
    for a, b in ((1, 1), (1, top - 1), (top // 2, top - top // 2), (7 % top or 1, top // 3)):
        expected = np.angle(np.exp(1j * (angle[a] + angle[b])))
        got = angle[a + b]
        gap = np.abs(np.angle(np.exp(1j * (expected - got))))
        if float(gap.max()) > 1e-3:
            raise NotRotatable("the rotary tables are not one rotation per position")


# -- a few fields of an ONNX ModelProto, read from its protobuf bytes ---------------------------

_FLOAT, _FLOAT16, _DOUBLE = 1, 10, 11
_EXTERNAL = 1


@dataclass
class _Node:
    op_type: str
    inputs: list[str]
    ints: dict[str, int]


class _Graph:
    """The nodes (op type, inputs, integer attributes) and initializers of a model file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.nodes: list[_Node] = []
        self._tensors: dict[str, bytes] = {}  # name -> the TensorProto's bytes
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            for number, value in _fields(data, 0, len(data)):
                if number == 7 and isinstance(value, tuple):  # ModelProto.graph
                    self._graph(data, *value)

    def _graph(self, data: mmap.mmap, start: int, end: int) -> None:
        for number, value in _fields(data, start, end):
            if not isinstance(value, tuple):
                continue
            if number == 1:  # GraphProto.node
                self.nodes.append(_node(data, *value))
            elif number == 5:  # GraphProto.initializer: only small tables are kept
                name = _tensor_name(data, *value)
                if name is not None:
                    self._tensors[name] = bytes(data[value[0] : value[1]])

    def initializer(self, name: str) -> np.ndarray | None:
        raw = self._tensors.get(name)
        if raw is None:
            return None
        dims: list[int] = []
        data_type, floats, payload = 0, b"", b""
        location, external = 0, {}
        for number, value in _fields(raw, 0, len(raw)):
            if number == 1:
                dims.extend(_ints(raw, value))
            elif number == 2 and isinstance(value, int):
                data_type = value
            elif number == 4 and isinstance(value, tuple):
                floats += raw[value[0] : value[1]]
            elif number == 9 and isinstance(value, tuple):
                payload = raw[value[0] : value[1]]
            elif number == 13 and isinstance(value, tuple):
                entry = dict(_strings(raw, *value))
                external[entry.get(1, "")] = entry.get(2, "")
            elif number == 14 and isinstance(value, int):
                location = value
        dtype = {_FLOAT: np.float32, _FLOAT16: np.float16, _DOUBLE: np.float64}.get(data_type)
        if dtype is None:
            return None
        if location == _EXTERNAL:
            payload = self._external(external, int(np.prod(dims)) * np.dtype(dtype).itemsize)
        elif not payload:
            payload = floats
        array = np.frombuffer(payload, dtype=dtype)
        return array.reshape(dims) if array.size == int(np.prod(dims)) else None

    def _external(self, entry: dict[str, str], size: int) -> bytes:
        location = Path(entry.get("location", ""))
        if location.is_absolute() or ".." in location.parts:
            raise ValueError("an external tensor outside the model's folder")
        offset, length = int(entry.get("offset", 0)), int(entry.get("length", size))
        with (self.path.parent / location).open("rb") as file:
            file.seek(offset)
            payload = file.read(length)
        if len(payload) != length:
            raise ValueError("an external tensor is cut short")
        return payload


_MAX_TABLE_BYTES = 64 * 2**20  # a rotary table; larger initializers are weights, never read


def _tensor_name(data: mmap.mmap | bytes, start: int, end: int) -> str | None:
    """The initializer's name, if it is small enough to be a table."""
    if end - start > _MAX_TABLE_BYTES:
        return None
    for number, value in _fields(data, start, end):
        if number == 8 and isinstance(value, tuple):
            return bytes(data[value[0] : value[1]]).decode()
    return None


def _node(data: mmap.mmap, start: int, end: int) -> _Node:
    op_type, inputs, ints = "", [], {}
    for number, value in _fields(data, start, end):
        if not isinstance(value, tuple):
            continue
        text = bytes(data[value[0] : value[1]])
        if number == 1:
            inputs.append(text.decode())
        elif number == 4:
            op_type = text.decode()
        elif number == 5:  # AttributeProto: name (1), i (3)
            name, integer = "", None
            for field, item in _fields(data, *value):
                if field == 1 and isinstance(item, tuple):
                    name = bytes(data[item[0] : item[1]]).decode()
                elif field == 3 and isinstance(item, int):
                    integer = item
            if integer is not None:
                ints[name] = integer
    return _Node(op_type, inputs, ints)


def _strings(data: bytes, start: int, end: int) -> Iterator[tuple[int, str]]:
    for number, value in _fields(data, start, end):
        if isinstance(value, tuple):
            yield number, data[value[0] : value[1]].decode()


def _ints(data: bytes, value: int | tuple[int, int]) -> list[int]:
    """A repeated int64 field's values: one, or a packed run."""
    if isinstance(value, int):
        return [value]
    values, position = [], value[0]
    while position < value[1]:
        item, position = _varint(data, position)
        values.append(item)
    return values


def _fields(
    data: mmap.mmap | bytes, start: int, end: int
) -> Iterator[tuple[int, int | tuple[int, int]]]:
    """(field number, value) of a message's bytes: a varint's value, or a length-delimited
    field's (start, end); fixed-width fields are skipped."""
    position = start
    while position < end:
        key, position = _varint(data, position)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, position = _varint(data, position)
            yield number, value
        elif wire == 2:
            length, position = _varint(data, position)
            if position + length > end:
                raise ValueError("a field runs past its message")
            yield number, (position, position + length)
            position += length
        elif wire == 1:
            position += 8
        elif wire == 5:
            position += 4
        else:
            raise ValueError(f"wire type {wire}")


def _varint(data: mmap.mmap | bytes, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 10 bytes")
