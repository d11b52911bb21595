"""The conversation cache's disk tier (PROMPT_CACHE_DIR): idle conversations pushed out of RAM.

One file per conversation, holding its compact KV (kv/compact.py) and what the cache matches it
by (its tokens, scope and sampling mode), so that a returning user's turn is restored from disk
instead of being read again.

- Private: the directory is the tier's own, 0700 (kv/folder.py: never a link, never another
  user's, never a folder of other files), each file 0600, and a file's name is random (it says
  nothing of the scope or the conversation). The scope is inside the file: a lookup matches
  only entries of the request's own scope, exactly as in RAM (kv/prompt_cache.py). The tier
  touches only files of its own names (kv.folder.NAME); anything else there is left alone.
- Never half served: a file is written under a temporary name and renamed into place, so a
  crash of the worker mid-write leaves a `.tmp` file (removed at the next start), never a short
  `.kv`. It is not fsynced (a cache: only a crash of the whole machine loses the page cache,
  and a file that left cut short fails the checks below).
  Every read checks the magic, the version, the model's fingerprint, every header field (types
  and ranges: `Stored.of`), the sizes and a CRC of the whole file; a file that fails, whatever
  it holds, is logged, deleted and treated as a miss: no content of a file can stop the worker
  from starting or a restore from ending in a miss.
- At start the directory is scanned: files written for this very model (the fingerprint: the
  decoder's configuration, file sizes and first and last bytes, the KV encoding) are indexed
  and served, so a worker restart (a crash, the watchdog) or a container restart on a mounted
  volume keeps its users' conversations; every other file of the tier's names is deleted.
  Chosen over wiping the
  directory because a restart is exactly when every user would otherwise re-read their chat.
- Bounded: PROMPT_CACHE_DISK_MB; the least recently used files go first.
- A write that fails (a full disk, a read-only or vanished directory) turns the tier off with
  one log line: the cache goes on in RAM only.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import mmap
import os
import secrets
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeGuard

import numpy as np

from sidecar.model.kv.compact import Block, CompactKv, Encoding
from sidecar.model.kv.folder import Folder, Refused

log = logging.getLogger("sidecar.model.kv_disk")  # the name its log lines always had

MAGIC = b"P3KV"
VERSION = 1
_HEAD = struct.Struct("<4sII")  # magic, version, header length
_CRC = struct.Struct("<I")
MAX_TOKENS = 2**24  # more than any context: a header that says more is not ours
MAX_SCOPE = 4096  # characters of a scope (ipc.Generate.cache_scope), with room to spare


@dataclass(frozen=True)
class Shape:
    """What every file of this model holds: the KV layout and the encoding."""

    layers: int
    kv_heads: int
    head_size: int
    encoding: Encoding


@dataclass
class Stored:
    """What the index knows of one file (read from its header)."""

    path: Path
    tokens: list[int]  # the conversation's tokens whose K/V the file holds
    cache_scope: str | None
    sampling: bool
    prompt_end: int
    nbytes: int  # the file's size
    last_used: int = 0

    @classmethod
    def of(cls, path: Path, header: dict[str, Any], tokens: list[int], nbytes: int) -> Stored:
        """The index entry a checked header describes; ValueError for any field of the wrong
        type or out of range (a file with the right fingerprint may still hold anything)."""
        scope, sampling, end = (header.get(k) for k in ("cache_scope", "sampling", "prompt_end"))
        if not (scope is None or (isinstance(scope, str) and len(scope) <= MAX_SCOPE)):
            raise ValueError("cache_scope")
        if not isinstance(sampling, bool):
            raise ValueError("sampling")
        if not (_is_int(end) and 0 <= end <= len(tokens)):
            raise ValueError("prompt_end")
        return cls(path, tokens, scope, sampling, end, nbytes)


def model_fingerprint(folder: Path, decoder_file: str, extra: str) -> str:
    """Which model (and KV encoding) a file was written for: the configuration, the decoder's
    files' sizes and first and last MiB (cheap, and it tells two exports apart)."""
    digest = hashlib.sha256(extra.encode())
    digest.update((folder / "genai_config.json").read_bytes())
    for path in sorted(folder.glob(decoder_file + "*")):
        size = path.stat().st_size
        digest.update(f"{path.name}:{size}".encode())
        with path.open("rb") as file:
            digest.update(file.read(2**20))
            file.seek(max(0, size - 2**20))
            digest.update(file.read(2**20))
    return digest.hexdigest()


class _Corrupt(Exception):
    """A file shorter than its header says, or whose CRC does not match its bytes."""


class DiskTier:
    """The files of one directory, indexed; `budget_bytes` bounds their sum."""

    def __init__(
        self,
        directory: Path,
        budget_bytes: int,
        fingerprint: str,
        shape: Shape,
        name: str = "conversation cache disk tier",  # its log lines'
    ) -> None:
        self.directory = directory
        self.budget_bytes = budget_bytes
        self.fingerprint = fingerprint
        self.shape = shape
        self.enabled = True
        self.name = name
        self.files: dict[Path, Stored] = {}
        self.writes = self.reads = self.failures = 0
        self._clock = 0
        self.folder: Folder | None = None
        try:
            self.folder = Folder(directory)
        except Refused as refused:
            self._refuse(str(refused))
        except OSError as exc:
            self._off("the directory cannot be made", exc)

    def scan(self) -> list[Stored]:
        """Index the files written for this model; delete the rest (logged). Oldest first."""
        folder = self.folder
        if not self.enabled or folder is None:
            return []
        kept, removed = [], 0
        try:
            names, foreign = folder.names()
        except OSError as exc:
            self._off("the directory cannot be listed", exc)
            return []
        for name in sorted(names, key=folder.mtime):
            path = self.directory / name
            stored = self._read_header(path) if name.endswith(".kv") else None
            if stored is None:
                removed += folder.remove(name)
                continue
            self._clock += 1
            stored.last_used = self._clock
            self.files[path] = stored
            kept.append(stored)
        fields = {
            "directory": str(self.directory),
            "kept": len(kept),
            "removed": removed,
            "foreign": foreign,  # not the tier's files: left alone
        }
        log.info(self.name, extra={"fields": fields})
        self._trim()
        return [s for s in kept if s.path in self.files]

    @property
    def total_bytes(self) -> int:
        return sum(stored.nbytes for stored in self.files.values())

    def begin(
        self,
        kv: CompactKv,
        tokens: list[int],
        cache_scope: str | None,
        sampling: bool,
        prompt_end: int,
        replaces: Stored | None = None,
    ) -> Writing | None:
        """Start writing a conversation: a piece at a time (`Writing.step`, idle work), or the
        rest at once (`Writing.finish`); None when the tier is off or the file cannot be made
        (then off)."""
        folder = self.folder
        if not self.enabled or folder is None or kv.tokens != len(tokens):
            return None
        header = {
            "model": self.fingerprint,
            "encoding": kv.encoding,
            "tokens": len(tokens),
            "cache_scope": cache_scope,
            "sampling": sampling,
            "prompt_end": prompt_end,
        }
        name = secrets.token_hex(16)
        try:
            file = folder.create(f"{name}.tmp")
        except OSError as exc:
            self._off("a write failed", exc)
            return None
        stored = Stored(
            self.directory / f"{name}.kv", list(tokens), cache_scope, sampling, prompt_end, 0
        )
        return Writing(self, file, stored, json.dumps(header).encode(), kv, replaces)

    def _written(self, writing: Writing) -> Stored:
        """A file written whole and renamed into place: indexed (and what it replaces gone)."""
        self.writes += 1
        if writing.replaces is not None:
            self.forget(writing.replaces)
        self._clock += 1
        stored = writing.stored
        assert self.folder is not None
        stored.nbytes = self.folder.size(stored.path.name)
        stored.last_used = self._clock
        self.files[stored.path] = stored
        return stored

    def read(
        self, stored: Stored, each: Callable[[int, Block], None] | None = None
    ) -> CompactKv | None:
        """The file's KV, whole and checked; None (logged, file deleted) if it is not.

        `each` is handed every tensor's block as soon as it is read (kv.compact.SlotFiller
        decodes it meanwhile), before the CRC at the file's end can be checked: where this
        returns None, whatever `each` did with them is garbage for the caller to discard."""
        if self.folder is None:
            return None
        try:
            with self.folder.open_read(stored.path.name) as file:
                if os.fstat(file.fileno()).st_size != stored.nbytes:
                    raise OSError("its size changed")
                kv = self._stream(file, stored, each)
        except OSError as exc:
            self._bad(stored, f"unreadable: {type(exc).__name__}")
            return None
        except _Corrupt:
            self._bad(stored, "truncated or corrupt (CRC)")
            return None
        except Exception as exc:  # whatever the bytes hold: a miss, never a crash
            self._bad(stored, f"malformed: {type(exc).__name__}")
            return None
        self.reads += 1
        self._clock += 1
        stored.last_used = self._clock
        return kv

    def _stream(
        self, file: BinaryIO, stored: Stored, each: Callable[[int, Block], None] | None
    ) -> CompactKv:
        """Read the file tensor by tensor into memory of its own, each handed to `each` as it
        arrives, and check the CRC of it all at the end.

        Into an anonymous mapping, not bytes: its pages are taken as the read writes them
        (the CRC and the decoding of a tensor then find it in the CPU's cache) and go back to
        the system whole when the conversation's compact copy goes."""
        area = mmap.mmap(-1, stored.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        view = memoryview(area)
        crc = 0

        def fill(start: int, end: int) -> None:
            nonlocal crc
            if end > stored.nbytes or not _read_exactly(file, view[start:end]):
                raise _Corrupt
            crc = zlib.crc32(view[start:end], crc)

        fill(0, _HEAD.size)
        length = _header_length(area)
        count = len(stored.tokens)
        offset = _HEAD.size + length + 4 * count
        fill(_HEAD.size, offset)
        header = json.loads(bytes(view[_HEAD.size : _HEAD.size + length]))
        if (
            not isinstance(header, dict)
            or header.get("model") != self.fingerprint
            or header.get("tokens") != count
            or offset + self._payload(count) + _CRC.size != stored.nbytes
        ):
            raise ValueError("not the file the index knows")
        blocks: list[list[Block]] = []
        for index, (start, end, block) in enumerate(self._blocks(area, offset, count)):
            fill(start, end)
            blocks.append([block])
            if each is not None:
                each(index, block)
        end = stored.nbytes - _CRC.size
        if not _read_exactly(file, view[end:]) or _CRC.unpack_from(area, end)[0] != crc:
            raise _Corrupt
        return CompactKv(self.shape.encoding, count, blocks)

    def forget(self, stored: Stored) -> None:
        """Delete a file (its conversation left the cache, or a newer file replaced it)."""
        self.files.pop(stored.path, None)
        if self.folder is not None:
            self.folder.discard(stored.path.name)

    def evictions(self) -> list[Stored]:
        """The files to delete to fit the budget, least recently used first (deleted here; the
        caller drops their entries)."""
        return self._trim()

    def _trim(self) -> list[Stored]:
        gone: list[Stored] = []
        by_age = sorted(self.files.values(), key=lambda s: s.last_used)
        total = self.total_bytes
        while by_age and total > self.budget_bytes:
            stored = by_age.pop(0)
            total -= stored.nbytes
            self.forget(stored)
            gone.append(stored)
        return gone

    def _read_header(self, path: Path) -> Stored | None:
        """The index entry of a file written for this model, or None (logged): whatever the
        file holds (a crafted one with this model's fingerprint too), it is checked field by
        field, and anything unexpected is a file ignored, never an exception out of here."""
        assert self.folder is not None
        try:
            with self.folder.open_read(path.name) as file:
                size = os.fstat(file.fileno()).st_size
                length = _header_length(file.read(_HEAD.size))
                header = json.loads(file.read(length))
                if not isinstance(header, dict) or header.get("model") != self.fingerprint:
                    raise ValueError("written for another model or encoding")
                count = header.get("tokens")
                if not (_is_int(count) and 0 < count <= MAX_TOKENS):
                    raise ValueError("tokens")
                expected = _HEAD.size + length + 4 * count + self._payload(count) + _CRC.size
                if size != expected:
                    raise ValueError("truncated")
                tokens = np.frombuffer(file.read(4 * count), dtype=np.int32)
            if len(tokens) != count:
                raise ValueError("truncated")
            return Stored.of(path, header, tokens.tolist(), size)
        except Exception as exc:  # the content is untrusted: any failure is a file ignored
            fields = {"file": path.name, "why": str(exc) if isinstance(exc, ValueError) else ""}
            fields["error"] = type(exc).__name__
            log.warning("conversation cache file ignored", extra={"fields": fields})
            return None

    def _payload(self, tokens: int) -> int:
        shape = self.shape
        if shape.encoding == "int8":
            per_head = shape.head_size + 4  # the values, and one float32 scale
        else:
            per_head = shape.head_size * np.dtype(_FLOATS[shape.encoding]).itemsize
        return 2 * shape.layers * shape.kv_heads * per_head * tokens

    def _blocks(
        self, area: mmap.mmap, offset: int, tokens: int
    ) -> Iterator[tuple[int, int, Block]]:
        """Each tensor's bytes (start, end) in the file and its block, a view of `area`: the
        values [kv_heads, tokens, head_size], then int8's scales [kv_heads, tokens]."""
        shape = self.shape
        values = np.int8 if shape.encoding == "int8" else _FLOATS[shape.encoding]
        count = shape.kv_heads * tokens * shape.head_size
        for _ in range(2 * shape.layers):
            start = offset
            array = np.frombuffer(area, dtype=values, count=count, offset=offset)
            offset += array.nbytes
            scale = None
            if shape.encoding == "int8":
                scale_array = np.frombuffer(
                    area, np.float32, count=shape.kv_heads * tokens, offset=offset
                )
                offset += scale_array.nbytes
                scale = scale_array.reshape(shape.kv_heads, tokens)
            data = array.reshape(shape.kv_heads, tokens, shape.head_size)
            yield start, offset, Block(data, scale)

    def _bad(self, stored: Stored, why: str) -> None:
        self.failures += 1
        log.warning(
            "conversation cache file ignored",
            extra={"fields": {"file": stored.path.name, "why": why}},
        )
        self.forget(stored)

    def _refuse(self, why: str) -> None:
        fields = {"directory": str(self.directory), "why": why}
        log.error(f"{self.name} refused its directory: RAM only", extra={"fields": fields})
        self.enabled = False

    def _off(self, why: str, exc: OSError) -> None:
        if self.enabled:
            fields = {"why": why, "error": f"{type(exc).__name__} errno {exc.errno}"}
            log.error(f"{self.name} off: RAM only", extra={"fields": fields})
        self.enabled = False


class Writing:
    """One conversation's file being written (DiskTier.begin): under a temporary name, a piece
    at a time (`step`), then renamed into place and indexed (`finish`), or dropped (`abandon`).

    It writes a snapshot of the conversation's runs taken at the start: the compact copy may
    grow or be cut meanwhile (`CompactKv.extend`, `truncate` make new lists; no array is
    changed in place), and the caller decides whether what was written is still wanted."""

    def __init__(
        self,
        tier: DiskTier,
        file: BinaryIO,
        stored: Stored,
        head: bytes,
        kv: CompactKv,
        replaces: Stored | None,
    ) -> None:
        self.tier, self.stored, self.replaces = tier, stored, replaces
        self.source = kv  # what the caller handed in: it checks the copy is still the one
        self.written = 0  # bytes so far
        self._file: BinaryIO | None = file
        self._crc = 0
        snapshot = CompactKv(kv.encoding, kv.tokens, [list(runs) for runs in kv.blocks])
        start = (
            memoryview(_HEAD.pack(MAGIC, VERSION, len(head))),
            memoryview(head),
            memoryview(np.asarray(stored.tokens, dtype=np.int32).tobytes()),
        )
        # One tensor at a time: each view is of the scratch array the next one reuses.
        self._chunks = itertools.chain(start, _contiguous(snapshot, tier.shape))

    @property
    def open(self) -> bool:
        return self._file is not None

    def step(self, max_bytes: int) -> bool:
        """Write whole tensors until `max_bytes` more are written or none is left; True when
        the last is written (`finish` then only renames). False while more is left, or when
        the write failed (then it is no longer `open`, and the tier is off)."""
        file = self._file
        if file is None:
            return False
        budget = self.written + max_bytes
        try:
            while self.written < budget:
                chunk = next(self._chunks, None)
                if chunk is None:
                    return True
                self._crc = zlib.crc32(chunk, self._crc)
                file.write(chunk)
                self.written += len(chunk)
        except OSError as exc:
            self._failed(exc)
            return False
        return False

    def finish(self) -> Stored | None:
        """Write what is left, rename the file into place and index it; None when the write
        failed (the tier is then off: RAM only)."""
        if not self.step(2**62):  # it failed, now or before
            return None
        file = self._file
        assert file is not None
        try:
            file.write(_CRC.pack(self._crc))
            file.close()
            # No fsync: this is a cache. Only a crash of the whole machine can lose what
            # the page cache holds, and then a file cut short or never written is refused
            # by its size or its CRC (a miss). An fsync on the request path of the turn
            # whose room this spill makes cost 80 ms for 175 MiB (AMD EPYC).
            folder = self.tier.folder
            assert folder is not None
            folder.replace(self._temporary, self.stored.path.name)
        except OSError as exc:
            self._failed(exc)
            return None
        self._file = None
        return self.tier._written(self)

    def abandon(self) -> None:
        """Drop the file half written (the conversation came back, or left the cache)."""
        file = self._file
        if file is None:
            return
        self._file = None
        with contextlib.suppress(OSError):
            file.close()
        if self.tier.folder is not None:
            self.tier.folder.remove(self._temporary)

    @property
    def _temporary(self) -> str:
        return self.stored.path.stem + ".tmp"

    def _failed(self, exc: OSError) -> None:
        self.abandon()
        self.tier._off("a write failed", exc)


_FLOATS: dict[str, Any] = {"fp16": np.float16, "fp32": np.float32}


def _contiguous(kv: CompactKv, shape: Shape) -> Iterator[memoryview]:
    """Each tensor's runs joined: [kv_heads, tokens, head_size] values, then int8's scales.

    Joined into one scratch array used again tensor after tensor, and a tensor of one run
    not copied at all: a new array per tensor (and its bytes copied once more) took a page
    fault per 4 KiB, and a 900-token Phi-3-mini conversation's spill 0.27-0.40 s (AMD EPYC).
    Each view is valid until the next is asked for."""
    scratch: dict[str, np.ndarray] = {}
    for runs in kv.blocks:
        yield _joined([b.data for b in runs], scratch, "data")
        if shape.encoding == "int8":
            yield _joined([b.scale for b in runs if b.scale is not None], scratch, "scale")


def _joined(parts: list[np.ndarray], scratch: dict[str, np.ndarray], key: str) -> memoryview:
    """`parts` joined along their second axis (tokens), as bytes."""
    if len(parts) == 1 and parts[0].flags.c_contiguous:
        return parts[0].data.cast("B")
    shape = (parts[0].shape[0], sum(p.shape[1] for p in parts), *parts[0].shape[2:])
    size = int(np.prod(shape)) * parts[0].itemsize
    buffer = scratch.get(key)
    if buffer is None or buffer.nbytes < size:
        buffer = scratch[key] = np.empty(size, np.uint8)
    out = buffer[:size].view(parts[0].dtype).reshape(shape)
    np.concatenate(parts, axis=1, out=out)
    return out.data.cast("B")


def _header_length(head: bytes | mmap.mmap) -> int:
    """The JSON header's length, from a file's first bytes; ValueError if they are not this
    version's."""
    magic, version, length = _HEAD.unpack_from(head)
    if magic != MAGIC or version != VERSION or length > 2**20:
        raise ValueError("not a file of this version")
    return int(length)


def _read_exactly(file: BinaryIO, into: memoryview) -> bool:
    """Fill `into` from the file's position on; False where the file ends first."""
    while into:
        count = os.readv(file.fileno(), [into])
        if count == 0:
            return False
        into = into[count:]
    return True


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
