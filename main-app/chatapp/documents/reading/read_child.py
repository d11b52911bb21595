"""The reader process: a file's bytes in, its passages out, within the memory it was given.

`python -m chatapp.documents.reading.read_child MEMORY_MB`, started by `reader.Reader` for one
indexer thread and kept for the documents after: each `reader.Job` it receives on stdin (pickled,
`multiprocessing.connection` frames) is answered with a `reader.Answer` on stdout, until stdin
closes. Reading is the untrusted work (parsers of hostile files, the cutter), so it happens
here and not in the indexer:

- its address space is limited first (RLIMIT_AS, soft and hard: it cannot raise it again),
  so a file that needs more memory raises MemoryError here, answered as `too_large`, and the
  indexer's own memory never grows with a file;
- it dies with the indexer thread that started it (Linux's PR_SET_PDEATHSIG): an indexer
  killed by the OOM killer leaves no reader behind;
- time is the parent's to bound: it kills this process past the document's time budget, or
  when the document is cancelled or deleted, whatever is being read at that moment.

It imports the readers and the cutter only: no database, no network.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
from typing import Any

MB = 1024 * 1024
_PR_SET_PDEATHSIG = 1
# Past this share of its budget still held after a file, the process exits and the next
# document gets a fresh one: a Python heap does not shrink back. What the encoder's tokenizer
# holds is not counted: every file needs it (XLM-R's, the multilingual encoder's 250,002
# pieces, holds about 280 MB; all-MiniLM-L6-v2's 15), and a fresh process would read it again.
RECYCLE_SHARE = 0.5


def main(argv: list[str]) -> None:
    memory_mb = int(argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb * MB, memory_mb * MB))
    _die_with_parent()
    from multiprocessing.connection import Connection

    # The answers' channel is a copy of stdout; stdout itself becomes stderr, so a library that
    # prints cannot corrupt a frame.
    inbox = Connection(os.dup(0), writable=False)
    outbox = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)
    from chatapp.documents.reading.reader import answer, too_large
    from chatapp.documents.reading.tokens import TokenCounter
    from chatapp.observability.logs import configure_logging

    configure_logging(os.environ.get("LOG_LEVEL", "info") or "info")
    counters: dict[str | None, TokenCounter] = {}  # a tokenizer read once, for every file
    kept = 0  # the resident bytes the tokenizers took when they were read
    while True:
        try:
            job = inbox.recv()
        except EOFError:  # the indexer closed the channel: nothing more to read
            return
        except MemoryError:  # the file itself does not fit beside what reading needs
            outbox.send(too_large(memory_mb))
            return  # the channel may hold the rest of that job: a fresh process reads on
        if job.tokenizer not in counters:
            kept += _read_tokenizer(counters, job.tokenizer)
        result = answer(job, memory_mb, counters)
        del job
        try:
            outbox.send(result)
        except MemoryError:  # the passages fit, their pickle did not
            del result
            outbox.send(too_large(memory_mb))
        if _resident() - kept > RECYCLE_SHARE * memory_mb * MB:
            return


def _read_tokenizer(counters: dict[str | None, Any], tokenizer: str | None) -> int:
    """Read the job's tokenizer before its file (a count reads it); the resident bytes it took.
    One that does not fit is left to the reading, which answers `too_large`."""
    from chatapp.documents.reading.tokens import counter_for

    before = _resident()
    try:
        counter = counter_for(tokenizer)
        counter.count("")
    except MemoryError:
        return 0
    counters[tokenizer] = counter
    return max(0, _resident() - before)


def _die_with_parent() -> None:
    """SIGKILL when the thread that started this process ends (Linux; elsewhere nothing)."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the call took effect
        os._exit(1)


def _resident() -> int:
    """This process's resident memory now, in bytes (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


if __name__ == "__main__":
    main(sys.argv)
