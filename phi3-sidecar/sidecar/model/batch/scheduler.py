"""Several replies decoded in one model call per step (DECODE_BATCH_ROWS > 1).

Each reply holds one slot of the KV pool (batch/decoder.py). One step of the worker is:
- one chunk (PREFILL_CHUNK tokens) of the oldest prompt still being read, at batch 1 in its
  own slot, so a joining request never stalls the others for more than one chunk; its last
  chunk gives its first token (a prompt that is all the batch has to do reads ALONE_CHUNK
  tokens a call: nobody to stall, and each call has a fixed cost);
- one decode call for every reply past its prompt, up to DECODE_BATCH_ROWS rows per call (a
  guided reply with a run of tokens its grammar forced reads the run in a call of its own).
Requests join and leave between steps. Decoding replies sit in slots 0..n-1 (a call binds a
contiguous run of slots): a reply that finishes its prompt moves into slot n, one that leaves
swaps with the last decoding one (the copies cover the tokens held, not the whole slot).

The conversation cache (kv/prompt_cache.py) keeps its rules: its entries are slots that hold a
finished reply's tokens, lent to the next request of the same scope that starts with them; a
request's lease (PromptCache.lease) says which slot it continues or that it takes a new one.
An entry's bytes are the positions its slot has written (KV bytes per token from the
model's configuration); an evicted entry's slot gives its memory back.

Here: a reply joining (start: its reservation, its lease, its slot) and leaving, the shared
prefixes (read once, written ahead into a free slot while idle), and the idle work. The step is
step.py's, the slots slots.py's (the bases of BatchScheduler), a reply row.py's.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Collection
from dataclasses import fields
from typing import Any

from sidecar.ipc import Generate
from sidecar.model.batch import passages as batch_passages
from sidecar.model.batch.decoder import BatchDecoder
from sidecar.model.batch.passages import PassageReading
from sidecar.model.batch.row import BatchGeneration, SlotHolder
from sidecar.model.batch.step import BatchStep
from sidecar.model.kv import compact as kv_compact
from sidecar.model.kv import shared_prefix
from sidecar.model.kv.bound import GROWTH_TOKENS, Memory, NoRoom
from sidecar.model.kv.idle import IdleRoom
from sidecar.model.kv.passages import PassageStore
from sidecar.model.kv.prompt_cache import Lease, PromptCache
from sidecar.model.kv.shared_prefix import SharedPrefix, Staged
from sidecar.model.kv.tiers import KvTiers, Restored
from sidecar.model.kv.warm import WarmPages
from sidecar.model.prompt.builder import Prompt


class BatchScheduler(BatchStep):
    def __init__(
        self,
        decoder: BatchDecoder,
        cache: PromptCache,
        *,
        rows: int,
        chunk: int,
        eos_ids: Collection[int],
        new_stream: Any,  # () -> TokenStream
        vocab_size: int,
    ) -> None:
        self.decoder = decoder
        self.pool = decoder.pool
        self.cache = cache
        self.rows = rows
        self.chunk = chunk
        self.eos_ids = frozenset(eos_ids)
        self.new_stream = new_stream
        self.vocab_size = vocab_size
        self._slots: list[SlotHolder | None] = [None] * self.pool.slots
        # The one bound on all KV memory and the tiers below the slots (kv/tiers.py); the
        # engine sets both before the first request (until then: no bound, no tiers).
        self.memory = Memory(bound_bytes=2**62)
        self.tiers = KvTiers(self.pool, cache, self.memory, None, None, self._release_slot)
        cache.tiers, cache.room = self.tiers, self.room
        # Room for a new chat made while the worker is idle (kv/idle.py); the engine sets
        # how much once the model is loaded
        self.idle = IdleRoom(self)
        self.warm = WarmPages(self)  # and the next prompt's pages mapped (kv/warm.py)
        self.shared: list[SharedPrefix] = []  # SHARED_PREFIXES, read once (kv/shared_prefix.py)
        self.staged: Staged | None = None  # one of them written ahead into a free slot
        self._last_shared: SharedPrefix | None = None  # the one a new chat used last
        # The passage store (kv/passages.py; set by batch/setup.py) and the wanted passage
        # being read into a free slot while idle
        self.passages: PassageStore | None = None
        self.reading: PassageReading | None = None
        self.decoding: list[BatchGeneration] = []  # in slot order: decoding[i] is in slot i
        self.prefilling: deque[BatchGeneration] = deque()
        self.ready: list[BatchGeneration] = []  # prompt read; first token at the next step
        self._bookings = itertools.count()  # each reply's key in the bound's books

    @property
    def busy(self) -> bool:
        return bool(self.decoding or self.prefilling or self.ready)

    def room(self) -> int:
        """What the kept conversations may hold: the bound less the running replies'
        reservations and the shared prefixes."""
        return max(0, self.memory.room() - self.memory.set_aside)

    def tidy(self) -> bool:
        """One piece of idle work: room for a new chat (kv/idle.py), then a shared prefix
        written ahead (kv.shared_prefix.Staged), then a wanted passage read into the passage
        store (batch/passages.py), then the pages of the slot the next prompt is written into
        mapped (kv/warm.py); False when there is none."""
        return self.idle.step() or self._stage_step() or self._read_step() or self.warm.step()

    def next_new_slot(self) -> int | None:
        """The slot the next new chat (or conversation restored into a free slot) takes: the
        staged prefix's, else the lowest free one (as _free_slot picks it while nothing
        decodes); None when none is free."""
        if self.staged is not None:
            return self.staged.slot
        return self._lowest_free()

    def _stage_step(self) -> bool:
        """Write one more piece of the shared prefix last used into a free slot; start
        writing one where the bound leaves room for it beside the kept conversations and
        the room kept for a new chat."""
        staged = self.staged
        if staged is None:
            if self.busy or not self.shared or not self.idle.headroom_tokens:
                return False
            prefix = self._last_shared or self.shared[0]
            free = self._lowest_free()
            if self.reading is not None and free == self.reading.slot:
                return False  # a passage is being read there: after it
            nbytes = len(prefix.ids) * self.pool.bytes_per_token
            headroom = self.idle.headroom * self.pool.bytes_per_token
            if free is None or self.cache.stats().bytes + headroom + nbytes > self.room():
                return False
            staged = self.staged = Staged(prefix, free, nbytes)
            self.memory.set_aside += nbytes
        if staged.done:
            return False
        staged.step(self.pool)
        return True

    def _read_step(self) -> bool:
        """Read one more piece of a wanted passage (batch.passages.PassageReading) into the
        highest free slot (not the one the next new chat takes), where the bound leaves room
        for it beside the kept conversations and the room kept for a new chat."""
        reading, store = self.reading, self.passages
        if store is not None and store.write_step():  # a run read earlier, to its file
            return True
        if reading is None:
            if self.busy or store is None or not self.idle.headroom_tokens:
                return False
            wanted = store.next_wanted(self.pool.bytes_per_token)
            if wanted is None:
                return False
            taken = self.staged.slot if self.staged is not None else None
            free = [s for s, h in enumerate(self._slots) if h is None and s != taken]
            if not free:
                return False
            reading = PassageReading(store, self.decoder, wanted, free[-1], self.chunk)
            headroom = self.idle.headroom * self.pool.bytes_per_token
            if self.cache.stats().bytes + headroom + reading.nbytes > self.room():
                return False
            self.reading = reading
            self.memory.set_aside += reading.nbytes
        reading.step()
        if reading.done:
            self._end_reading(abandon=False)
        return True

    def _end_reading(self, *, abandon: bool = True) -> None:
        """The passage being read leaves the bound's books (a request starts: its slot freed,
        the wish kept for later)."""
        reading, self.reading = self.reading, None
        if reading is None:
            return
        self.memory.set_aside -= reading.nbytes
        if abandon:
            reading.abandon()

    def _take_staged(self, prefix: SharedPrefix | None) -> Staged | None:
        """A request starts: the staged prefix leaves the bound's books, and its slot is
        given back unless `prefix` (the new chat's) is the one it holds (returned)."""
        staged, self.staged = self.staged, None
        if staged is None:
            return None
        self.memory.set_aside -= staged.nbytes
        if staged.prefix is prefix and self._slots[staged.slot] is None:
            return staged
        self.pool.free(staged.slot)
        return None

    def read_shared(self, prefixes: list[list[int]]) -> None:
        """Read each shared prefix once and keep it (kv/shared_prefix.py), against the bound."""
        for ids in prefixes:
            if not ids:
                continue
            prefix = shared_prefix.read(self.decoder, self._free_slot(), ids, self.alone_chunk())
            self.shared.append(prefix)
            self.memory.set_aside += prefix.nbytes

    def _start_shared(
        self, holder: SlotHolder, lease: Lease, prefix: SharedPrefix | None, written: int
    ) -> int:
        """Write the shared prefix the prompt starts with into a new slot (its first
        `written` positions are there already); the tokens it holds (0: none)."""
        if prefix is None:
            return 0
        self._last_shared = prefix
        tokens = len(prefix.ids)
        if self.cache.exact:  # whole chunks only: the rest is read as a fresh read reads it
            tokens = tokens // self.chunk * self.chunk
        if not tokens:
            return 0
        if written < tokens:
            kv_compact.restore(prefix.kv, self.pool, holder.index, tokens, start=written)
        holder.tokens[:] = prefix.ids[:tokens]
        holder.kv_len = holder.touched = tokens
        lease.reused = tokens
        lease.holds(tokens)
        if lease.entry is not None:  # read as a fresh read reads it, bit for bit
            lease.entry.exact_end = tokens
        return tokens

    # -- joining and leaving ---------------------------------------------------------------

    def start(self, prompt: Prompt, request: Generate, *, cached: bool = True) -> BatchGeneration:
        """Start a reply: reserve its KV against the bound (NoRoom: it must wait for a running
        reply to end), then continue the cached conversation the lease lends (restored into a
        slot from compact RAM or disk where it is not in one) or take a new slot."""
        self._end_reading()  # its slot may be the one this reply needs
        needed = len(prompt.ids) + prompt.max_new_tokens
        # Its prompt and the first GROWTH_TOKENS of its reply now, the rest as it grows
        # (kv/bound.py): a large max_new_tokens holds nobody up front
        first = len(prompt.ids) + min(prompt.max_new_tokens, GROWTH_TOKENS)
        reserve, need = first * self.pool.bytes_per_token, needed * self.pool.bytes_per_token
        # The cache decides (PromptCache.lease): a slot's bytes are what it writes, so a new
        # one is sized to the request, with no room to grow.
        lease = self.cache.lease(request, prompt.ids, needed, wanted=cached, grow=False)
        if lease.entry is not None:
            self.tiers.account(lease.entry)  # lent: its slot is now the reply's reservation
        prefix = shared_prefix.longest(self.shared, prompt.ids) if lease.fresh else None
        staged = self._take_staged(prefix)  # its bytes are now this reply's reservation
        memory = self.memory
        if not memory.fits(reserve, need):
            if staged is not None:
                self.pool.free(staged.slot)
            self.warm.settle(0)
            self._unlease(lease)
            raise NoRoom(f"{reserve} bytes of KV do not fit beside the running replies")
        booking = next(self._bookings)
        memory.reserve(booking, reserve, need)
        # Kept conversations move down to make room, also for the compact copy a conversation
        # coming back from disk is read into
        moved = self.tiers.moved()  # what this start moves down, for its log line
        incoming = self.tiers.incoming_bytes(lease)
        if not lease.fresh and lease.entry is not None:
            self.tiers.lend(lease.entry)  # a write of it begun while idle is dropped
            self.idle.saw_return(reserve, incoming)  # the room the next one may need
        self.cache.shrink(self.cache.limit() - incoming)
        restored = Restored(None)
        shared = 0
        if not lease.fresh:
            assert lease.entry is not None
            holder: SlotHolder = lease.entry.generator
            holder.busy = True
            if holder.slot is None:
                self.warm.saw_prompt(len(prompt.ids))  # written into a free slot (kv/warm.py)
                try:
                    restored = self._restore(lease.entry, lease.reused)
                except LookupError:  # its file is gone or bad: read the prompt again
                    self.cache.drop(lease.entry)
                    memory.release(booking, reserve)
                    return self.start(prompt, request, cached=cached)
            else:
                restored = Restored("ram")
            del holder.tokens[lease.reused :]
            if holder.holding.compact is not None:  # past `reused` the slot will differ
                holder.holding.compact.truncate(lease.reused)
            holder.kv_len = lease.reused
            lease.holds(lease.reused)
        else:
            self.idle.saw_new_chat(needed)  # the room the next one may need (kv/idle.py)
            self.warm.saw_prompt(len(prompt.ids))
            self._free_unheld()
            slot = self._free_slot() if staged is None else staged.slot
            holder = SlotHolder(slot)
            self._slots[slot] = holder
            holder.entry = lease.attach(holder, None, capacity=self.pool.length)
            self.tiers.account(holder.entry)
            written = 0 if staged is None else staged.written
            shared = self._start_shared(holder, lease, prefix, written)
        self.warm.settle(first)  # a warmed slot keeps what this reply reserved, if it took it
        generation = BatchGeneration(self, prompt, request, holder, lease)
        generation.booking, generation.reserved, generation.need = booking, reserve, need
        generation.restored = restored
        now = self.tiers.moved()
        generation.room_moves = (now[0] - moved[0], now[1] - moved[1])  # compacted, on disk
        generation.room_s = now[2] - moved[2]
        if lease.fresh and shared:
            # Not the scope's own tokens: cached_tokens stays what the scope held (none)
            generation.cached_tokens, generation.cache_reason = 0, "shared"
        if not self.cache.exact:  # PROMPT_CACHE_EXACT: a fresh read's K/V only
            scope = request.passage_scope
            generation.placements = batch_passages.plan(
                self.passages, prompt, scope, max(holder.kv_len, shared)
            )
        self.prefilling.append(generation)
        return generation

    def place(self, generation: BatchGeneration, placement: batch_passages.Placement) -> None:
        """Write a run's positions into the reply's slot (its prompt reaches them)."""
        assert self.passages is not None
        self.passages.place(
            placement.kv,
            self.pool,
            generation.holder.index,
            placement.source,
            placement.at,
            placement.tokens,
        )

    def _unlease(self, lease: Lease) -> None:
        """Give back a lease whose request must wait: a lent entry is idle again, as it was."""
        if lease.entry is not None and not lease.fresh:
            lease.entry.lent = False
            self.tiers.account(lease.entry)
        self.memory.waits += 1

    def leave(self, generation: BatchGeneration, reusable: bool) -> None:
        """The request is over: its row leaves the batch; its slot stays as a cache entry or
        is freed."""
        if generation in self.prefilling:
            self.prefilling.remove(generation)
        elif generation in self.ready:
            self.ready.remove(generation)
        elif generation in self.decoding:
            index = self.decoding.index(generation)
            last = len(self.decoding) - 1
            if index != last:
                self._swap(index, last)
                self.decoding[index] = self.decoding[last]
            self.decoding.pop()
        holder = generation.holder
        holder.busy = False
        self.memory.release(generation.booking, generation.reserved)
        generation.reserved = 0
        generation.room_found()  # a reply that ends while it waits to grow waits no more
        generation.lease.give_back(reusable)  # kv.tiers accounts its slot as kept again
        self._free_unheld()


# Idle conversations the pool keeps slots for beyond the active replies (address space only:
# a slot's memory is the positions it holds, and PROMPT_CACHE_MB bounds their sum).
CACHE_SLOTS = 16

# The fields of Generate the batched path serves; a request that sets any other field (one
# added later to the Generator path) goes to a Generator. Guidance: batch/guidance.py.
SERVED_FIELDS = frozenset(
    {
        "request_id",
        "messages",
        "max_new_tokens",
        "min_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "cache_scope",
        "stop",
        "use_cache",
        "deadline",  # the worker's, between steps
        "repetition_penalty",
        "key",
        "guidance",
        "logprobs",  # BatchGeneration.take
        "prompt",  # the engine reads it; a plain prompt is ids like any other
        "passages",  # the passage store's (batch/passages.py); the Generator reads them as text
        "passage_scope",
        "warm",  # never started: its passages are noted (Engine.warm_passages)
    }
)


def serves(request: Generate) -> bool:
    """Whether the batched path serves this request (as the Generator would: greedy replies
    are the same; a seeded sampling reply is batch/sampling.py's for that seed, the same whatever
    else runs, not onnxruntime-genai's sampler's)."""
    return not any(getattr(request, f.name) for f in fields(request) if f.name not in SERVED_FIELDS)
