"""Room for a new chat, made while the worker is idle (batched path).

A new chat needs a KV slot and its reservation of the one bound (kv.tiers.Memory). When the
cache holds idle conversations in every slot, or their RAM leaves the bound no room for one more
reply, the new chat's start made that room on its own path: it compacted (kv/compact.py) the
least recently used idle conversation, seconds for a long one on a CPU, before its first token.
So when the worker has no reply to run (worker.Scheduler), it asks `IdleRoom.step` for one
small piece of that work at a time: it encodes PIECE_TOKENS more positions of the least recently
used idle conversation still in a slot, and once the whole conversation is encoded frees its
slot, exactly as the cache would have compacted it; the worker reads its pipe between pieces.

It makes only the room one new chat needs (a free slot, and the reservation the largest of the
last few new chats made, at most `headroom_tokens`: the engine's default reply and a short
prompt), oldest first, the same conversations the new chat's start would have compacted, and
nothing when there is room (nor before any new chat was seen).

The trade: a conversation compacted early that comes back before any new chat needed its room
is restored from compact RAM (a copy, int8 by default: not bit for bit the slot it left) where
it would have continued in its slot; with KV_COMPACT=fp32 or PROMPT_CACHE_EXACT=true the copy is
lossless and replies are the same. A user who comes back while their conversation is being
encoded waits for no encoding at all: the conversation is still in its slot and continues
there; the part already encoded is kept as far as the new turn reuses it.

Room for a returning user, too: a user whose conversation is on disk needs room in RAM for its
compact copy, read back, and for the reply's reservation; without idle work their start wrote
another conversation to disk on their path first (one such spill at every start of turns 4
and 5 of the users-turns bench: 0.32-0.40 s at the median, AMD EPYC). So, with the disk tier
on and once a returning user needed such room (`saw_return`: the largest of the last few
returns sets the room kept), idle work then moves the conversations that start would have
moved, oldest first, the same way: one still in a slot is compacted (PIECE_TOKENS at a time),
one in compact RAM is written to its file PIECE_BYTES at a time (kv.disk.Writing) and its RAM
freed with the last piece. The trade is the same: a conversation written out early whose user
comes back first is restored from disk where it would have been from compact RAM; and a user
who comes back while their conversation is being written waits for no write at all: the part
written is dropped and the conversation is restored from compact RAM (KvTiers.lend).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from sidecar.model.kv import compact as kv_compact

if TYPE_CHECKING:
    from sidecar.model.kv.prompt_cache import Entry, PromptCache
    from sidecar.model.kv.tiers import KvTiers


class Host(Protocol):
    """What idle work needs of the batched path (batch.scheduler.BatchScheduler, which holds
    an IdleRoom: a protocol, not an import, keeps the two modules out of a cycle)."""

    tiers: KvTiers
    pool: Any  # batch.decoder's KV pool
    cache: PromptCache

    @property
    def busy(self) -> bool: ...

    def slots_held(self) -> Sequence[Any]: ...

    def room(self) -> int: ...


PIECE_TOKENS = 64  # positions encoded per idle step (Phi-3-mini: 48 MiB of fp32 K/V)
PIECE_BYTES = 16 * 2**20  # of a file written per idle step (a few ms into the page cache)
RECENT_NEW_CHATS = 8  # the new chats whose largest reservation sets the room kept
RECENT_RETURNS = 8  # the returning users whose largest needs set the room kept for them


class IdleRoom:
    def __init__(self, scheduler: Host, headroom_tokens: int = 0) -> None:
        self._scheduler = scheduler
        self.headroom_tokens = headroom_tokens  # 0: off (until the engine sets it)
        self.piece_tokens = PIECE_TOKENS
        self.piece_bytes = PIECE_BYTES
        self.pieces = 0  # idle steps that encoded or wrote something, since start
        self.written_pieces = 0  # of them, the ones that wrote a piece of a file
        self._recent: deque[int] = deque(maxlen=RECENT_NEW_CHATS)
        self._returns: deque[tuple[int, int]] = deque(maxlen=RECENT_RETURNS)

    def saw_new_chat(self, tokens: int) -> None:
        """A new chat (nothing of its scope reused) reserved `tokens` of KV."""
        self._recent.append(tokens)

    def saw_return(self, reserved: int, incoming: int) -> None:
        """A returning user's start reserved `reserved` bytes of KV and needed `incoming`
        bytes of RAM for its conversation's compact copy read from disk (0: none)."""
        self._returns.append((reserved, incoming))

    @property
    def headroom(self) -> int:
        """The tokens of room kept for the next new chat."""
        return min(self.headroom_tokens, max(self._recent, default=0))

    def step(self) -> bool:
        """One piece of the room the next new chat, then the next returning user, needs;
        False when there is nothing to do."""
        entry = self._next()
        if entry is None:
            entry = self._next_for_return()
        if entry is None:
            return False
        if entry.generator.slot is not None:
            self._compact_piece(entry)
        elif self._scheduler.tiers.spill_piece(entry, self.piece_bytes):
            self.written_pieces += 1
        else:
            return False
        self.pieces += 1
        return True

    def _compact_piece(self, entry: Entry) -> None:
        """Encode one piece of an idle conversation in a slot; the last frees its slot."""
        tiers = self._scheduler.tiers
        holder = entry.generator
        kv = holder.holding.compact
        valid = kv is not None and kv.encoding == tiers.encoding and kv.tokens <= holder.kv_len
        done = kv.tokens if kv is not None and valid else 0
        if holder.kv_len - done <= self.piece_tokens:
            tiers.compact(entry)  # the rest, and the slot is freed
        else:
            assert tiers.encoding is not None
            end = done + self.piece_tokens
            more = kv_compact.encode(self._scheduler.pool, holder.index, done, end, tiers.encoding)
            if kv is not None and valid:
                kv.extend(more)
            else:
                holder.holding.compact = more
            tiers.account(entry)

    def _next_for_return(self) -> Entry | None:
        """The conversation a returning user's start would move down first (shrink's order:
        the oldest idle one in a slot, else the oldest in compact RAM), if the kept
        conversations' RAM is over what such a start leaves them."""
        scheduler = self._scheduler
        tiers = scheduler.tiers
        disk = tiers.disk
        if not self._returns or disk is None or not disk.enabled or tiers.encoding is None:
            return None
        if scheduler.busy:
            return None
        reserved = max(r for r, _ in self._returns)
        incoming = max(i for _, i in self._returns)
        cache = scheduler.cache
        limit = min(cache.budget_bytes, scheduler.room() - reserved) - incoming
        if cache.stats().bytes <= limit:
            return None
        candidates = [e for e in _idle_in_slots(cache) if e.nbytes] or [
            e for e in cache.entries if not e.lent and e.nbytes and e.generator.slot is None
        ]
        return min(candidates, key=lambda e: e.last_used) if candidates else None

    def _next(self) -> Entry | None:
        """The least recently used idle conversation in a slot, if a new chat would need its
        room: no free slot, or the kept conversations' RAM over what a new reply leaves."""
        scheduler = self._scheduler
        if not self.headroom or scheduler.tiers.encoding is None or scheduler.busy:
            return None
        cache = scheduler.cache
        idle = _idle_in_slots(cache)
        if not idle:
            return None
        free_slot = any(holder is None for holder in scheduler.slots_held())
        headroom = self.headroom * scheduler.pool.bytes_per_token
        limit = min(cache.budget_bytes, scheduler.room() - headroom)
        if free_slot and cache.stats().bytes <= limit:
            return None
        return min(idle, key=lambda e: e.last_used)


def _idle_in_slots(cache: PromptCache) -> list[Entry]:
    """The idle conversations that hold positions in a slot."""
    return [
        e
        for e in cache.entries
        if not e.lent and e.generator.slot is not None and e.generator.kv_len > 0
    ]
