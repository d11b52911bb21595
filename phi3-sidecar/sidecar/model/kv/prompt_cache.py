"""The conversation (prefix) cache: a pool of live generators, reused across requests.

A chat client resends the whole conversation every turn. onnxruntime-genai 0.18 cannot copy a
KV cache out of a generator (the generator is the cache), so the cache keeps generators alive
after their reply and lends one to the next request that starts with the same tokens: the
generator is rewound to the common prefix and only the rest of the prompt is read. Matching is
by tokens, so it works for every client that resends the history, an edited or regenerated
message reuses everything before the edit, and no session id is needed.

Rules (measured facts they rely on: docs/benchmarks/turns.md, "Conversation cache"):
- An entry is matched only by requests of the same scope (`cache_scope`, the one internal name:
  the chat app's conversation, an OpenAI client's `prompt_cache_key` or `user`; see
  ipc.Generate; None is the shared unscoped pool, PROMPT_CACHE_UNSCOPED, and with API_KEY
  each key has its own: ipc.owned_scope), so nobody
  can time another scope's cached prefix, and of the same sampling mode and the same guidance
  (greedy or sampling, and the grammar a structured reply follows, are fixed when a generator
  is made: a guided generator is never lent to an unguided request or to another grammar, nor
  the reverse).
- In the unscoped pool an entry is lent only to what is likely its own conversation: a request
  that starts with the entry's whole last prompt (the next turn, a regenerated reply), or one
  it lies wholly inside (nothing of it is lost), or one it covers at least half of; so a short
  shared prefix (a chat template's first tokens) never clobbers another conversation's cache.
  Within a scope, which is one conversation or one client, the best match is always lent.
- Exactness. A prompt is read in chunks (PREFILL_CHUNK), and a chunk computed with other
  neighbours, or a reply's tokens computed one at a time, give K/V that differ from a fresh
  prefill's in the last bits; greedy decoding can then pick another token at a near tie. So
  where the new prompt leaves the old one inside its prompt (a regenerated reply, an edited
  message), the cache reuses only whole chunks of what was prefilled, and the reply is the one
  an uncached run gives, bit for bit. Where the new prompt holds the whole previous prompt and
  goes on (the next turn of a chat, into the previous reply as far as it repeats it), it reuses
  every matching token by default, as llama.cpp's cache_prompt
  does (replies may then differ from an uncached run in rare near-ties);
  PROMPT_CACHE_EXACT=true reuses only whole prefilled chunks there too (exact, but each turn
  re-reads the previous reply).
- Memory: the KV cache is allocated for a generator's whole length when it is made. Every
  generator, lent or idle, counts against the budget (PROMPT_CACHE_MB); idle ones are evicted
  least recently used first to make room, and a generator the budget cannot hold is not kept.
- A miss that has to evict reuses one of the generators it would evict (same sampling mode,
  enough room), rewound to nothing, instead of freeing it and allocating another: the same
  memory, without the allocation and zero-fill of a whole KV cache.
- A spare: the engine makes one idle generator while loading (sized for a short prompt and the
  default reply), so that the first cached request does not pay for allocating and zero-filling
  a KV cache larger than an uncached request's. An idle generator that holds nothing is lent
  to the next miss that fits it, before anything new is allocated.
- Room: a cached generator is made for its request plus max(half again, GROWTH_TOKENS), capped
  by the context and the budget. A conversation that outgrows it gets a bigger one (one full
  prefill; each step grows by at least half, so the re-reads stay a fraction of the
  conversation), and the old entry, a prefix of the new one, is dropped.

One call decides a request's use of the cache: `PromptCache.lease` returns a Lease that says
what is reused (an entry and how many tokens), or that the caller makes a new generator and
whether the cache keeps it, and why (`Lease.reason`, one of REASONS: why a turn was not
reused is answered here). The caller reports through the lease what its KV cache holds as it
steps, and gives the lease back when the reply is over.

Pure Python: the generators are onnxruntime-genai objects that generator/generation.py makes and
drives; this module only keeps the books. With batched decode (DECODE_BATCH_ROWS > 1) the entries
are KV slots instead (batch/scheduler.py): same rules, an entry's bytes are the tokens its slot
holds.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from sidecar.ipc import Generate, Guidance, in_unscoped_pool

GROWTH_TOKENS = 1024  # at least this much room to grow beyond the request, when it fits
ROUND_TOKENS = 256  # generator lengths are multiples of this (fewer distinct sizes to allocate)


class Sequencer(Protocol):
    """What the cache needs of an onnxruntime-genai Generator."""

    def get_sequence(self, index: int) -> Sequence[int]: ...


@dataclass(eq=False)
class Entry:
    """One live generator and what its KV cache holds."""

    generator: Any  # og.Generator
    params: Any  # og.GeneratorParams: the generator keeps a pointer to it, so must we
    capacity: int  # the generator's max_length: it can never hold more tokens
    cache_scope: str | None  # who may be lent it (ipc.Generate.cache_scope); None: unscoped
    sampling: bool
    nbytes: int
    kv_len: int = 0  # leading tokens of the sequence whose K/V is really in the cache
    prompt_end: int = 0  # where the latest turn's prompt ended (its reply follows)
    exact_end: int = 0  # leading tokens whose K/V a fresh chunked prefill would give bit for bit
    lent: bool = True
    last_used: int = 0
    guidance: Guidance | None = None  # the grammar the generator was made with, for life
    spare: bool = False  # made while loading, never used yet: holds nothing

    def prefilled(self, start: int, end: int, chunk: int) -> None:
        """The prompt was appended from `start` to `end` in chunks of `chunk` tokens."""
        if start % chunk == 0 and start <= self.exact_end:  # the fresh run's chunks, again
            self.exact_end = start + (end - start) // chunk * chunk
        else:  # continued inside a reply: nothing after `start` is exact
            self.exact_end = min(self.exact_end, start)
        self.prompt_end = end

    def cached_tokens(self) -> list[int]:
        sequence: Sequencer = self.generator
        return [int(t) for t in sequence.get_sequence(0)[: self.kv_len]]


Reason = Literal[
    "reused",
    "spare",
    "recycled",
    "miss",
    "too_big",
    "no_rewind",
    "declined",
    "unscoped_off",
    "off",
    "seeded",
    "shared",
]

# Why a lease reuses what it does (Lease.reason): the first is a hit, the rest start from token 0.
REASONS: dict[Reason, str] = {
    "reused": "an idle entry of the request's scope, mode and guidance held its prompt's start",
    "spare": "no entry matched; the idle generator made while loading was taken, empty",
    "recycled": "no entry matched; an idle one that had to be evicted was taken, emptied",
    "miss": "no entry matched; a new generator is made and kept",
    "too_big": "no entry matched; a new generator is made, too big for the budget to keep",
    "no_rewind": "the model's generators cannot be rewound (onnxruntime-genai refuses it for "
    "phi3v, a vision model): every request gets a new one, none is kept",
    "declined": "the request asked for no cache (cache_prompt false; the warm-up; images)",
    "unscoped_off": "no scope, and PROMPT_CACHE_UNSCOPED=false",
    "off": "the cache is off (PROMPT_CACHE_MB=0, or not sized yet at warm-up)",
    "seeded": "a seeded sampling request starts fresh, so that its seed gives its reply",
    "shared": "no entry matched; a new slot started from a shared prefix the operator declared "
    "(SHARED_PREFIXES, kv/shared_prefix.py), not counted in cached_tokens",
}


@dataclass(eq=False)
class Lease:
    """One request's use of the cache (PromptCache.lease). `entry` is the lent entry, or None
    while `fresh`: the caller then makes a generator (or KV slot) of `capacity` tokens and
    attaches it; the cache keeps it if `keep`. `reused`: leading prompt tokens the entry holds
    (a caller that must rewind further lowers it before its first step)."""

    cache: PromptCache
    cache_scope: str | None
    sampling: bool
    guidance: Guidance | None
    reason: Reason
    capacity: int
    fresh: bool
    keep: bool = False
    entry: Entry | None = None
    reused: int = 0

    def attach(self, generator: Any, params: Any, capacity: int | None = None) -> Entry:
        """The generator the caller made for a fresh lease, as an entry (in the cache's books
        if `keep`). `capacity`: what it can hold where that is more than this lease's (a slot
        of the batched pool); its bytes are this lease's capacity either way."""
        entry = Entry(
            generator,
            params,
            capacity or self.capacity,
            self.cache_scope,
            self.sampling,
            nbytes=self.capacity * self.cache.bytes_per_token,
            guidance=self.guidance,
        )
        if self.keep:
            self.cache.adopt(entry)
        self.entry = entry
        return entry

    def holds(self, kv_len: int) -> None:
        """The leading tokens of the sequence whose K/V is now really in the KV cache."""
        if self.entry is not None:
            self.entry.kv_len = kv_len

    def prefilled(self, end: int) -> None:
        """The prompt is appended up to `end`, from `reused` on, in the cache's chunks."""
        if self.entry is not None:
            self.entry.prefilled(self.reused, end, self.cache.chunk)

    def give_back(self, reusable: bool) -> None:
        """The request is over (not reusable: failed)."""
        if self.entry is None:
            return
        self.cache.give_back(self.entry, reusable)


@dataclass
class CacheStats:
    entries: int = 0
    bytes: int = 0
    evictions: int = 0
    bytes_per_token: int = 0


@dataclass
class PromptCache:
    """The pool. `budget_bytes` 0 turns the cache off (every request gets its own generator,
    sized to it, dropped after it)."""

    budget_bytes: int
    bytes_per_token: int
    max_length: int
    chunk: int = 64  # the engine's PREFILL_CHUNK
    exact: bool = False  # PROMPT_CACHE_EXACT
    unscoped: bool = True  # PROMPT_CACHE_UNSCOPED: requests without a scope share a pool
    # False: the model's generators cannot be rewound (measured at warm-up), and lending one
    # means rewinding it: the cache stays off
    rewinds: bool = True
    entries: list[Entry] = field(default_factory=list)
    evictions: int = 0
    # The batched path's tiers (kv.tiers.KvTiers): idle entries move down (compact RAM, disk)
    # before any is dropped, and `room` is what the one KV bound leaves them. None: the
    # Generator path, where an entry is its generator and every generator counts.
    tiers: Any = None
    room: Any = None  # () -> int, with tiers
    _clock: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def stats(self) -> CacheStats:
        held = sum(e.nbytes for e in self.entries)
        return CacheStats(len(self.entries), held, self.evictions, self.bytes_per_token)

    # -- lending ---------------------------------------------------------------------------

    def lease(
        self,
        request: Generate,
        prompt: Sequence[int],
        needed: int,
        *,
        guidance: Guidance | None = None,
        wanted: bool = True,
        grow: bool = True,
        min_capacity: int = 0,
    ) -> Lease:
        """Decide `request`'s use of the cache: continue an idle entry that holds the start of
        `prompt` (lend), else take an idle generator that holds nothing or would be evicted
        anyway (recycle), else have the caller make a new one, kept when the budget can hold
        it (after making room). `needed`: the tokens of room the reply needs; `guidance`: the
        grammar it follows (fitted); `wanted` False: the caller wants no cache (the warm-up);
        `grow` False: a new generator gets exactly `needed` (a batched slot's bytes are what
        it writes), else room to grow (capacity_for); `min_capacity`: the least a new one may
        have (a sliding window)."""
        sampling = request.sampling  # the generator's mode (ipc.Generate.sampling)
        reason: Reason | None = None
        if not self.rewinds:
            reason = "no_rewind"
        elif not (wanted and request.use_cache):
            reason = "declined"
        elif in_unscoped_pool(request.cache_scope) and not self.unscoped:
            # The shared pool (an oracle for what others sent) does not exist then.
            reason = "unscoped_off"
        elif not self.enabled:
            reason = "off"
        elif sampling and request.seed is not None:
            # Its random state would differ from a fresh generator's.
            reason = "seeded"
        capacity = self.capacity_for(needed) if reason is None and grow else needed
        capacity = max(capacity, min_capacity)
        lease = Lease(
            self, request.cache_scope, sampling, guidance, reason or "miss", capacity, True
        )
        if reason is not None:
            return lease
        lent = self.lend(request.cache_scope, sampling, prompt, needed, guidance)
        if lent is not None:
            lease.entry, lease.reused = lent
            lease.fresh, lease.reason = False, "reused"
            return lease
        if self.tiers is not None:
            # A running reply's KV is reserved against the one bound (kv.tiers.Memory), not
            # this budget; nothing kept is emptied for it: idle entries move down instead.
            # Kept whatever its size: shrink() moves it down (compact, disk) or drops it.
            lease.keep = True
            return lease
        evictions = self.evictions
        lease.entry = self.recycle(request.cache_scope, sampling, capacity, needed, guidance)
        if lease.entry is not None:
            lease.fresh = False
            lease.reason = "recycled" if self.evictions > evictions else "spare"
            return lease
        lease.keep = capacity * self.bytes_per_token <= self.budget_bytes
        if lease.keep:
            self.make_room(capacity)
        else:
            lease.reason = "too_big"
        return lease

    def lend(
        self,
        cache_scope: str | None,
        sampling: bool,
        prompt: Sequence[int],
        needed: int,
        guidance: Guidance | None = None,
    ) -> tuple[Entry, int] | None:
        """The idle entry to continue from, and how many leading prompt tokens it already
        holds (at most len(prompt) - 1: at least one token is always appended); None if no
        entry qualifies (see the rules above)."""
        best: tuple[Entry, int] | None = None
        for entry in self.entries:
            if entry.lent or entry.cache_scope != cache_scope or entry.sampling != sampling:
                continue
            if entry.guidance != guidance:
                continue
            if entry.capacity < needed:
                continue
            cached = entry.cached_tokens()
            common = _common_prefix(cached, prompt)
            if not self.exact and common >= entry.prompt_end and len(prompt) > entry.prompt_end:
                # The next turn: the whole earlier prompt, and on into its reply as far as
                # the new prompt repeats it (every token).
                reused = min(common, len(prompt) - 1)
            else:  # whole chunks of what was prefilled: bit for bit
                reused = min(common, entry.exact_end, len(prompt) - 1) // self.chunk * self.chunk
            if reused <= 0:
                continue
            if not (
                not in_unscoped_pool(cache_scope)
                or common >= entry.prompt_end  # its conversation's next turn
                or common >= len(cached)  # nothing of it is lost
                or 2 * reused >= len(prompt)
            ):
                continue  # another conversation's: it would lose its tokens for a short prefix
            if best is None or reused > best[1]:
                best = (entry, reused)
        if best is not None:
            best[0].lent = True
        return best

    def capacity_for(self, needed: int) -> int:
        """The length of a new generator for a request that needs `needed` tokens of room:
        with room to grow when it can be cached, exactly `needed` when it cannot."""
        if not self.enabled or needed * self.bytes_per_token > self.budget_bytes:
            return needed
        room = needed + max(needed // 2, GROWTH_TOKENS)
        room = -(-room // ROUND_TOKENS) * ROUND_TOKENS
        affordable = self.budget_bytes // self.bytes_per_token
        return max(needed, min(room, self.max_length, affordable))

    def make_room(self, capacity: int) -> None:
        """Evict idle entries, least recently used first, until a new generator of
        `capacity` tokens fits in the budget with every other generator (or none is left)."""
        self.shrink(self.budget_bytes - capacity * self.bytes_per_token)

    def limit(self) -> int:
        """The RAM the kept entries may hold now: the budget, and with tiers what the one KV
        bound leaves beside the running replies."""
        if self.room is None:
            return self.budget_bytes
        return min(self.budget_bytes, int(self.room()))

    def shrink(self, limit: int) -> None:
        """Bring the entries' RAM to at most `limit` bytes, least recently used first: with
        tiers, first every idle entry still in its slot moves to compact RAM, then idle
        entries leave RAM for the disk tier; whatever cannot move is dropped."""
        if self.tiers is not None:
            for entry in self._idle_by_age():
                if self.stats().bytes <= limit:
                    return
                self.tiers.compact(entry)
        for entry in self._idle_by_age():
            if self.stats().bytes <= limit:
                return
            if not entry.nbytes:
                continue  # on disk already: no RAM to give
            if self.tiers is None or not self.tiers.spill(entry):
                self._evict(entry)

    def drop(self, entry: Entry) -> None:
        """Drop an entry (the disk tier deleted its file for its own budget)."""
        if entry in self.entries:
            self._evict(entry)

    def recycle(
        self,
        cache_scope: str | None,
        sampling: bool,
        capacity: int,
        needed: int,
        guidance: Guidance | None = None,
    ) -> Entry | None:
        """When a new generator of `capacity` tokens would not fit without evicting, one of the
        idle generators make_room would evict (least recently used first) that has the same
        sampling mode and guidance, and room for `needed` tokens: lent to the caller, emptied
        of its tokens (the caller rewinds it to 0) and moved to `cache_scope`. Reusing it skips
        allocating and zero-filling a whole KV cache (0.75 MiB a token for Phi-3-mini: about
        0.3 s a GiB, several times that where the kernel must first fault the pages in). None
        when nothing has to be evicted or no such generator is among those that would be.
        Before all that, an idle generator holding nothing (the spare, unguided) with the same
        sampling mode and guidance and room is lent as it is."""
        for entry in self._idle_by_age():
            same_mode = entry.sampling == sampling and entry.guidance == guidance
            if entry.spare and same_mode and entry.capacity >= needed:
                entry.lent, entry.spare, entry.cache_scope = True, False, cache_scope
                return entry  # no conversation lost: not an eviction
        wanted = capacity * self.bytes_per_token
        held = self.stats().bytes
        idle = self._idle_by_age()
        for entry in idle:
            if held + wanted <= self.budget_bytes:
                return None  # what is left to evict is not needed: allocate
            same_mode = entry.sampling == sampling and entry.guidance == guidance
            if same_mode and entry.capacity >= needed:
                entry.lent = True
                entry.cache_scope = cache_scope
                entry.kv_len = entry.prompt_end = entry.exact_end = 0
                self.evictions += 1  # its conversation is gone
                return entry
            held -= entry.nbytes
        return None

    def spare_capacity(self, needed: int, min_capacity: int = 0) -> int:
        """The length of the spare for `needed` tokens of room (see "A spare" above); 0 when
        the cache is off or cannot hold it."""
        capacity = max(self.capacity_for(min(needed, self.max_length)), min_capacity)
        if not self.enabled or capacity * self.bytes_per_token > self.budget_bytes:
            return 0
        return capacity

    def keep_spare(self, generator: Any, params: Any, capacity: int) -> Entry:
        """Keep an idle generator that holds nothing (made while loading)."""
        entry = Entry(generator, params, capacity, None, False, capacity * self.bytes_per_token)
        entry.spare = True
        self.adopt(entry)
        self.give_back(entry, reusable=True)
        return entry

    def keep(self, entry: Entry) -> None:
        """Keep an idle entry found outside this process's life (the disk tier's files)."""
        entry.lent = False
        entry.last_used = next(self._clock)
        self.entries.append(entry)

    def adopt(self, entry: Entry) -> None:
        """Start keeping the books of a new generator (lent to the request that made it)."""
        entry.lent = True
        self.entries.append(entry)

    # -- returning ---------------------------------------------------------------------------

    def give_back(self, entry: Entry, reusable: bool) -> None:
        """The request is over. A reusable entry stays, unless the budget cannot hold it; a
        failed one is dropped. Idle entries that the returned one makes useless are dropped
        too: same scope and mode, no more room, and their whole last prompt at the start of the
        returned one (an earlier state of the same conversation: whatever would continue them
        continues the returned one at least as far)."""
        if entry not in self.entries:
            return
        entry.lent = False
        entry.last_used = next(self._clock)
        if self.tiers is not None:
            self.tiers.account(entry)  # its slot's bytes are the cache's again
        if not reusable or not self.enabled:
            self._evict(entry, counted=False)
            return
        tokens = entry.cached_tokens()
        for other in [e for e in self.entries if e is not entry and not e.lent]:
            same_mode = other.sampling == entry.sampling and other.guidance == entry.guidance
            if other.cache_scope == entry.cache_scope and same_mode:
                held = other.cached_tokens()[: other.prompt_end]
                if other.capacity <= entry.capacity and tokens[: len(held)] == held:
                    self._evict(other, counted=False)
        self.shrink(self.limit())

    def evict_oldest_idle(self) -> bool:
        """Evict the least recently used idle entry (to free what it holds); False if none."""
        idle = self._idle_by_age()
        if idle:
            self._evict(idle[0])
        return bool(idle)

    def _idle_by_age(self) -> list[Entry]:
        """The idle entries in eviction order: least recently used first."""
        return sorted((e for e in self.entries if not e.lent), key=lambda e: e.last_used)

    def _evict(self, entry: Entry, counted: bool = True) -> None:
        self.entries.remove(entry)
        if counted:
            self.evictions += 1
        if self.tiers is not None:
            self.tiers.forget(entry)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
