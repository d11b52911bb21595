"""The passage store (PASSAGE_KV_MB, batched path): a grounded prompt's passages read once, and
their K/V reused by later prompts that hold them.

A team asks about the same handbook again and again: the same passages come back, question
after question, and each was read from scratch. Here, a grounded prompt whose passages were not
all found is noted as wanted, and the idle worker reads it (its tokens from the first up to its
last passage's end, a chunk a step, as it does its other idle work: kv/idle.py) and keeps that
K/V, a *run*, in the compact encoding (KV_COMPACT). A request is never slowed by the store: what
it does not find it reads as it would without it, and finds from its next question on.

Two ways a run serves a later prompt (ipc.Phase.passage_reuse says which are on):

- **Exact**: the later prompt holds the same tokens from its first up to the end of one of the
  run's passages (the same system message, the same passages in the same order: the question
  asked again, or another whose best passages are the same, or its best one alone): those
  positions are copied as they are, keys unmoved. They are what reading them gives, up to the
  last bits a different split of the prompt into calls gives, and the compact encoding's
  rounding (the conversation cache's trade: docs/conversation-cache.md).
- **Moved** (PASSAGE_REUSE=moved): a passage that stands elsewhere in the later prompt (another
  order, other passages before it) takes its K/V from a run where it stood after the same
  reading prefix (the tokens every prompt with that system message starts with), keys rotated
  from where they were read to where they now stand (kv/rotary.py), and its first
  PASSAGE_RECOMPUTE_TOKENS read again with the prompt's real context (EPIC, 2024). What is
  lost is the attention of its other tokens to what comes before them in this prompt. The
  quality gate (docs/benchmarks/passages.md) decides whether this is on by default.

Keyed by the owner, the model and the tokens: the owner is the request's `passage_scope`
within its API key's owner (ipc.owned_scope), so one owner's question never finds another's
runs, and `passage_cached_tokens` or the first token's timing tell a caller only of passages its
own owner's requests sent; the model by the process (RAM) and the disk tier's fingerprint
(files).

Warmed ahead of questions (PASSAGE_WARM, the app's library: web/passages/api.py): a wish that
no request made is read only when no request's wish waits, and only while the store has room
for it without putting anything out (the disk part's bound with PROMPT_CACHE_DIR, else the RAM
bound), so warming never displaces what questions brought.

Bounded: PASSAGE_KV_MB of RAM (runs and reading prefixes; beside the KV bound, which a memory
limit then chooses that much smaller), least recently used out first; with PROMPT_CACHE_DIR a
copy of each run on disk (its `passages/` folder, PASSAGE_DISK_MB) under the conversation
tier's rules (kv/disk.py: private, only its own files, every read checked), so the store
survives a restart.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from sidecar.model.batch.decoder import KvPool
from sidecar.model.kv import compact as kv_compact
from sidecar.model.kv.compact import Block, CompactKv, Encoding
from sidecar.model.kv.disk import DiskTier, Stored, Writing
from sidecar.model.kv.rotary import Rotary

WANTED = 256  # runs waiting to be read while idle; the oldest wish is dropped past it
WARMING = 4096  # runs to warm (PASSAGE_WARM); the oldest is dropped past it
MAX_RUN_PASSAGES = 64  # a run's passages (the APIs take 32 a request)
WRITE_PIECE_BYTES = 16 * 2**20  # of a run's file per idle step (kv/idle.py's PIECE_BYTES)

Reuse = Literal["exact", "moved"]


def digest(tokens: Sequence[int]) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype=np.int64).tobytes()).hexdigest()[:32]


@dataclass(eq=False)
class Run:
    """A grounded prompt's first positions, up to its last passage's end, read once."""

    scope: str | None
    tokens: tuple[int, ...]
    prefix: int  # the reading prefix's length
    passages: tuple[tuple[int, int], ...]  # each passage's start and length in `tokens`
    kv: CompactKv | None  # positions 0..len(tokens)-1; None: on disk only
    file: Stored | None = None

    @property
    def key(self) -> str:
        return run_key(self.scope, self.tokens)

    @property
    def nbytes(self) -> int:
        return 0 if self.kv is None else self.kv.nbytes


def run_key(scope: str | None, tokens: Sequence[int]) -> str:
    return f"{scope}\x00{digest(tokens)}"


@dataclass(frozen=True)
class Wanted:
    """A run to read while idle."""

    scope: str | None
    tokens: tuple[int, ...]
    prefix: int
    passages: tuple[tuple[int, int], ...]


@dataclass
class StoreStats:
    entries: int = 0  # runs in RAM
    bytes: int = 0  # RAM: runs and reading prefixes
    disk_entries: int = 0
    disk_bytes: int = 0
    hits: int = 0  # passages found, per request
    misses: int = 0
    wanted: int = 0  # runs waiting to be read
    warming: int = 0  # runs to warm (PASSAGE_WARM) waiting to be read


@dataclass
class PassageStore:
    """The runs, their indexes, the reading prefixes they were read after, the wanted ones."""

    rotary: Rotary | None  # None: keys cannot move (reason), exact reuse only
    bound_bytes: int
    encoding: Encoding
    recompute: int  # PASSAGE_RECOMPUTE_TOKENS
    reuse: Reuse = "exact"
    disk: DiskTier | None = None
    reason: str | None = None  # why keys cannot move (kv/rotary.py)
    runs: OrderedDict[str, Run] = field(default_factory=OrderedDict)
    prefixes: OrderedDict[str, CompactKv] = field(default_factory=OrderedDict)
    wanted: OrderedDict[str, Wanted] = field(default_factory=OrderedDict)
    warming: OrderedDict[str, Wanted] = field(default_factory=OrderedDict)  # read when room
    hits: int = 0
    misses: int = 0
    # Runs in RAM still to be written to disk, and the one being written (idle work)
    _unwritten: list[Run] = field(default_factory=list)
    _writing: tuple[Run, Writing] | None = None
    _bytes_per_token: int = 0  # of the latest run kept (0: none yet)
    # (scope, digest of a prompt's first tokens up to a passage's end) -> the run and that end
    _ends: dict[tuple[str | None, str], tuple[Run, int]] = field(default_factory=dict)
    # (scope, digest of the reading prefix and of a passage's tokens) -> the run and its start
    _moved: dict[tuple[str | None, str, str], tuple[Run, int]] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return self.bound_bytes > 0

    @property
    def moves(self) -> bool:
        """Whether passages that stand elsewhere are placed (moved reuse)."""
        return self.reuse == "moved" and self.rotary is not None

    @property
    def mode(self) -> str:
        """What /readyz says: "exact" or "exact+moved"."""
        return "exact+moved" if self.moves else "exact"

    # -- finding --------------------------------------------------------------------------

    def exact(self, scope: str | None, prompt: Sequence[int], end: int) -> Run | None:
        """The run that holds the prompt's first `end` tokens as they are."""
        found = self._ends.get((scope, digest(prompt[:end])))
        if found is None or tuple(prompt[:end]) != found[0].tokens[:end]:
            return None
        return found[0] if self._loaded(found[0]) else None

    def moved(
        self, scope: str | None, prefix: Sequence[int], tokens: Sequence[int]
    ) -> tuple[Run, int] | None:
        """A run where these passage tokens stood after this reading prefix, and where."""
        found = self._moved.get((scope, digest(prefix), digest(tokens)))
        if found is None:
            return None
        run, start = found
        if run.tokens[start : start + len(tokens)] != tuple(tokens) or not self._loaded(run):
            return None
        return found

    def _loaded(self, run: Run) -> bool:
        """The run's K/V in RAM (read back from disk if it is only there); used now."""
        if run.kv is None and run.file is not None and self.disk is not None:
            run.kv = self.disk.read(run.file)
            if run.kv is None:  # the file is gone or bad (logged and deleted by the tier)
                self._forget(run)
                return False
            self._fit(keep=run)
        if run.kv is None:
            return False
        self.runs.move_to_end(run.key)
        return True

    def want(self, wanted: Wanted) -> None:
        """Note a run to read while idle (a request did not find all its passages)."""
        key = run_key(wanted.scope, wanted.tokens)
        if self.enabled and key not in self.runs:
            _latest(self.wanted, key, wanted, WANTED)

    def warm(self, wanted: Wanted) -> bool:
        """Note a run to read ahead of any question (PASSAGE_WARM); False: it is kept already."""
        key = run_key(wanted.scope, wanted.tokens)
        if not self.enabled or key in self.runs:
            return False
        if key not in self.wanted:
            _latest(self.warming, key, wanted, WARMING)
        return True

    def next_wanted(self, bytes_per_token: int) -> Wanted | None:
        """The latest question's wish first (its passages are the likeliest to return); else
        the latest warming wish, if the store has room for it (`bytes_per_token`: the slot's,
        until a kept run tells what the compact encoding makes of a token)."""
        latest = next(reversed(self.wanted.values()), None)
        if latest is not None or not self.warming:
            return latest
        warming = next(reversed(self.warming.values()))
        if self._room() < len(warming.tokens) * (self._bytes_per_token or bytes_per_token):
            return None
        return warming

    def _room(self) -> int:
        """Bytes the store may still take without putting anything out."""
        disk = self.disk
        if disk is not None and disk.enabled:
            unwritten = sum(run.nbytes for run in self._unwritten)
            return disk.budget_bytes - disk.total_bytes - unwritten
        return self.bound_bytes - self.ram_bytes()

    # -- keeping --------------------------------------------------------------------------

    def put(self, run: Run) -> None:
        """Keep a run read in full, in RAM and, with the disk tier, to be written to a file
        a piece at a time (write_step)."""
        self.wanted.pop(run.key, None)
        self.warming.pop(run.key, None)
        if run.kv is not None and run.tokens:
            self._bytes_per_token = -(-run.kv.nbytes // len(run.tokens))
        self._index(run)
        if self.disk is not None and self.disk.enabled and run.kv is not None:
            self._unwritten.append(run)
        self._fit(keep=run)

    def write_step(self) -> bool:
        """Write WRITE_PIECE_BYTES more of the oldest run kept in RAM but not yet on disk
        (idle work: the worker reads its pipe between pieces); False when there is none."""
        disk = self.disk
        while self._writing is None and self._unwritten and disk is not None:
            run = self._unwritten.pop(0)
            if run.kv is None or run.file is not None or self.runs.get(run.key) is not run:
                continue  # left RAM unwritten (dropped), or replaced
            scope = json.dumps([run.scope, run.prefix, [list(p) for p in run.passages]])
            writing = disk.begin(run.kv, list(run.tokens), scope, False, 0)
            if writing is not None:
                self._writing = (run, writing)
        if self._writing is None or disk is None:
            return False
        run, writing = self._writing
        if writing.step(WRITE_PIECE_BYTES) or not writing.open:
            self._writing = None
            stored = writing.finish() if writing.open else None
            if stored is not None and self.runs.get(run.key) is run:
                run.file = stored
            elif stored is not None:
                disk.forget(stored)
            for evicted in disk.evictions():
                self._dropped_file(evicted)
        return True

    def _index(self, run: Run) -> None:
        old = self.runs.pop(run.key, None)
        if old is not None:
            self._forget(old)
        self.runs[run.key] = run
        prefix = digest(run.tokens[: run.prefix])
        for start, length in run.passages:
            self._ends[(run.scope, digest(run.tokens[: start + length]))] = (run, start + length)
            tokens = digest(run.tokens[start : start + length])
            # A passage read right after the reading prefix (or a later one) is kept as found
            self._moved.setdefault((run.scope, prefix, tokens), (run, start))

    def _forget(self, run: Run) -> None:
        if self.runs.get(run.key) is run:
            del self.runs[run.key]
        self._ends = {k: v for k, v in self._ends.items() if v[0] is not run}
        self._moved = {k: v for k, v in self._moved.items() if v[0] is not run}
        if run.file is not None and self.disk is not None:
            self.disk.forget(run.file)

    def prefix(self, tokens: Sequence[int]) -> CompactKv | None:
        key = digest(tokens)
        kv = self.prefixes.get(key)
        if kv is not None:
            self.prefixes.move_to_end(key)
        return kv

    def keep_prefix(self, tokens: Sequence[int], kv: CompactKv) -> None:
        self.prefixes[digest(tokens)] = kv
        while len(self.prefixes) > 8:
            self.prefixes.popitem(last=False)
        self._fit()

    def adopt(self, files: Sequence[Stored]) -> None:
        """The runs an earlier worker left for this model (kv.disk.DiskTier.scan)."""
        for stored in files:
            try:
                scope, prefix, passages = json.loads(stored.cache_scope or "")
                spans = tuple((int(s), int(n)) for s, n in passages)
                tokens = tuple(stored.tokens)
                if not (scope is None or isinstance(scope, str)):
                    raise ValueError("its scope")
                if not (isinstance(prefix, int) and 0 <= prefix <= len(tokens)):
                    raise ValueError("its prefix")
                if len(spans) > MAX_RUN_PASSAGES or any(
                    s < prefix or n <= 0 or s + n > len(tokens) for s, n in spans
                ):
                    raise ValueError("its passages")
            except (ValueError, TypeError):
                assert self.disk is not None
                self.disk.forget(stored)
                continue
            self._index(Run(scope, tokens, prefix, spans, None, stored))

    def ram_bytes(self) -> int:
        runs = sum(run.nbytes for run in self.runs.values())
        return runs + sum(kv.nbytes for kv in self.prefixes.values())

    def _fit(self, keep: Run | None = None) -> None:
        """Least recently used out of RAM until the bound holds (a copy on disk stays)."""
        held = self.ram_bytes()
        while held > self.bound_bytes and self.prefixes:
            held -= self.prefixes.popitem(last=False)[1].nbytes
        for run in list(self.runs.values()):
            if held <= self.bound_bytes:
                return
            if run is keep or run.kv is None:
                continue
            held -= run.nbytes
            run.kv = None
            if run.file is None:
                self._forget(run)

    def _dropped_file(self, stored: Stored) -> None:
        for run in list(self.runs.values()):
            if run.file is stored:
                run.file = None
                if run.kv is None:
                    self._forget(run)

    def stats(self) -> StoreStats:
        on_disk = [run.file for run in self.runs.values() if run.file is not None]
        return StoreStats(
            entries=sum(1 for run in self.runs.values() if run.kv is not None),
            bytes=self.ram_bytes(),
            disk_entries=len(on_disk),
            disk_bytes=sum(stored.nbytes for stored in on_disk),
            hits=self.hits,
            misses=self.misses,
            wanted=len(self.wanted),
            warming=len(self.warming),
        )

    # -- placing --------------------------------------------------------------------------

    def place(
        self, kv: CompactKv, pool: KvPool, slot: int, source: int, at: int, count: int
    ) -> None:
        """Write the run's positions source..source+count-1 into a slot's at..at+count-1:
        values as stored, keys rotated by at - source positions (none: copied as stored)."""
        delta = at - source
        rotary = self.rotary
        if delta and rotary is None:
            raise ValueError("keys cannot move on this model")

        def one(index: int) -> None:
            layer, is_value = divmod(index, 2)
            tensors = pool.values if is_value else pool.keys
            target = tensors[layer][slot, :, at : at + count]
            data = _decoded(kv.blocks[index], source, source + count)
            if is_value or not delta:
                target[...] = data
            else:
                assert rotary is not None
                rotary.move(data, delta, target)

        kv_compact._parallel(one, range(2 * len(pool.keys)))


def _latest(wishes: OrderedDict[str, Wanted], key: str, wanted: Wanted, most: int) -> None:
    """`wanted` as the latest of `wishes`, the oldest dropped past `most`."""
    wishes[key] = wanted
    wishes.move_to_end(key)
    while len(wishes) > most:
        wishes.popitem(last=False)


def _decoded(runs: list[Block], start: int, end: int) -> np.ndarray:
    """Positions start..end-1 of one tensor's runs, as float32 [heads, tokens, head_size]."""
    parts: list[np.ndarray] = []
    position = 0
    for block in runs:
        size = block.data.shape[1]
        lo, hi = max(start - position, 0), min(size, end - position)
        if lo < hi:
            data = block.data[:, lo:hi]
            if block.scale is not None:
                parts.append(data * block.scale[:, lo:hi, None])
            else:
                parts.append(data.astype(np.float32, copy=False))
        position += size
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
