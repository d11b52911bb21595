"""Where and when the encoder computes, so that it never starves a chat.

- **Threads of its own, at a lower CPU priority.** `threads` daemon threads in the web process
  each run whole model calls (one intra-op thread: onnxruntime computes on the calling thread),
  and each lowers its own Linux nice value by `nice` first. The chat's model worker keeps nice
  0, so when both want a core the kernel gives the chat most of it (nice 10 weighs 110 against
  nice 0's 1024: about 90 %), and when no chat runs the encoder has every core. No polling of
  the chat's state, no pauses: the kernel's scheduler does the yielding, within its time slice.
- **Batches bounded in padded tokens** (`batch_tokens`): a request's inputs are sorted by
  length (less padding) and cut into batches of at most that many tokens, padding included, so
  one model call is short and a query never waits long for a free thread.
- **Queries before bulk, bulk round robin.** A request that fits one batch goes before every
  request of several (an index run); batches of several bulk requests alternate (the key is
  the batch's position in its request), so two index runs progress together.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import threading
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sidecar.embeddings.encoder import Encoder

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger("sidecar.embeddings")


@dataclass
class Job:
    """One request's inputs; `future` gets the vectors in input order."""

    vectors: np.ndarray
    batches_left: int
    future: Future[np.ndarray] = field(default_factory=Future)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def done_batch(self) -> None:
        with self.lock:
            self.batches_left -= 1
            last = self.batches_left == 0
        if last:
            with contextlib.suppress(InvalidStateError):  # cancelled meanwhile: nobody waits
                self.future.set_result(self.vectors)


@dataclass(order=True)
class _Item:
    key: tuple[int, int, int]
    job: Job | None = field(compare=False)  # None: a thread's signal to stop
    rows: list[int] = field(compare=False, default_factory=list)
    ids: list[list[int]] = field(compare=False, default_factory=list)


class EncoderPool:
    def __init__(self, encoder: Encoder, *, threads: int, nice: int, batch_tokens: int) -> None:
        self.encoder = encoder
        self.nice = nice
        self.batch_tokens = batch_tokens
        self._queue: queue.PriorityQueue[_Item] = queue.PriorityQueue()
        self._order = itertools.count()
        self._threads = [
            threading.Thread(target=self._run, name=f"encoder-{n}", daemon=True)
            for n in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, inputs: list[list[int]]) -> Future[np.ndarray]:
        """Queue one request's token ids (each within the encoder's limit, none empty)."""
        import numpy as np

        batches = self.batches(inputs)
        job = Job(np.empty((len(inputs), self.encoder.spec.dimensions), np.float32), len(batches))
        bulk = int(len(batches) > 1)
        order = next(self._order)
        for position, rows in enumerate(batches):
            key = (bulk, position if bulk else 0, order)
            self._queue.put(_Item(key, job, rows, [inputs[r] for r in rows]))
        return job.future

    def batches(self, inputs: list[list[int]]) -> list[list[int]]:
        """Input positions in batches of at most `batch_tokens` padded tokens (at least one
        input each), shortest inputs first."""
        batches: list[list[int]] = []
        current: list[int] = []
        for row in sorted(range(len(inputs)), key=lambda r: len(inputs[r])):
            # sorted: this input is the batch's longest, so the padded size is len x count
            if current and len(inputs[row]) * (len(current) + 1) > self.batch_tokens:
                batches.append(current)
                current = []
            current.append(row)
        if current:
            batches.append(current)
        return batches

    def stop(self) -> None:
        for _ in self._threads:
            self._queue.put(_Item((2, 0, 0), None))

    def _run(self) -> None:
        _lower_priority(self.nice)
        while True:
            item = self._queue.get()
            job = item.job
            if job is None:
                return
            if job.future.done():  # cancelled (the client left) or already failed
                continue
            try:
                vectors = self.encoder.encode(item.ids)
            except Exception as error:
                log.exception("embedding batch failed", extra={"fields": {"inputs": len(item.ids)}})
                with contextlib.suppress(InvalidStateError):
                    job.future.set_exception(error)
                continue
            job.vectors[item.rows] = vectors
            job.done_batch()


def _lower_priority(nice: int) -> None:
    """This thread's nice value raised by `nice` (Linux: a thread's own priority)."""
    if nice <= 0:
        return
    tid = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + nice))
    except OSError as error:
        log.warning("encoder priority unchanged", extra={"fields": {"error": str(error)}})
