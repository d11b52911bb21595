"""The next prompt's KV pages mapped while the worker is idle (batched path).

A new chat reads its prompt into a free KV slot, and a free slot has no pages: the pool gives
a freed slot's pages back (KvPool.free: the bound is about resident memory) and maps none
ahead (MAP_NORESERVE). So the model call that read a prompt also took a page fault for every
4 KiB of K/V it wrote, on the model's own threads: a 130-token prompt on Phi-3-mini's shapes
writes 98 MiB of K/V, about 26,700 faults, and the worker spent 0.25 to 0.46 s of CPU in the
kernel per read where the bare engine, whose buffers stay mapped, spent 0.00 to 0.05 s (AMD
EPYC, 2 vCPUs; docs/benchmarks/hops.md, issue 45).

So when the worker has nothing else to do (after kv.idle's room and the shared prefix written
ahead), `WarmPages.step` maps the pages of the slot the next new chat (or the next conversation
restored from compact RAM or disk, which takes a free slot the same way) will take, for as many
positions as the longest prompt of the last RECENT_PROMPTS that took a free slot,
PIECE_TOKENS positions a step (Linux's MADV_POPULATE_WRITE: the pages are mapped and what they
hold is unchanged, so a slot holding a shared prefix written ahead is warmed as safely as an
empty one). When a request starts, `settle` gives back what it does not use: the pages past
the reservation of the reply that took the slot, or all of them when the slot stayed free.

Memory: only while the kept conversations leave room for those pages within the bound. The
pages are not booked (the books would then make kv.idle free that much more room): they are
resident beside the books from the idle step that maps them to the next start, which takes
them into its reservation or gives them back. Where the kernel cannot populate (before Linux
5.14), nothing is warmed and prompts fault as before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from sidecar.model.kv.idle import IdleRoom
    from sidecar.model.kv.prompt_cache import PromptCache

PIECE_TOKENS = 64  # positions mapped per idle step (Phi-3-mini: 48 MiB, about 12,300 pages)
RECENT_PROMPTS = 8  # the prompts written into a free slot whose longest sets what is mapped


class Host(Protocol):
    """What warming needs of the batched path (batch.scheduler.BatchScheduler)."""

    pool: Any  # batch.decoder's KV pool
    cache: PromptCache
    idle: IdleRoom

    @property
    def busy(self) -> bool: ...

    def slots_held(self) -> Sequence[Any]: ...

    def room(self) -> int: ...

    def next_new_slot(self) -> int | None: ...


class WarmPages:
    def __init__(self, host: Host) -> None:
        self._host = host
        self.slot: int | None = None  # the slot being warmed
        self.warmed = 0  # its first positions mapped
        self.pieces = 0  # idle steps that mapped something, since start
        self.supported = True  # False once the kernel refused
        self._recent: deque[int] = deque(maxlen=RECENT_PROMPTS)

    def saw_prompt(self, tokens: int) -> None:
        """A request's prompt of `tokens` is being written into a free slot (a new chat's, or
        a conversation restored from compact RAM or disk and continued)."""
        self._recent.append(tokens)

    @property
    def target(self) -> int:
        """The positions mapped ahead: the longest recent prompt written into a free slot;
        0 while idle work is off (IdleRoom.headroom_tokens 0)."""
        if not self._host.idle.headroom_tokens:
            return 0
        return min(max(self._recent, default=0), self._host.pool.length)

    def step(self) -> bool:
        """Map one more piece of the slot the next prompt is written into; False when there
        is nothing to do."""
        host = self._host
        if host.busy or not self.supported:
            return False
        target = self.target
        slot = host.next_new_slot()
        if not target or slot is None:
            return False
        if slot != self.slot:  # the next prompt's slot changed (a lower one was freed)
            self._give_back()
            self.slot, self.warmed = slot, 0
        pool = host.pool
        end = min(target, self.warmed + PIECE_TOKENS)
        if end <= self.warmed:
            return False
        if host.cache.stats().bytes + end * pool.bytes_per_token > host.room():
            return False
        if not pool.populate(slot, self.warmed, end):
            self.supported = False
            return False
        self.warmed = end
        self.pieces += 1
        return True

    def settle(self, keep_tokens: int) -> None:
        """A request has taken its slot: the warmed slot keeps the pages of its first
        `keep_tokens` positions if that request took it (what it reserved), none otherwise."""
        slot, warmed = self.slot, self.warmed
        if slot is None:
            return
        if self._host.slots_held()[slot] is None:
            self._give_back()
        elif warmed > keep_tokens:
            self._host.pool.trim(slot, keep_tokens)
        self.slot, self.warmed = None, 0

    def _give_back(self) -> None:
        if self.slot is not None and self._host.slots_held()[self.slot] is None:
            self._host.pool.free(self.slot)
        self.slot, self.warmed = None, 0
