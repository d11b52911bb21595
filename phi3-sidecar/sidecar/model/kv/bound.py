"""The one bound on all KV memory (KV_MEMORY_MB) and what the running replies reserved of it.

Reserved as a reply grows (issue 46), on the batched path: a reply reserves its prompt and at
most GROWTH_TOKENS of its reply when it starts, and GROWTH_TOKENS more each time it has written
what it reserved, never more than its whole length (prompt + max_new_tokens: its `need`).
Reserving the whole length up front let one client asking max_tokens 4096 hold the bound while
it wrote, and everyone who came after waited for it to leave.

What keeps that from ending in a reply that cannot go on (every reply waiting to grow, none
able to) is the banker's rule: a reservation (a start, or a reply's growth) is made only if
the replies can still all finish afterwards, one after another, each growing to its whole
length as the ones before it free theirs (`safe`). So there is always a reply that may grow,
and a reply that may not grow now waits (it is skipped by the step: batch/step.py) until
one that can has finished; it never stops for memory, and it never ends early. The trade:
a reply may pause while others finish (its stream is silent; /v1's keep-alives go on), where
it used to make the others wait before they started. A reply alone always fits (the engine caps
the context to the bound).

On the Generator path (generator/memory.py) a generator allocates its whole length when it is
made, so its reservation is its whole length (reserved == need) and the rule is the old one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Tokens a batched reply reserves beyond its prompt at a time (at most its max_new_tokens)
GROWTH_TOKENS = 256


class NoRoom(Exception):
    """The running replies' reservations leave no room for this one: it waits (worker.py)."""


@dataclass
class Memory:
    """The bound on all KV memory (KV_MEMORY_MB) and what the running replies reserved."""

    bound_bytes: int
    reserved_bytes: int = 0
    waits: int = 0  # requests that had to wait for room, since start
    pauses: int = 0  # times a running reply had to wait to grow, since start
    # Held for what else the bound covers: on the Generator path, the conversation cache's
    # budget (generator/memory.py); the batched path's kept conversations move down instead.
    set_aside: int = 0
    # Each growing reply's (reserved, need) bytes, by its key; a reservation not in here
    # (the Generator path's) is its reply's whole need
    growing: dict[int, tuple[int, int]] = field(default_factory=dict)

    def fits(self, nbytes: int, need: int | None = None) -> bool:
        """Whether a reply that reserves `nbytes` now (and grows to `need`, default `nbytes`)
        may start beside the running ones: a reply alone always may."""
        if not self.reserved_bytes:
            return True
        growing = [*self.growing.values(), (nbytes, need or nbytes)]
        return self._safe(self.reserved_bytes + nbytes, growing)

    def reserve(self, key: int, nbytes: int, need: int) -> None:
        """Book a started reply's first reservation (after `fits`)."""
        self.reserved_bytes += nbytes
        if need > nbytes:
            self.growing[key] = (nbytes, need)

    def grow(self, key: int, nbytes: int) -> bool:
        """Reserve `nbytes` more for a running reply if the replies can all still finish
        (`safe`); False: it must wait for one to end."""
        reserved, need = self.growing[key]
        others = [v for k, v in self.growing.items() if k != key]
        if not self._safe(self.reserved_bytes + nbytes, [*others, (reserved + nbytes, need)]):
            return False
        self.reserved_bytes += nbytes
        if reserved + nbytes < need:
            self.growing[key] = (reserved + nbytes, need)
        else:
            del self.growing[key]
        return True

    def release(self, key: int, nbytes: int) -> None:
        """A reply ended: all it reserved (`nbytes`) is free."""
        self.reserved_bytes -= nbytes
        self.growing.pop(key, None)

    def _safe(self, reserved: int, growing: list[tuple[int, int]]) -> bool:
        """The banker's rule: with `reserved` bytes reserved in all, and these replies still to
        grow (the rest need nothing more), can every reply finish? The one that needs least
        more goes first; each frees what it held when it ends."""
        free = self.bound_bytes - self.set_aside - reserved
        if free < 0:
            return False
        free += reserved - sum(held for held, _ in growing)  # the others finish as they are
        for held, need in sorted(growing, key=lambda pair: pair[1] - pair[0]):
            if need - held > free:
                return False
            free += held
        return True

    def room(self) -> int:
        """What the kept conversations may hold now."""
        return max(0, self.bound_bytes - self.reserved_bytes)

    def stats(self) -> dict[str, int]:
        """What ipc.CacheStats (and so /metrics) says of the bound."""
        return {
            "kv_memory_bytes": self.bound_bytes,
            "kv_reserved_bytes": self.reserved_bytes,
            "kv_waits": self.waits,
            "kv_pauses": self.pauses,
        }
