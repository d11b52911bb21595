"""Where each kept conversation's KV lives on the batched path, and the one bound on all KV memory.

Tiers, fastest first (docs/conversation-cache.md):
- `ram`: its pool slot (batch.decoder.KvPool), in the model's KV type (fp32 on the CPU): the
  next turn continues it in place;
- `compact`: encoded in RAM (kv/compact.py, KV_COMPACT: int8 by default, 3.8x smaller), its
  slot freed; the next turn decodes it back into a slot (restore: a copy, not a re-read);
- `disk`: a file of the disk tier (kv/disk.py, PROMPT_CACHE_DIR), its RAM freed; the next turn
  reads and decodes it.
The conversation cache (kv/prompt_cache.py) keeps its books and rules; when it must make room it
asks this module to move its least recently used idle entries down a tier (`compact`, `spill`)
before anything is dropped, and every entry's `nbytes` is the RAM it really holds: its idle
slot's written positions, plus its compact copy. PROMPT_CACHE_MB bounds that RAM.

The bound (KV_MEMORY_MB, `Memory`, kv/bound.py): every running reply reserves the KV it may
write (its prompt and its reply as it grows, in the pool's type); reservations plus the kept
conversations' RAM never exceed the bound. A request that does not fit makes the cache move
idle conversations down (compact, then disk, then drop) and, if the running replies alone
leave no room, waits in the worker (`NoRoom`) until one ends.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from sidecar.model.kv import compact as kv_compact
from sidecar.model.kv.bound import Memory, NoRoom
from sidecar.model.kv.compact import CompactKv, Encoding
from sidecar.model.kv.disk import DiskTier, Stored, Writing

if TYPE_CHECKING:
    from sidecar.model.batch.decoder import KvPool
    from sidecar.model.kv.prompt_cache import Entry, Lease, PromptCache

log = logging.getLogger("sidecar.model.kv_tiers")  # the name its log lines always had

Tier = Literal["ram", "compact", "disk"]
__all__ = ["Holding", "KvTiers", "Memory", "NoRoom", "Restored", "Tier"]


@dataclass
class Restored:
    """Where a lent conversation's tokens came from, and what restoring it cost."""

    tier: Tier | None  # None: nothing reused
    seconds: float = 0.0


@dataclass(eq=False)
class Holding:
    """What a kept conversation holds besides its slot (batch.row.SlotHolder has one)."""

    compact: CompactKv | None = None  # a copy of its first positions, encoded
    stored: Stored | None = None  # its disk tier file
    counts: dict[str, int] = field(default_factory=dict)


class KvTiers:
    """Moves kept conversations between their slot, compact RAM and disk (see above)."""

    def __init__(
        self,
        pool: KvPool,
        cache: PromptCache,
        memory: Memory,
        encoding: Encoding | None,
        disk: DiskTier | None,
        release_slot: Any,  # (SlotHolder) -> None: frees the holder's slot
    ) -> None:
        self.pool = pool
        self.cache = cache
        self.memory = memory
        self.encoding = encoding  # None: no compact tier (KV_COMPACT=off)
        self.disk = disk
        self._release_slot = release_slot
        self.restores: dict[Tier, int] = {"compact": 0, "disk": 0}
        self.spills = 0
        self.compactions = 0
        self.moving_s = 0.0  # the seconds those compactions and spills took
        self.writing: tuple[Entry, Writing] | None = None  # a spill begun while idle

    # -- moving down (PromptCache.shrink calls these, least recently used first) -------------

    def compact(self, entry: Entry) -> bool:
        """Encode an idle entry's slot into compact RAM and free the slot; False if it has no
        slot or there is no compact tier."""
        holder = entry.generator
        if holder.slot is None or self.encoding is None:
            return False
        with self._moving():
            self._encode(holder)
            self._release_slot(holder)
            self.compactions += 1
            self.account(entry)
        return True

    def spill(self, entry: Entry) -> bool:
        """Write an idle entry to the disk tier and free its RAM; False if there is no disk
        tier (or the write failed): the caller drops the entry. A write of this entry begun
        while the worker was idle (`spill_piece`) is finished, not begun again."""
        if not self._spills():
            return False
        with self._moving():
            prepared = self._prepare(entry)
            return prepared is not None and self._complete(entry, prepared)

    def spill_piece(self, entry: Entry, max_bytes: int) -> bool:
        """Write about `max_bytes` more of an idle entry kept in compact RAM to its file
        (idle work, kv/idle.py); once the last piece is written the entry is spilled, as
        `spill` would. False when it cannot be (nothing was done)."""
        if not self._spills() or entry.lent or entry.generator.slot is not None:
            return False
        with self._moving():
            prepared = self._prepare(entry)
            if prepared is None:
                return False
            if isinstance(prepared, Writing):
                if self.writing is not None and self.writing[1] is not prepared:
                    self._drop_writing(self.writing[0])  # it is not the oldest now
                self.writing = (entry, prepared)
                if not prepared.step(max_bytes):  # more to write, or the write failed
                    if not prepared.open:
                        self.writing = None  # the tier is now off
                    return prepared.open
            return self._complete(entry, prepared)

    def lend(self, entry: Entry) -> None:
        """A kept conversation is lent to a reply: a write of it begun while the worker was
        idle is dropped (it is in RAM, and the reply changes it). Its user waits for none."""
        self._drop_writing(entry)

    def forget(self, entry: Entry) -> None:
        """The entry left the cache: its slot, compact copy and file go."""
        self._drop_writing(entry)
        holder = entry.generator
        holder.holding.compact = None
        if holder.holding.stored is not None and self.disk is not None:
            self.disk.forget(holder.holding.stored)
        holder.holding.stored = None
        if holder.slot is not None and not holder.busy:
            self._release_slot(holder)

    # -- moving up ---------------------------------------------------------------------------

    def moved(self) -> tuple[int, int, float]:
        """Conversations compacted and written to disk since start, and the seconds it took."""
        return self.compactions, self.spills, self.moving_s

    def restore(self, entry: Entry, slot: int, tokens: int) -> Restored:
        """Copy a lent entry's first `tokens` positions into `slot` (from compact RAM, or from
        its file first); raises LookupError if its file is gone or bad (the caller treats the
        turn as a miss)."""
        holder = entry.generator
        began = time.perf_counter()
        tier: Tier = "compact"
        kv = holder.holding.compact
        if kv is None or kv.tokens < tokens:
            stored = holder.holding.stored
            if self.disk is None or stored is None:
                raise LookupError("the conversation has no file")
            # Decoded into the slot as it is read; on a bad file the caller frees the slot.
            with kv_compact.SlotFiller(self.pool, slot, tokens) as filler:
                kv = self.disk.read(stored, filler)
            if kv is None:
                raise LookupError("the conversation's file is gone")
            tier = "disk"
            holder.holding.compact = kv
        else:
            kv_compact.restore(kv, self.pool, slot, tokens)
        kv.truncate(tokens)  # the slot goes on from here: later positions will differ
        if kv.encoding != "fp32":
            entry.exact_end = 0  # decoded K/V are not a fresh prefill's, bit for bit
        self.restores[tier] += 1
        return Restored(tier, time.perf_counter() - began)

    def incoming_bytes(self, lease: Lease) -> int:
        """The RAM a lent conversation's compact copy will take when it is read from disk."""
        entry = lease.entry
        if lease.fresh or entry is None or self.encoding is None:
            return 0
        holder = entry.generator
        if holder.slot is not None or holder.holding.compact is not None:
            return 0
        return lease.reused * kv_compact.bytes_per_token(self.pool, self.encoding)

    def account(self, entry: Entry) -> None:
        """Set an entry's RAM bytes from what it holds now (its idle slot's written positions,
        its compact copy); a lent entry's slot belongs to its running reply's reservation."""
        holder = entry.generator
        held = 0
        if holder.slot is not None and not entry.lent:
            held = holder.touched * self.pool.bytes_per_token
        if holder.holding.compact is not None:
            held += holder.holding.compact.nbytes
        entry.nbytes = held

    def tier_of(self, entry: Entry) -> Tier:
        holder = entry.generator
        if holder.slot is not None:
            return "ram"
        return "compact" if holder.holding.compact is not None else "disk"

    def stats(self) -> dict[str, int]:
        counts = {"compact_entries": 0, "compact_bytes": 0, "disk_entries": 0, "disk_bytes": 0}
        for entry in self.cache.entries:
            holder = entry.generator
            if holder.holding.compact is not None and holder.slot is None:
                counts["compact_entries"] += 1
            if holder.holding.compact is not None:
                counts["compact_bytes"] += holder.holding.compact.nbytes
            if holder.slot is None and holder.holding.compact is None:
                counts["disk_entries"] += 1
        counts["disk_bytes"] = self.disk.total_bytes if self.disk is not None else 0
        return counts

    # -- internals ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _moving(self) -> Iterator[None]:
        """Counts the time of a compaction or a spill (moved())."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.moving_s += time.perf_counter() - began

    def _spills(self) -> bool:
        return self.disk is not None and self.disk.enabled and self.encoding is not None

    def _prepare(self, entry: Entry) -> Writing | Stored | None:
        """What spilling the entry takes: its file as it is (already written), or a write
        (the one begun for this very copy, or a new one); None when it cannot be written."""
        disk = self.disk
        assert disk is not None
        holder = entry.generator
        if holder.slot is not None:
            self._encode(holder)
        kv = holder.holding.compact
        if kv is None or kv.tokens < holder.kv_len:
            return None
        tokens = holder.tokens[: holder.kv_len]
        previous = holder.holding.stored
        if previous is not None and previous.tokens == tokens:
            return previous  # already on disk as it is
        if self.writing is not None and self.writing[0] is entry:
            writing = self.writing[1]
            same = writing.source is kv and len(writing.stored.tokens) == kv.tokens
            if writing.open and same and writing.stored.tokens == tokens:
                return writing
            self._drop_writing(entry)  # begun for a copy it no longer holds
        return disk.begin(kv, tokens, entry.cache_scope, entry.sampling, entry.prompt_end, previous)

    def _drop_writing(self, entry: Entry) -> None:
        """The entry's write begun while idle, if any, is abandoned (its `.tmp` removed)."""
        if self.writing is not None and self.writing[0] is entry:
            self.writing[1].abandon()
            self.writing = None

    def _complete(self, entry: Entry, prepared: Writing | Stored) -> bool:
        """Finish the entry's write (if its file is not written already) and free its RAM;
        False when the write failed (the tier is then off)."""
        stored = prepared.finish() if isinstance(prepared, Writing) else prepared
        if self.writing is not None and self.writing[1] is prepared:
            self.writing = None
        if stored is None:
            return False
        assert self.disk is not None
        holder = entry.generator
        holder.holding.stored = stored
        holder.holding.compact = None
        if holder.slot is not None:
            self._release_slot(holder)
        self.spills += 1
        self.account(entry)
        for gone in self.disk.evictions():
            self._drop_stored(gone)
        return True

    def _encode(self, holder: Any) -> None:
        """Make the holder's compact copy cover its slot's cached positions (only the
        positions past the copy are encoded: tokens are encoded independently)."""
        assert self.encoding is not None and holder.slot is not None
        kv = holder.holding.compact
        if kv is not None and (kv.encoding != self.encoding or kv.tokens > holder.kv_len):
            kv = None
        start = kv.tokens if kv is not None else 0
        if start < holder.kv_len or kv is None:
            more = kv_compact.encode(self.pool, holder.slot, start, holder.kv_len, self.encoding)
            if kv is None:
                kv = more
            else:
                kv.extend(more)
        holder.holding.compact = kv

    def _drop_stored(self, stored: Stored) -> None:
        """The disk tier deleted this file for its budget: its entry leaves the cache, unless
        the entry still holds its conversation in RAM."""
        for entry in list(self.cache.entries):
            holder = entry.generator
            if holder.holding.stored is stored:
                holder.holding.stored = None
                if holder.slot is None and holder.holding.compact is None and not entry.lent:
                    self.cache.drop(entry)
