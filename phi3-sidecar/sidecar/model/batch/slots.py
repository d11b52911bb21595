"""The KV pool's slots and what holds each (the batched path; BatchScheduler is a SlotTable): a
reply's conversation, an idle conversation the cache keeps, or nothing. Finding a free slot
makes room where none is (the least recently used idle conversation moves down a tier, to
compact RAM or disk, or is dropped: kv/tiers.py); a conversation kept below comes back into a
slot; two slots exchange their holders (their pages move, kv/pages.py); a holder leaves its
slot, whose pages go.
"""

from __future__ import annotations

from sidecar.model.batch.decoder import KvPool
from sidecar.model.batch.row import BatchGeneration, SlotHolder
from sidecar.model.kv.disk import Stored
from sidecar.model.kv.prompt_cache import Entry, PromptCache
from sidecar.model.kv.tiers import KvTiers, Restored


class SlotTable:
    # Set by BatchScheduler.__init__
    pool: KvPool
    cache: PromptCache
    tiers: KvTiers
    decoding: list[BatchGeneration]  # in slot order: decoding[i] is in slot i
    _slots: list[SlotHolder | None]

    def slots_held(self) -> list[SlotHolder | None]:
        """Each slot's holder (None: free)."""
        return list(self._slots)

    def _lowest_free(self) -> int | None:
        """The lowest slot nothing holds; None when every slot is held."""
        return next((slot for slot, holder in enumerate(self._slots) if holder is None), None)

    def adopt_stored(self, stored: list[Stored]) -> None:
        """Keep the conversations the disk tier found at start (written for this model by an
        earlier worker), idle, in the order they were last used."""
        for item in stored:
            holder = SlotHolder(None, list(item.tokens), kv_len=len(item.tokens), busy=False)
            holder.holding.stored = item
            entry = Entry(holder, None, self.pool.length, item.cache_scope, item.sampling, 0)
            entry.kv_len, entry.prompt_end = len(item.tokens), item.prompt_end
            holder.entry = entry
            self.cache.keep(entry)

    def _restore(self, entry: Entry, tokens: int) -> Restored:
        """Put a lent conversation kept in compact RAM or on disk back into a slot."""
        holder: SlotHolder = entry.generator
        slot = self._free_slot()
        self._slots[slot] = holder
        holder.slot, holder.touched = slot, tokens
        try:
            restored = self.tiers.restore(entry, slot, tokens)
        except LookupError:
            self._release_slot(holder)
            raise
        self.tiers.account(entry)
        return restored

    def _release_slot(self, holder: SlotHolder) -> None:
        """The holder leaves its slot (moved down a tier, or dropped); the slot's pages go."""
        slot = holder.slot
        if slot is None:
            return
        if self._slots[slot] is holder:
            self._slots[slot] = None
        self.pool.free(slot)
        holder.slot, holder.touched = None, 0

    def _free_slot(self) -> int:
        """A slot no request and no cache entry holds (the lowest past the decoding ones: the
        one a reply moves into when its prompt is read); evicts the least recently used idle
        entry when there is none."""
        while True:
            for slot in range(len(self.decoding), len(self._slots)):
                if self._slots[slot] is None:
                    return slot
            # The least recently used idle conversation in a slot moves to compact RAM (or
            # disk, or is dropped) and gives its slot.
            idle = [e for e in self.cache.entries if not e.lent and e.generator.slot is not None]
            if not idle:
                raise RuntimeError("no free KV slot: more requests than MAX_CONCURRENCY")
            oldest = min(idle, key=lambda e: e.last_used)
            if not self.tiers.compact(oldest) and not self.tiers.spill(oldest):
                self.cache.drop(oldest)
            self._free_unheld()

    def _free_unheld(self) -> None:
        """Free the slots whose holder is neither in use nor a cache entry any more."""
        kept = {id(entry) for entry in self.cache.entries}
        for slot, holder in enumerate(self._slots):
            if holder is None or holder.busy:
                continue
            if holder.entry is None or id(holder.entry) not in kept:
                self._slots[slot] = None
                self.pool.free(slot)

    def _swap(self, a: int, b: int) -> None:
        if a == b:
            return
        first, second = self._slots[a], self._slots[b]
        self.pool.swap(a, b, first.touched if first else 0, second.touched if second else 0)
        self._slots[a], self._slots[b] = second, first
        if first is not None:
            first.slot = b
        if second is not None:
            second.slot = a
