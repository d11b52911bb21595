"""Reading in a process of its own (issue 58): a file over its memory or time budget fails
with its reason and costs the indexer nothing; a reader given up on is killed at once; a
reader whose indexer dies goes with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from chatapp.documents.reading.formats import Limits
from chatapp.documents.reading.reader import Job, Reader

LIMITS = Limits(max_bytes=30_000_000, max_pages=50)
NOTE = Job(b"The kettle boils a litre in three minutes.", "note.txt", None, LIMITS, None, 64)


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead and not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_file_over_the_memory_budget_is_too_large_and_the_next_is_read() -> None:
    reader = Reader(memory_mb=100, timeout_s=60)
    try:
        big = Job(b"The kettle boils a litre. " * 800_000, "big.txt", None, LIMITS, None, 64)
        refused = reader.read(big, give_up=lambda: False)
        assert refused.code == "too_large", refused
        assert "DOCUMENT_READ_MEMORY_MB" in refused.message and "100 MB" in refused.message
        assert refused.passages is None and refused.peak_mb <= 100
        read = reader.read(NOTE, give_up=lambda: False)
        assert read.code is None and read.passages is not None
        assert [p.text for p in read.passages] == ["The kettle boils a litre in three minutes."]
    finally:
        reader.close()


def test_past_its_time_the_reader_is_killed_and_the_file_is_too_slow(slow_docx: bytes) -> None:
    reader = Reader(memory_mb=512, timeout_s=1.0)
    try:
        began = time.monotonic()
        answer = reader.read(Job(slow_docx, "slow.docx", None, LIMITS, None, 64), lambda: False)
        pid = reader.pid
        assert answer.code == "too_slow" and "DOCUMENT_READ_TIMEOUT" in answer.message
        assert time.monotonic() - began < 4  # 1 s, and the process's start
        assert pid is None  # killed, and forgotten: the next job starts another
        assert reader.read(NOTE, lambda: False).passages is not None
    finally:
        reader.close()


def test_a_reader_given_up_on_is_killed_whatever_it_is_reading(slow_docx: bytes) -> None:
    reader = Reader(memory_mb=512, timeout_s=60)
    seen: list[int] = []
    try:
        began = time.monotonic()

        def give_up() -> bool:  # the document was cancelled half a second in
            if reader.pid is not None and not seen:
                seen.append(reader.pid)
            return time.monotonic() - began > 0.5

        answer = reader.read(Job(slow_docx, "slow.docx", None, LIMITS, None, 64), give_up)
        assert answer.stopped and answer.code is None
        assert time.monotonic() - began < 1.5
        assert seen and not alive(seen[0])
    finally:
        reader.close()


def test_a_reader_the_kernel_kills_means_too_large(slow_docx: bytes) -> None:
    """What the OOM killer does to the largest process, now the reader, not the indexer."""
    reader = Reader(memory_mb=512, timeout_s=60)
    try:
        threading.Timer(0.5, lambda: os.kill(reader.pid or 0, signal.SIGKILL)).start()
        answer = reader.read(Job(slow_docx, "slow.docx", None, LIMITS, None, 64), lambda: False)
        assert answer.code == "too_large", answer
    finally:
        reader.close()


PARENT = """
import sys, time
from chatapp.documents.reading.formats import Limits
from chatapp.documents.reading.reader import Job, Reader
reader = Reader(memory_mb=512, timeout_s=60)
data = open(sys.argv[1], "rb").read()
job = Job(data, "slow.docx", None, Limits(30_000_000, 50), None, 64)
reader.read(job, lambda: print(reader.pid, flush=True) or False)
"""


def test_a_reader_dies_with_the_indexer_that_started_it(slow_docx: bytes, tmp_path: Path) -> None:
    """SIGKILL of the indexer (the OOM killer's way) leaves no reader behind."""
    path = tmp_path / "slow.docx"
    path.write_bytes(slow_docx)
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert alive(child)
    parent.kill()
    parent.wait()
    parent.stdout.close()
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)
