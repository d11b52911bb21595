"""How far the model is in reading a long prompt, as a reply's stream says it (issue 54).

The worker reports a prompt of ipc.READING_REPORT_TOKENS or more when its reading starts and
after each of its calls (ipc.Reading). One call is long (512 tokens of Phi-3-mini on 2 vCPUs:
about 15 s), so between two reports the web process estimates: `read` is the tokens read at
the last report plus the measured rate times the seconds since, never past the end of the call
under way (read + call_tokens) and never less than it said before. `seconds_left` is the
tokens left over the same rate (None until the worker has measured one). A stream writes an
event at each report and every PROGRESS_INTERVAL_S between them, until the first token.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from sidecar import ipc


@dataclass(frozen=True)
class ProgressEvent:
    read: int
    total: int
    seconds_left: float | None

    def as_json(self) -> dict[str, int | float | None]:
        return {"read": self.read, "total": self.total, "seconds_left": self.seconds_left}


class ReadingProgress:
    """The latest report of a prompt being read, and the estimates made from it."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._report: ipc.Reading | None = None
        self._shown = 0  # the largest `read` written: never less after it
        self._written_at = 0.0
        self.done = False  # all read (or the first token came): nothing more to say

    @property
    def active(self) -> bool:
        return self._report is not None and not self.done

    def report(self, reading: ipc.Reading) -> ProgressEvent:
        """A report from the worker: the event to write now."""
        self._report = reading
        if reading.read >= reading.total:
            self.done = True
        return self._event(time.monotonic())

    def due(self) -> float | None:
        """When the next estimate is due (time.monotonic()); None: none is."""
        return self._written_at + self.interval_s if self.active else None

    def tick(self) -> ProgressEvent:
        """The estimate to write now, between two reports."""
        return self._event(time.monotonic())

    def _event(self, now: float) -> ProgressEvent:
        report = self._report
        assert report is not None
        read = report.read
        if report.rate and report.call_tokens:
            ahead = report.rate * max(0.0, now - report.at)
            read += min(int(ahead), report.call_tokens)
        read = self._shown = max(self._shown, min(read, report.total))
        seconds_left = None
        if report.rate:
            seconds_left = math.ceil((report.total - read) / report.rate * 10) / 10
        self._written_at = now
        return ProgressEvent(read, report.total, seconds_left)
