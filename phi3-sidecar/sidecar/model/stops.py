"""Stop sequences: strings that end a reply where they would begin.

Text arrives a token at a time, and a stop string can span tokens ("<" then "END>"), so text
that could still be the beginning of a stop string is held back until the next piece says
whether it is one. The reply never shows any part of a stop string; held-back text that turns
out not to be one is sent with the next piece, or when the reply ends.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopFilter:
    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(stop for stop in stops if stop)
        self._held = ""

    def __bool__(self) -> bool:
        return bool(self._stops)

    @property
    def holding(self) -> bool:
        """Text is held back: it may yet turn out to begin a stop string."""
        return bool(self._held)

    def feed(self, text: str) -> tuple[str, bool]:
        """The text that may be shown now, and whether a stop string was reached (then the
        text is everything before it, and nothing after it may be shown)."""
        buffer = self._held + text
        found = [i for i in (buffer.find(stop) for stop in self._stops) if i >= 0]
        if found:
            self._held = ""
            return buffer[: min(found)], True
        keep = max((self._prefix_at_end(buffer, stop) for stop in self._stops), default=0)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        """The reply ended otherwise: what was held back is text after all."""
        held, self._held = self._held, ""
        return held

    @staticmethod
    def _prefix_at_end(buffer: str, stop: str) -> int:
        """The length of the longest end of `buffer` that begins `stop` (shorter than it)."""
        for n in range(min(len(stop) - 1, len(buffer)), 0, -1):
            if buffer.endswith(stop[:n]):
                return n
        return 0
