"""The estimate between two of the worker's reports (web/generation/progress.py): it moves at
the measured rate, never past the end of the call under way, never backwards."""

from __future__ import annotations

import time

from sidecar import ipc
from sidecar.web.generation.progress import ReadingProgress


def reading(read: int, call: int, rate: float | None, ago: float) -> ipc.Reading:
    return ipc.Reading(1, read, 1000, call, rate, time.monotonic() - ago)


def test_estimate_moves_within_the_call_and_stops_at_its_end() -> None:
    progress = ReadingProgress(1.0)
    assert progress.report(reading(0, 512, 100.0, ago=2.0)).read == 200
    assert progress.tick().read == 200  # at the same rate a moment later: about the same
    event = progress.report(reading(0, 512, 100.0, ago=60.0))
    assert event.read == 512  # never past the call's end
    assert event.seconds_left == 4.9  # (1000 - 512) / 100, rounded up


def test_estimate_never_goes_back() -> None:
    progress = ReadingProgress(1.0)
    progress.report(reading(0, 512, 100.0, ago=4.0))
    assert progress.report(reading(300, 212, 50.0, ago=0.0)).read == 400


def test_no_rate_no_estimate() -> None:
    progress = ReadingProgress(1.0)
    event = progress.report(reading(0, 512, None, ago=5.0))
    assert (event.read, event.seconds_left) == (0, None)
    assert progress.due() is not None
    progress.report(reading(1000, 0, 80.0, ago=0.0))
    assert progress.due() is None  # all read
