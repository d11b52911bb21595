"""Fair (FIFO) admission: a bounded number of generations run, a bounded number wait.

A slot is held from admission until the model worker reports the generation over (not until
the client has read the reply), so the worker never has more than MAX_CONCURRENCY generations.
"""

from __future__ import annotations

import asyncio
from collections import deque


class QueueFull(Exception):
    pass


class Admission:
    def __init__(self, slots: int, queue_size: int) -> None:
        self._slots = slots
        self._free = slots
        self._queue_size = queue_size
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def active(self) -> int:
        return self._slots - self._free

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    def try_acquire(self) -> bool:
        """Take a free slot if nobody is waiting for one (so nobody jumps the queue)."""
        if self._free > 0 and self.waiting == 0:
            self._free -= 1
            return True
        return False

    async def acquire(self) -> None:
        """Wait in line for a slot; QueueFull at once when the line is full."""
        if self.try_acquire():
            return
        if self.waiting >= self._queue_size:
            raise QueueFull
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot was handed over just as we gave up: pass it on
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1
