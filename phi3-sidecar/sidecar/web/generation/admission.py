"""Fair (FIFO) admission: a bounded number of generations run, a bounded number wait, and with
several models (MODELS_FILE) the generations running are all of one model.

A slot is held from admission until the model worker reports the generation over (not until
the client has read the reply), so a worker never has more than MAX_CONCURRENCY generations.
On a plan whose CPUs hold one decode at a time, two models decoding at once would each go at
half speed or worse (their worker processes share the cores): so the first in line waits until
the other model's generations are over, and those behind it wait behind it (none jumps the
line, so no model starves another).
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
        self._waiters: deque[tuple[asyncio.Future[None], str]] = deque()
        self._model: str | None = None  # whose generations hold the slots taken

    @property
    def active(self) -> int:
        return self._slots - self._free

    @property
    def waiting(self) -> int:
        return sum(1 for w, _ in self._waiters if not w.done())

    def _fits(self, model: str) -> bool:
        return self._free > 0 and (self.active == 0 or self._model == model)

    def _take(self, model: str) -> None:
        self._free -= 1
        self._model = model

    def try_acquire(self, model: str = "") -> bool:
        """Take a free slot if nobody is waiting for one (so nobody jumps the queue)."""
        if self.waiting == 0 and self._fits(model):
            self._take(model)
            return True
        return False

    async def acquire(self, model: str = "") -> None:
        """Wait in line for a slot; QueueFull at once when the line is full."""
        if self.try_acquire(model):
            return
        if self.waiting >= self._queue_size:
            raise QueueFull
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (waiter, model)
        self._waiters.append(entry)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot was handed over just as we gave up: pass it on
            raise
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)
            self._hand_on()  # one that gave up may have held the line

    def release(self) -> None:
        self._free += 1
        if self.active == 0:
            self._model = None
        self._hand_on()

    def _hand_on(self) -> None:
        """Slots to the first in line while they fit (the same model as those running)."""
        while self._waiters:
            waiter, model = self._waiters[0]
            if waiter.done():
                self._waiters.popleft()
                continue
            if not self._fits(model):
                return
            self._waiters.popleft()
            self._take(model)
            waiter.set_result(None)
