"""The token ids of the text pieces of recent prompts, kept so that a conversation's next turn
encodes only what it adds (issue 46: a `previous_response_id` continuation of a 1,000-message
conversation re-tokenized all of it, 9.7 s of worker time for a 200-byte turn).

The prompt builder encodes a rendered prompt piece by piece: the text between the template's
special tokens, each piece alone (prompt/builder.py), so a prompt's ids are its pieces' ids joined
with the specials'. A conversation's next turn renders the same pieces again (each earlier
message, the template's text around it) and a few new ones; their ids are kept here under the
piece's text, so the same text always gets the same ids, and only the new pieces are read by
the tokenizer. Nothing is approximated: a kept piece's ids are what encoding it gave.

Bounded by KEPT_TOKENS (ids, plus the pieces' characters counted as a quarter of an id each);
the least recently used go first. Pieces shorter than MIN_CHARS are not worth a lookup's
bookkeeping and are encoded each time.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable

KEPT_TOKENS = 2_000_000  # about 8 MB of ids and 8 MB of text at most
MIN_CHARS = 64


class PieceMemo:
    def __init__(
        self, encode: Callable[[str], list[int]], budget_tokens: int = KEPT_TOKENS
    ) -> None:
        self._encode = encode  # a piece's ids, as the builder takes them (its BOS stripped)
        self._budget = budget_tokens
        self._kept: OrderedDict[str, array[int]] = OrderedDict()
        self._size = 0
        self.reused_chars = 0  # characters whose ids came from here, since start

    def ids(self, piece: str) -> list[int]:
        if len(piece) < MIN_CHARS:
            return self._encode(piece)
        kept = self._kept.get(piece)
        if kept is not None:
            self._kept.move_to_end(piece)
            self.reused_chars += len(piece)
            return kept.tolist()
        ids = self._encode(piece)
        size = _size(piece, len(ids))
        if size <= self._budget:
            self._kept[piece] = array("i", ids)
            self._size += size
            while self._size > self._budget:
                dropped, dropped_ids = self._kept.popitem(last=False)
                self._size -= _size(dropped, len(dropped_ids))
        return ids


def _size(piece: str, ids: int) -> int:
    return ids + len(piece) // 4
