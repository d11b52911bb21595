"""The passage store (PASSAGE_KV_MB, batched path): a grounded prompt's passages read once and
their K/V reused wherever a later prompt puts them.

A team asks about the same handbook again and again, and the same passages come back at
whatever positions the ranking gives them. Each passage is read once, on its own, right after
its request's reading prefix (the tokens every prompt with that system message starts with:
kv.shared_prefix.prefix_tokens), and its K/V kept in the compact encoding (KV_COMPACT). When a
later prompt holds the same tokens after the same reading prefix, its positions are filled from
here: values as they are, keys rotated from the position they were read at to their new one
(kv/rotary.py), and the first PASSAGE_RECOMPUTE_TOKENS of each passage are read again with the
prompt's real context. What is lost is only the attention of the passage's other tokens to what
comes before them in this prompt (EPIC, 2024); the question and the reply are read as before,
attending to everything. How close that stays to the exact read: docs/benchmarks/passages.md.

- **Read while idle, never on a request's path.** A passage not found is read as today, in its
  prompt, and noted as wanted; the idle worker reads wanted passages alone (its reading prefix
  first, kept here too), a chunk a step, as it does its other idle work (kv/idle.py). A
  passage a request sends therefore costs it nothing more when missed, and is found from its
  next question on. The app may also ask for a library's passages ahead (PASSAGE_WARM).
- **Keyed by the model, the owner, the reading prefix and the tokens.** The model by the
  process (RAM) and the disk tier's fingerprint (files); the owner is the request's
  `passage_scope` within its API key's owner (ipc.owned_scope), so one owner's question never
  finds another's passages: `passage_cached_tokens` and the first token's timing tell a
  caller only of passages its own owner's requests sent.
- **Bounded**: PASSAGE_KV_MB of RAM (entries and reading prefixes; counted beside the KV bound,
  which is chosen that much smaller), least recently used out first; with PROMPT_CACHE_DIR, a
  copy of each on disk (its `passages/` folder, PASSAGE_DISK_MB) under the conversation tier's
  rules (kv/disk.py: private, only its own files, every read checked), so the store survives
  a restart.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from sidecar.model.batch.decoder import KvPool
from sidecar.model.kv import compact as kv_compact
from sidecar.model.kv.compact import Block, CompactKv, Encoding
from sidecar.model.kv.disk import DiskTier, Stored
from sidecar.model.kv.rotary import Rotary

WANTED = 512  # passages waiting to be read while idle; the oldest wish is dropped past it


def digest(tokens: Sequence[int]) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype=np.int64).tobytes()).hexdigest()[:32]


@dataclass(frozen=True)
class PassageKey:
    scope: str | None  # the owner's passage scope (ipc.Generate.passage_scope, owned)
    prefix: str  # digest of the reading prefix's tokens
    tokens: tuple[int, ...]


@dataclass(eq=False)
class StoredPassage:
    key: PassageKey
    at: int  # the position its first token was read at: the reading prefix's length
    kv: CompactKv | None  # None: on disk only
    file: Stored | None = None
    last_used: int = 0

    @property
    def nbytes(self) -> int:
        return 0 if self.kv is None else self.kv.nbytes


@dataclass(frozen=True)
class Wanted:
    key: PassageKey
    prefix: tuple[int, ...]  # the reading prefix's tokens, read first


@dataclass
class StoreStats:
    entries: int = 0
    bytes: int = 0  # RAM: entries and reading prefixes
    disk_entries: int = 0
    disk_bytes: int = 0
    hits: int = 0  # passages found, per request
    misses: int = 0
    wanted: int = 0  # passages waiting to be read


@dataclass
class PassageStore:
    """Stored passages, the reading prefixes they were read after, and the wanted ones."""

    rotary: Rotary | None
    bound_bytes: int
    encoding: Encoding
    recompute: int  # PASSAGE_RECOMPUTE_TOKENS
    disk: DiskTier | None = None
    entries: OrderedDict[PassageKey, StoredPassage] = field(default_factory=OrderedDict)
    prefixes: OrderedDict[str, CompactKv] = field(default_factory=OrderedDict)
    wanted: OrderedDict[PassageKey, Wanted] = field(default_factory=OrderedDict)
    hits: int = 0
    misses: int = 0
    reason: str | None = None  # why keys cannot move (kv/rotary.py): the exact path only

    @property
    def enabled(self) -> bool:
        return self.rotary is not None and self.bound_bytes > 0

    @property
    def mode(self) -> str:
        """What /readyz says: "rotated" (stored keys moved where they stand) or "exact"
        (every prompt read as it is: the model's attention cannot take moved keys)."""
        return "rotated" if self.enabled else "exact"

    # -- finding --------------------------------------------------------------------------

    def find(self, key: PassageKey) -> tuple[StoredPassage, CompactKv] | None:
        """The passage and its K/V, from RAM or read back from disk (kept in RAM again)."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        kv = entry.kv
        if kv is None and entry.file is not None and self.disk is not None:
            kv = self.disk.read(entry.file)
            if kv is None:  # the file is gone or bad (logged and deleted by the tier)
                del self.entries[key]
                return None
            entry.kv = kv
            self._fit()
        if kv is None:
            return None
        self.entries.move_to_end(key)
        return entry, kv

    def want(self, key: PassageKey, prefix: Sequence[int]) -> None:
        """Note a passage to read while idle (a request missed it, or the app warms it)."""
        if key in self.entries or not self.enabled:
            return
        self.wanted[key] = Wanted(key, tuple(prefix))
        self.wanted.move_to_end(key)
        while len(self.wanted) > WANTED:
            self.wanted.popitem(last=False)

    def next_wanted(self) -> Wanted | None:
        """The latest wish first: the passages of the latest questions are the likeliest to
        come back."""
        return next(reversed(self.wanted.values()), None)

    # -- keeping --------------------------------------------------------------------------

    def put(self, key: PassageKey, at: int, kv: CompactKv) -> None:
        """Keep a passage read alone after its reading prefix (positions at..at+len-1), in RAM
        and, with the disk tier, in a file."""
        self.wanted.pop(key, None)
        entry = StoredPassage(key, at, kv)
        if self.disk is not None and self.disk.enabled:
            scope = json.dumps([key.scope, key.prefix, at])
            writing = self.disk.begin(kv, list(key.tokens), scope, False, 0)
            entry.file = writing.finish() if writing is not None else None
            for stored in self.disk.evictions():
                self._dropped_file(stored)
        self.entries[key] = entry
        self._fit()

    def prefix(self, tokens: Sequence[int]) -> CompactKv | None:
        kv = self.prefixes.get(digest(tokens))
        if kv is not None:
            self.prefixes.move_to_end(digest(tokens))
        return kv

    def keep_prefix(self, tokens: Sequence[int], kv: CompactKv) -> None:
        self.prefixes[digest(tokens)] = kv
        while len(self.prefixes) > 8:
            self.prefixes.popitem(last=False)
        self._fit()

    def adopt(self, files: Sequence[Stored]) -> None:
        """The files an earlier worker left for this model (kv.disk.DiskTier.scan)."""
        for stored in files:
            try:
                scope, prefix, at = json.loads(stored.cache_scope or "")
                if not (scope is None or isinstance(scope, str)) or not isinstance(prefix, str):
                    raise ValueError("its key")
                if not isinstance(at, int) or at < 0:
                    raise ValueError("its position")
            except ValueError:
                assert self.disk is not None
                self.disk.forget(stored)
                continue
            key = PassageKey(scope, prefix, tuple(stored.tokens))
            self.entries[key] = StoredPassage(key, at, None, stored)

    def ram_bytes(self) -> int:
        entries = sum(entry.nbytes for entry in self.entries.values())
        return entries + sum(kv.nbytes for kv in self.prefixes.values())

    def _fit(self) -> None:
        """Least recently used out of RAM until the bound holds (a copy on disk stays)."""
        held = self.ram_bytes()
        for entry in list(self.entries.values()):
            if held <= self.bound_bytes:
                return
            held -= entry.nbytes
            if entry.file is None:
                del self.entries[entry.key]
            entry.kv = None
        while held > self.bound_bytes and self.prefixes:
            held -= self.prefixes.popitem(last=False)[1].nbytes

    def _dropped_file(self, stored: Stored) -> None:
        for key, entry in list(self.entries.items()):
            if entry.file is stored:
                entry.file = None
                if entry.kv is None:
                    del self.entries[key]

    def stats(self) -> StoreStats:
        on_disk = [e.file for e in self.entries.values() if e.file is not None]
        return StoreStats(
            entries=sum(1 for e in self.entries.values() if e.kv is not None),
            bytes=self.ram_bytes(),
            disk_entries=len(on_disk),
            disk_bytes=sum(stored.nbytes for stored in on_disk),
            hits=self.hits,
            misses=self.misses,
            wanted=len(self.wanted),
        )

    # -- placing --------------------------------------------------------------------------

    def place(
        self,
        entry: StoredPassage,
        kv: CompactKv,
        pool: KvPool,
        slot: int,
        start: int,
        span: tuple[int, int],
    ) -> None:
        """Write the passage's positions span[0]..span[1]-1 into a slot, the passage's first
        token at position `start`: values as stored, keys rotated from where they were read to
        where they now stand."""
        assert self.rotary is not None
        rotary, delta = self.rotary, start - entry.at
        skip, count = span

        def one(index: int) -> None:
            layer, is_value = divmod(index, 2)
            tensors = pool.values if is_value else pool.keys
            target = tensors[layer][slot, :, start + skip : start + count]
            data = _decoded(kv.blocks[index], skip, count)
            if is_value:
                target[...] = data
            else:
                rotary.move(data, delta, target)

        kv_compact._parallel(one, range(2 * len(pool.keys)))


def _decoded(runs: list[Block], skip: int, count: int) -> np.ndarray:
    """Positions skip..count-1 of one tensor's runs, as float32 [heads, tokens, head_size]."""
    parts: list[np.ndarray] = []
    position = 0
    for block in runs:
        size = block.data.shape[1]
        lo, hi = max(skip - position, 0), min(size, count - position)
        if lo < hi:
            data = block.data[:, lo:hi]
            if block.scale is not None:
                parts.append(data * block.scale[:, lo:hi, None])
            else:
                parts.append(data.astype(np.float32, copy=False))
        position += size
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
