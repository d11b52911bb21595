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
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import numpy as np

from sidecar.ipc import Drafts, Finish, Generate, TokenLogprob
from sidecar.model.batch.decoder import BatchDecoder
from sidecar.model.batch.guidance import RowGuide
from sidecar.model.batch.sampling import Sampler, penalize_repeats
from sidecar.model.guidance import FF_MARGIN
from sidecar.model.kv import compact as kv_compact
from sidecar.model.kv import shared_prefix
from sidecar.model.kv.bound import GROWTH_TOKENS, Memory, NoRoom
from sidecar.model.kv.disk import Stored
from sidecar.model.kv.idle import IdleRoom
from sidecar.model.kv.prompt_cache import Entry, Lease, PromptCache
from sidecar.model.kv.shared_prefix import SharedPrefix, Staged
from sidecar.model.kv.tiers import Holding, KvTiers, Restored
from sidecar.model.kv.warm import WarmPages
from sidecar.model.logprobs import ReplyLogprobs
from sidecar.model.prompt.builder import Prompt
from sidecar.model.stops import StopFilter


class GrammarDeadEnd(RuntimeError):
    """A guided reply's grammar left no token, or refused the one chosen (llguidance's words,
    which quote the grammar and the reply's last tokens)."""


class TokenStream(Protocol):
    def decode(self, token: int) -> str: ...


@dataclass(eq=False)
class SlotHolder:
    """One conversation's KV: its tokens (what the cache matches, as a generator's sequence),
    how many of them are in the KV cache, and where that is: a pool slot, or (kept idle) compact
    RAM or the disk tier (kv/tiers.py)."""

    slot: int | None
    tokens: list[int] = field(default_factory=list)
    kv_len: int = 0
    touched: int = 0  # positions written since the slot was last freed: its memory
    entry: Entry | None = None
    busy: bool = True  # a request is using it
    holding: Holding = field(default_factory=Holding)  # its compact copy and file

    def get_sequence(self, index: int) -> list[int]:
        return self.tokens

    @property
    def index(self) -> int:
        """Its slot, for a holder a reply is using (always in one)."""
        assert self.slot is not None, "a running reply's conversation is in a slot"
        return self.slot


class BatchScheduler:
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
        self._new_stream = new_stream
        self._vocab_size = vocab_size
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

    def slots_held(self) -> list[SlotHolder | None]:
        """Each slot's holder (None: free)."""
        return list(self._slots)

    def tidy(self) -> bool:
        """One piece of idle work: room for a new chat (kv/idle.py), then a shared prefix
        written ahead (kv.shared_prefix.Staged), then the pages of the slot the next prompt is
        written into mapped (kv/warm.py); False when there is none."""
        return self.idle.step() or self._stage_step() or self.warm.step()

    def next_new_slot(self) -> int | None:
        """The slot the next new chat (or conversation restored into a free slot) takes: the
        staged prefix's, else the lowest free one (as _free_slot picks it while nothing
        decodes); None when none is free."""
        if self.staged is not None:
            return self.staged.slot
        return self._lowest_free()

    def _lowest_free(self) -> int | None:
        """The lowest slot nothing holds; None when every slot is held."""
        return next((slot for slot, holder in enumerate(self._slots) if holder is None), None)

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

    # -- joining ---------------------------------------------------------------------------

    def start(self, prompt: Prompt, request: Generate, *, cached: bool = True) -> BatchGeneration:
        """Start a reply: reserve its KV against the bound (NoRoom: it must wait for a running
        reply to end), then continue the cached conversation the lease lends (restored into a
        slot from compact RAM or disk where it is not in one) or take a new slot."""
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
        self.prefilling.append(generation)
        return generation

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

    def _unlease(self, lease: Lease) -> None:
        """Give back a lease whose request must wait: a lent entry is idle again, as it was."""
        if lease.entry is not None and not lease.fresh:
            lease.entry.lent = False
            self.tiers.account(lease.entry)
        self.memory.waits += 1

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

    # -- one step ------------------------------------------------------------------------------

    def step(self) -> list[tuple[BatchGeneration, str | None]]:
        """One decode call per DECODE_BATCH_ROWS replies past their prompt, the first token
        of each reply whose prompt the previous step finished reading, and one chunk of a
        prompt still being read (next_prompt says which): each touched
        generation with its new text (None: a chunk, or no token).

        Each row is isolated: whatever fails for one reply (its logits, its sampler, its
        grammar, its stop filter, a model call it is part of) ends that reply alone, with
        finish "error" and the exception as its `fault` (the worker logs and counts it); the
        others go on."""
        results: list[tuple[BatchGeneration, str | None]] = []
        # A reply without KV reserved for the positions its call writes, and no room to grow,
        # waits: the calls bind the runs of slots around it (kv/bound.py)
        writing = [
            i
            for i, generation in enumerate(self.decoding)
            if self._may_write(generation, self._fed(generation))
        ]
        for start, end in _runs(writing):
            for first, group in self._calls(self.decoding[start:end], start):
                results.extend(zip(group, self._decode_isolated(first, group), strict=True))
        for generation in list(self.ready):
            try:
                first_text: str | None = self._first_token(generation)
            except Exception as exc:
                self._failed(generation, exc)
                first_text = None
            results.append((generation, first_text))
        if self.prefilling:
            generation = self.next_prompt()
            try:
                self._prefill(generation)
            except Exception as exc:
                self._failed(generation, exc)
                self.prefilling.remove(generation)
            results.append((generation, None))
        return results

    def _fed(self, generation: BatchGeneration) -> int:
        """The positions the reply's next decode call writes: one token, or as much of a run
        of forced tokens as one call reads (a call of its own, _calls). A reply that decodes
        alone reads a forced run in one call, as onnxruntime-genai does, up to the longest run
        it allows for (guidance.FF_MARGIN), or a prompt chunk where that is longer. Beside
        other replies it reads one forced token a step, in their call: a call of its own
        would cost them a whole extra pass over the weights each time (the guidance bench's
        three chats decoded at 0.74x their rate beside an unguided reply), where one token
        a step costs them nothing and the guided reply no more than an unguided one."""
        if generation.pending > 1 and len(self.decoding) == 1:
            return min(generation.pending, max(self.chunk, FF_MARGIN))
        return 1

    def _may_write(self, generation: BatchGeneration, positions: int) -> bool:
        """Whether the reply's next decode call has KV reserved for the `positions` it
        writes, growing its reservation by GROWTH_TOKENS (or what the call needs, if more) if
        it must; False: no room, it waits."""
        per_token = self.pool.bytes_per_token
        short = (generation.holder.kv_len + positions) * per_token - generation.reserved
        if short <= 0:
            return True
        more = min(max(GROWTH_TOKENS * per_token, short), generation.need - generation.reserved)
        if more <= 0:
            return True  # its whole length is reserved (the slot is MAX_LENGTH long anyway)
        if not self.memory.grow(generation.booking, more):
            generation.wait_for_room(self.memory)
            return False
        generation.reserved += more
        generation.room_found()
        self.cache.shrink(self.cache.limit())  # kept conversations move down to make room
        return True

    def _calls(
        self, decoding: list[BatchGeneration], start: int
    ) -> list[tuple[int, list[BatchGeneration]]]:
        """The decode calls over adjacent slots from `start`: runs whose rows each feed one
        token, DECODE_BATCH_ROWS rows at most; a row that reads a run of forced tokens at once
        (a guided reply decoding alone, _fed) has a call of its own, the run read as a prompt
        is."""
        calls: list[tuple[int, list[BatchGeneration]]] = []
        run: list[BatchGeneration] = []
        for slot, generation in enumerate(decoding, start):
            if self._fed(generation) > 1:
                if run:
                    calls.append((slot - len(run), run))
                    run = []
                calls.append((slot, [generation]))
                continue
            run.append(generation)
            if len(run) == self.rows:
                calls.append((slot + 1 - len(run), run))
                run = []
        if run:
            calls.append((start + len(decoding) - len(run), run))
        return calls

    def chunk_for(self, generation: BatchGeneration) -> int:
        """The prompt tokens `generation` reads in its next call: PREFILL_CHUNK while any
        other reply runs or waits for its turn (its stall is one chunk), ALONE_CHUNK when it
        is all the batch has to do (each call has a fixed cost: three calls of 64 for a
        130-token prompt took 7 to 13% more CPU time than one). PROMPT_CACHE_EXACT keeps
        PREFILL_CHUNK: replies then never depend on what else ran."""
        alone = not self.decoding and not self.ready and len(self.prefilling) == 1
        return self.alone_chunk() if alone and generation in self.prefilling else self.chunk

    def alone_chunk(self) -> int:
        return self.chunk if self.cache.exact else max(self.chunk, ALONE_CHUNK)

    def next_prompt(self) -> BatchGeneration:
        """The prompt whose chunk this step reads: the one with the fewest tokens left to
        read, less a chunk for every step it was passed over (ties: the one that came first).
        Prompts that arrive together then get their first tokens one after another, not all
        after the last chunk of all of them (taking turns a chunk each did that: four 130-token
        prompts all waited about four prefills), a short prompt passes a long one, and a long
        one is passed at most about its own number of chunks."""
        chosen = min(self.prefilling, key=lambda g: g.prompt_left - g.passed_over * self.chunk)
        for generation in self.prefilling:
            if generation is not chosen:
                generation.passed_over += 1
        return chosen

    def step_one(self, generation: BatchGeneration) -> str | None:
        """Step one generation alone (a batch of one row): for an engine wrapper (the tests'
        fault injection) that steps its generations one by one. Raises what the model
        raises."""
        if generation in self.prefilling:
            self._prefill(generation)
            return None
        if generation in self.ready:
            return self._first_token(generation)
        if not self._may_write(generation, self._fed(generation)):
            return None  # it waits for room to grow (kv/bound.py)
        index = self.decoding.index(generation)
        return self._decode(index, [generation])[0]

    def _prefill(self, generation: BatchGeneration) -> None:
        """Read a chunk; after the last one the reply's first token waits for the next step
        (as on the Generator path: a step reads a chunk or makes a token)."""
        generation.prefill_chunk()
        if not generation.prefilling:
            self.prefilling.remove(generation)
            self.ready.append(generation)

    def _first_token(self, generation: BatchGeneration) -> str:
        self.ready.remove(generation)  # first: a failure must not leave it there
        text = generation.first_token()
        if generation.finish is None:
            self._swap(generation.holder.index, len(self.decoding))
            self.decoding.append(generation)
        return text

    def _decode(self, first: int, group: list[BatchGeneration]) -> list[str | None]:
        """One decode call for the generations in slots first..first+len(group)-1; raises
        what the model or a row raises (step_one)."""
        fed, logits = self._run(first, group)
        texts: list[str | None] = []
        for generation, row in zip(group, logits, strict=True):
            generation.wrote(fed)
            texts.append(generation.take(row) if not generation.pending else None)
        return texts

    def _decode_isolated(self, first: int, group: list[BatchGeneration]) -> list[str | None]:
        """_decode, where a failure ends only the reply it belongs to. A failed model call is
        run again one row at a time (each writes the same KV position again), so only a row
        that fails alone ends; a row whose token cannot be taken ends, the others keep
        theirs."""
        try:
            fed, logits = self._run(first, group)
        except Exception as exc:
            if len(group) == 1:
                self._failed(group[0], exc)
                return [None]
            return [
                self._decode_isolated(first + i, [generation])[0]
                for i, generation in enumerate(group)
            ]
        texts: list[str | None] = []
        for generation, row in zip(group, logits, strict=True):
            generation.wrote(fed)
            if generation.pending:  # more of a forced run to read: no token this step
                texts.append(None)
                continue
            try:
                texts.append(generation.take(row))
            except Exception as exc:
                self._failed(generation, exc)
                texts.append(None)
        return texts

    def _run(self, first: int, group: list[BatchGeneration]) -> tuple[int, np.ndarray]:
        """The model call: the tokens each generation holds past its KV (its last token; a
        row alone: its forced run too), at its own length; how many each fed, and the logits
        of each row's last one."""
        fed = self._fed(group[0]) if len(group) == 1 else 1
        ids = np.array(
            [g.holder.tokens[g.holder.kv_len : g.holder.kv_len + fed] for g in group],
            dtype=np.int64,
        )
        return fed, self.decoder.run(first, ids, [g.holder.kv_len for g in group])

    @staticmethod
    def _failed(generation: BatchGeneration, exc: Exception) -> None:
        """End one reply with finish "error"; the worker logs `fault` (its type only, unless
        LOG_PROMPTS: a message may quote the prompt, the grammar or the reply)."""
        generation.finish = "error"
        generation.fault = exc

    # -- moving and leaving --------------------------------------------------------------------

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


class BatchGeneration:
    """One reply on the batched path (the worker's Stepper, stepped by BatchScheduler)."""

    batched = True  # the worker steps it through BatchScheduler.step, not step()

    def __init__(
        self,
        scheduler: BatchScheduler,
        prompt: Prompt,
        request: Generate,
        holder: SlotHolder,
        lease: Lease,
    ) -> None:
        self.prompt = prompt
        self.generated = 0
        self.lease = lease
        self.cached_tokens = lease.reused
        self.cache_reason: str = lease.reason
        self.finish: Finish | None = None
        self.fault: Exception | None = None  # what ended it with finish "error" (step)
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.holder = holder
        self._scheduler = scheduler
        self._appended = lease.reused
        self.passed_over = 0  # steps that read another prompt's chunk while this one waited
        self._first_logits: np.ndarray | None = None
        # KV bytes reserved against the bound (kv.bound.Memory) under its booking, and its
        # whole length's; the seconds it waited to grow (while the bound was full)
        self.booking = -1
        self.reserved = 0
        self.need = 0
        self.kv_paused_s = 0.0
        self._paused_at: float | None = None
        self._row_size = scheduler._vocab_size  # logits per row (a forced token's logprobs)
        self.restored = Restored(None)  # where the reused tokens came from, and its cost
        self.room_s = 0.0  # its start moving kept conversations down a tier for its room
        self.room_moves = (0, 0)  # how many: compacted, written to disk
        self._min_new = min(request.min_new_tokens, prompt.max_new_tokens)
        top_k = request.top_k
        if top_k is not None and scheduler._vocab_size:
            top_k = min(top_k, scheduler._vocab_size)
        # One rule for greedy (ipc.Generate.sampling): a temperature below the floor is greedy
        temperature = request.temperature if request.sampling else None
        self._sampler = Sampler(temperature, top_k, request.top_p, request.seed)
        self._penalty = request.repetition_penalty or 1.0
        self._stream: TokenStream = scheduler._new_stream()
        self._stops = StopFilter(request.stop)
        # A guided request's matcher (batch/guidance.py), set by the engine before the first step
        self.guide: RowGuide | None = None
        # Generate.logprobs (logprobs.py), set by the engine before the first step
        self.logprobs: ReplyLogprobs | None = None

    @property
    def prefilling(self) -> bool:
        return self._appended < len(self.prompt.ids)

    @property
    def pending(self) -> int:
        """Tokens of the sequence not yet in the KV cache: the last one chosen, and the
        tokens its grammar forced after it (batch/guidance.py); the next call reads them."""
        return len(self.holder.tokens) - self.holder.kv_len

    @property
    def prompt_left(self) -> int:
        """Prompt tokens still to read."""
        return len(self.prompt.ids) - self._appended

    def step(self) -> str | None:
        """This generation alone (the worker steps batched ones through the scheduler)."""
        return self._scheduler.step_one(self)

    def prefill_chunk(self) -> None:
        """Read the next chunk of the prompt; the last one's logits give the first token."""
        start, ids = self._appended, self.prompt.ids
        end = min(start + self._scheduler.chunk_for(self), len(ids))
        chunk = np.array([ids[start:end]], dtype=np.int64)
        logits = self._scheduler.decoder.run(self.holder.index, chunk, [start])
        self.holder.tokens[start:] = ids[start:end]
        self.wrote(end - start)
        self._appended = end
        self.lease.prefilled(end)
        if not self.prefilling:
            self._first_logits = logits[0]

    def first_token(self) -> str:
        logits, self._first_logits = self._first_logits, None
        assert logits is not None, "the prompt is not read yet"
        self._row_size = len(logits)
        guide = self.guide
        if guide is not None and guide.fast_forward:
            # What the grammar forces before any choice (a JSON reply's opening): taken as
            # onnxruntime-genai takes it, read by the next call, the token chosen after it
            forced = self._forced(guide)
            if forced is not None:
                return self._ended(forced)
        return self.take(logits)

    def wrote(self, count: int) -> None:
        """`count` more positions of this reply's slot hold K/V."""
        holder = self.holder
        holder.kv_len += count
        holder.touched = max(holder.touched, holder.kv_len)
        self.lease.holds(holder.kv_len)

    def take(self, logits: np.ndarray) -> str:
        """Choose the next token; its text ('' while a character is incomplete)."""
        eos = self._scheduler.eos_ids
        self._row_size = len(logits)
        if self._penalty != 1.0:
            logits = penalize_repeats(logits, self.holder.tokens, self._penalty)
        banned = eos if self.generated < self._min_new else ()
        guide = self.guide
        if guide is not None:
            allowed = guide.masked(logits, banned)
            if allowed is None:  # never a token outside the grammar (batch/guidance.py)
                raise GrammarDeadEnd(guide.error)  # its text quotes the grammar and the reply
            logits, banned = allowed, ()
        token = self._sampler.pick(logits, banned)
        if guide is not None and token not in eos and not guide.consume(token):
            raise GrammarDeadEnd(guide.error)
        self.generated += 1
        self.last_token_at = time.monotonic()
        if self.first_token_at is None:
            self.first_token_at = self.last_token_at
        if token in eos:
            # As on the Generator path: EOS is not in the sequence, whose K/V is all cached.
            self.finish = "eos"
            return self._stops.flush()
        if self.logprobs is not None:  # from the row the token was chosen from
            self.logprobs.chosen(logits, token, banned)
        # In the sequence, not yet in the KV cache: the next step feeds it.
        self.holder.tokens.append(token)
        text = str(self._stream.decode(token))
        if guide is not None and self.generated < self.prompt.max_new_tokens:
            text += self._forced(guide) or ""
        return self._ended(text)

    def _forced(self, guide: RowGuide) -> str | None:
        """Take the tokens the grammar forces now (none with forced tokens off), as many as
        the reply's max_new_tokens leaves (as the Generator path shows them): their text, None
        when there are none. They join the sequence, and the next call reads them."""
        forced = guide.forced()[: self.prompt.max_new_tokens - self.generated]
        if not forced:
            return None
        text = ""
        for token in forced:
            if self.logprobs is not None:  # the only token the grammar allowed
                self.logprobs.forced(token, self._row_size)
            self.holder.tokens.append(token)
            text += str(self._stream.decode(token))
        self.generated += len(forced)
        self.last_token_at = time.monotonic()
        if self.first_token_at is None:
            self.first_token_at = self.last_token_at
        return text

    def _ended(self, text: str) -> str:
        """The text of the tokens just taken, and whether the reply ends with them."""
        if self._stops:
            text, stopped = self._stops.feed(text)
            if stopped:
                self.finish = "stop"
                return text
        guide = self.guide
        if self.generated >= self.prompt.max_new_tokens:
            self.finish = "length"
            text += self._stops.flush()
        elif guide is not None and guide.stopped:
            # The grammar is complete: the end token the Generator path would make next
            self.generated += 1
            self.finish = "eos"
            text += self._stops.flush()
        return text

    def wait_for_room(self, memory: Memory) -> None:
        """Its reservation cannot grow this step (the bound is full): it waits."""
        if self._paused_at is None:
            self._paused_at = time.monotonic()
            memory.pauses += 1

    def room_found(self) -> None:
        if self._paused_at is not None:
            self.kv_paused_s += time.monotonic() - self._paused_at
            self._paused_at = None

    def take_logprobs(self) -> tuple[TokenLogprob, ...]:
        """The log probabilities of the tokens whose text is now shown (logprobs.py)."""
        return () if self.logprobs is None else self.logprobs.take(self._stops, self.finish)

    def release(self, reusable: bool) -> None:
        self._scheduler.leave(self, reusable)

    def tokens_per_s(self) -> float | None:
        if self.first_token_at is None or self.last_token_at is None or self.generated < 2:
            return None
        elapsed = self.last_token_at - self.first_token_at
        return (self.generated - 1) / elapsed if elapsed > 0 else None

    def drafts(self) -> Drafts | None:
        """Batched decode takes no prompt-lookup drafts (PROMPT_LOOKUP_TOKENS,
        generator/drafts.py)."""
        return None


# Prompt tokens read per call by a prompt that is all the batch has to do (chunk_for): a 1,000-
# token prompt in two calls, where PREFILL_CHUNK would take 16.
ALONE_CHUNK = 512

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
    }
)


def _runs(indices: list[int]) -> list[tuple[int, int]]:
    """Runs of consecutive indices, as (first, past the last)."""
    runs: list[tuple[int, int]] = []
    for index in indices:
        if runs and runs[-1][1] == index:
            runs[-1] = (runs[-1][0], index + 1)
        else:
            runs.append((index, index + 1))
    return runs


def serves(request: Generate) -> bool:
    """Whether the batched path serves this request (as the Generator would: greedy replies
    are the same; a seeded sampling reply is batch/sampling.py's for that seed, the same whatever
    else runs, not onnxruntime-genai's sampler's)."""
    return not any(getattr(request, f.name) for f in fields(request) if f.name not in SERVED_FIELDS)
