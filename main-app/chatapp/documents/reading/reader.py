"""Reading a document in a process of its own, within a time and a memory budget.

A `Reader` keeps one reader process (`read_child.py`, its address space limited to
`memory_mb`) for one indexer thread, and sends it a `Job` per document: the bytes, and what
the reading needs (the limits, the tokenizer, the passage size). `read(job, give_up)` waits for
the `Answer`, looking every `POLL_S`:

- past `timeout_s` (DOCUMENT_READ_TIMEOUT) it kills the process: `too_slow`;
- when `give_up()` says so (the document was cancelled or deleted, its claim was taken, or a
  quick lane's time is up) it kills the process at once: `stopped`, whatever was being read;
- a process that dies by itself: `too_large` when the kernel killed it (the OOM killer's
  SIGKILL, an allocator's abort on a full address space), else `broken`; a file that needs
  more than the budget mostly raises MemoryError in the reader, answered as `too_large`.

A killed or exited process is replaced at the next job (a new one starts in about a tenth of a
second), so small documents read one after another pay for one start, not one each.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from chatapp.documents.reading.blocks import Refused
from chatapp.documents.reading.chunker import Chunk as Passage
from chatapp.documents.reading.chunker import chunk
from chatapp.documents.reading.formats import Limits, read
from chatapp.documents.reading.tokens import TokenCounter, counter_for

# The name its log lines have always carried, not the module's path.
log = logging.getLogger("chatapp.documents.reader")

POLL_S = 0.1
# The reader's environment: one malloc arena and one thread in each library that would start
# more, so its address space is what it holds, not reservations per thread.
_CHILD_ENV = {
    "MALLOC_ARENA_MAX": "1",
    "RAYON_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
}
_KILLED_FOR_MEMORY = {signal.SIGKILL, signal.SIGABRT}


@dataclass(frozen=True)
class Job:
    data: bytes
    name: str
    mime: str | None
    limits: Limits
    tokenizer: str | None  # EMBED_TOKENIZER: the encoder's tokenizer, else the byte bound
    max_tokens: int  # the most tokens of a passage


@dataclass(frozen=True)
class Answer:
    """What reading a document came to: its passages, or why not."""

    passages: list[Passage] | None = None  # read: every passage, in order
    code: str | None = None  # refused: a blocks.REFUSALS code
    message: str = ""
    stopped: bool = False  # given up on (give_up): nothing is known of the file
    peak_mb: float = 0.0  # the reader process's largest resident memory so far
    seconds: float = 0.0


def answer(job: Job, memory_mb: int, counters: dict[str | None, TokenCounter]) -> Answer:
    """Read `job` (in the reader process): its passages, or its refusal."""
    began = time.monotonic()
    try:
        _, blocks = read(job.data, job.name, job.mime, job.limits)
        counter = counters.setdefault(job.tokenizer, counter_for(job.tokenizer))
        result = Answer(passages=chunk(blocks, counter, job.max_tokens))
    except Refused as refused:
        result = Answer(code=refused.code, message=refused.message)
    except MemoryError:
        result = too_large(memory_mb)
    except Exception:  # a parser's own bug: this file is not read, the next ones are
        log.exception("reading failed", extra={"fields": {"name_chars": len(job.name)}})
        result = Answer(code="broken", message="The file could not be read.")
    return dataclasses.replace(
        result, peak_mb=peak_mb(), seconds=round(time.monotonic() - began, 3)
    )


def too_large(memory_mb: int, peak: float | None = None) -> Answer:
    message = f"Reading the file needed more than {memory_mb} MB (DOCUMENT_READ_MEMORY_MB)."
    return Answer(code="too_large", message=message, peak_mb=peak_mb() if peak is None else peak)


def peak_mb() -> float:
    """This process's largest resident memory since it started (VmHWM: getrusage's maxrss
    would include the parent's before the exec)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


class Reader:
    def __init__(self, memory_mb: int, timeout_s: float) -> None:
        self.memory_mb = memory_mb
        self.timeout_s = timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._outbox: Connection | None = None
        self._inbox: Connection | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def read(self, job: Job, give_up: Callable[[], bool]) -> Answer:
        began = time.monotonic()
        for _ in range(2):  # a process that had just exited, fresh (read_child's recycling)
            inbox = self._send(job)
            while not inbox.poll(POLL_S):
                if give_up():
                    self.close()
                    return Answer(stopped=True)
                if time.monotonic() - began > self.timeout_s:
                    self.close()
                    return Answer(code="too_slow", message=self._too_slow())
                if self._process is not None and self._process.poll() is not None:
                    break
            try:
                received: Answer = inbox.recv()
                return received
            except (EOFError, OSError):
                if self._process is None or self._process.wait() != 0:
                    return self._died()
                self.close()  # it left cleanly before reading this job: send it again
        return self._died()

    def _send(self, job: Job) -> Connection:
        if self._process is None or self._process.poll() is not None:
            self.close()
            self._start()
        assert self._outbox is not None and self._inbox is not None
        # It may have exited meanwhile: read() then sees its answers end, and starts another.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._outbox.send(job)
        return self._inbox

    def _start(self) -> None:
        job_read, job_write = os.pipe()
        answer_read, answer_write = os.pipe()
        try:  # the package is installed, as for `python -m chatapp.documents`
            self._process = subprocess.Popen(
                [sys.executable, "-m", "chatapp.documents.reading.read_child", str(self.memory_mb)],
                stdin=job_read,
                stdout=answer_write,
                env={**os.environ, **_CHILD_ENV},
            )
        finally:
            os.close(job_read)
            os.close(answer_write)
        self._outbox = Connection(job_write, readable=False)
        self._inbox = Connection(answer_read, writable=False)
        # A Reader dropped without close() still leaves no process behind.
        self._finalizer = weakref.finalize(self, _stop, self._process, self._outbox, self._inbox)

    def _died(self) -> Answer:
        process = self._process
        code = process.wait() if process is not None else None
        self.close()
        if code is not None and code < 0 and -code in _KILLED_FOR_MEMORY:
            log.warning("reader killed", extra={"fields": {"signal": -code}})
            return too_large(self.memory_mb, peak=float(self.memory_mb))
        log.warning("reader exited", extra={"fields": {"exit_code": code}})
        return Answer(code="broken", message="Reading the file stopped its reader.")

    def _too_slow(self) -> str:
        return f"Reading the file took more than {self.timeout_s:g} s (DOCUMENT_READ_TIMEOUT)."

    def close(self) -> None:
        """Kill the reader process, if any (the next job starts another)."""
        if self._finalizer is not None:
            self._finalizer()
        self._finalizer = None
        self._process = self._outbox = self._inbox = None


def _stop(process: subprocess.Popen[bytes], *connections: Connection) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()
    for connection in connections:
        connection.close()
