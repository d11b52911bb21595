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
- **Texts tokenized here too** (`tokenize`), in pieces of at most `TOKENIZE_CHARS` characters
  (at least one text each) queued like batches: the tokenizer's memory is a piece's at a time
  per thread, its CPU is at the encoder's priority, and only requests admitted to the queue
  (service.py) are tokenized at all.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from sidecar.embeddings.encoder import Encoder

if TYPE_CHECKING:
    import numpy as np

    from sidecar.embeddings.encoder import Ids

log = logging.getLogger("sidecar.embeddings")

# Characters tokenized in one call: about 10 MB of the tokenizer's memory (encoder.py).
TOKENIZE_CHARS = 65_536

Result = TypeVar("Result")


@dataclass
class Job(Generic[Result]):
    """One request's work in parts; `future` gets `result` once every part is done."""

    result: Result
    parts_left: int
    future: Future[Result] = field(default_factory=Future)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def done_part(self) -> None:
        with self.lock:
            self.parts_left -= 1
            last = self.parts_left == 0
        if last:
            with contextlib.suppress(InvalidStateError):  # cancelled meanwhile: nobody waits
                self.future.set_result(self.result)


@dataclass(order=True)
class _Item:
    key: tuple[int, int, int]
    job: Job[Any] | None = field(compare=False)  # None: a thread's signal to stop
    work: Callable[[], None] = field(compare=False, default=lambda: None)  # one part


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

    def submit(self, inputs: Sequence[Ids]) -> Future[np.ndarray]:
        """Queue one request's token ids (each within the encoder's limit, none empty)."""
        import numpy as np

        batches = self.batches(inputs)
        vectors = np.empty((len(inputs), self.encoder.spec.dimensions), np.float32)
        job = Job(vectors, len(batches))
        parts = [functools.partial(self._encode, job, rows, inputs) for rows in batches]
        self._put(job, parts)
        return job.future

    def tokenize(self, texts: list[str]) -> Future[list[np.ndarray]]:
        """Queue one request's texts for the tokenizer; the future gets each one's token ids
        (int32 arrays), special tokens included, never cut."""
        pieces: list[list[int]] = [[]]
        size = 0
        for row, text in enumerate(texts):
            if pieces[-1] and size + len(text) > TOKENIZE_CHARS:
                pieces.append([])
                size = 0
            pieces[-1].append(row)
            size += len(text)
        import numpy as np

        nothing = np.empty(0, np.int32)  # each row's until its piece is tokenized
        job = Job([nothing] * len(texts), len(pieces))
        self._put(job, [functools.partial(self._tokenize, job, rows, texts) for rows in pieces])
        return job.future

    def _put(self, job: Job[Any], parts: Sequence[Callable[[], None]]) -> None:
        bulk = int(len(parts) > 1)
        order = next(self._order)
        for position, work in enumerate(parts):
            self._queue.put(_Item((bulk, position if bulk else 0, order), job, work))

    def _encode(self, job: Job[np.ndarray], rows: list[int], inputs: Sequence[Ids]) -> None:
        job.result[rows] = self.encoder.encode([inputs[r] for r in rows])

    def _tokenize(self, job: Job[list[np.ndarray]], rows: list[int], texts: list[str]) -> None:
        arrays = self.encoder.token_arrays([texts[r] for r in rows])
        for row, ids in zip(rows, arrays, strict=True):
            job.result[row] = ids

    def batches(self, inputs: Sequence[Ids]) -> list[list[int]]:
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
        lower_priority(self.nice)
        while True:
            item = self._queue.get()
            job = item.job
            if job is None:
                return
            if job.future.done():  # cancelled (the client left) or already failed
                continue
            try:
                item.work()
            except Exception as error:
                log.exception("embedding batch failed")
                with contextlib.suppress(InvalidStateError):
                    job.future.set_exception(error)
                continue
            job.done_part()


def lower_priority(nice: int, what: str = "encoder") -> None:
    """This thread's nice value raised by `nice` (Linux: a thread's own priority, inherited by
    the threads it makes); the encoder's here, the speech model's (speech/transcriber.py)."""
    if nice <= 0:
        return
    tid = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + nice))
    except OSError as error:
        log.warning(f"{what} priority unchanged", extra={"fields": {"error": str(error)}})
