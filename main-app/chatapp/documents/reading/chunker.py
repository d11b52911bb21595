"""Passages: a document's blocks cut into pieces of at most `max_tokens` encoder tokens.

Each passage keeps the heading path it sits under ("Guide › Install › Linux") and the page it
starts on, so a citation can say where it came from and the encoder reads the section's title
with its text (`Chunk.embedded`, which is what is measured and embedded). Passages break at
every heading and every page; inside a section, whole blocks are packed together while they
fit. A block that does not fit alone is split: a table between rows, its header row repeated
in every part (so tables stay whole whenever they fit in a passage); text between sentences,
then words, then characters.

Sizes are estimated by adding each piece's count (tokenizers count word by word, so sums are
exact for WordPiece and close for BPE) and every passage is then counted whole, exactly; one
over the limit is split again. So no passage exceeds `max_tokens` whatever the tokenizer.

The work is linear in the text: a block, sentence or word longer than `LONG_CHARS` characters
per token of the limit is never counted whole (no passage holds that much text; counting a
20 MB paragraph at once would cost the tokenizer gigabytes), and a word too long for a
passage is cut piece by piece, each piece found by doubling a start that fits and halving
back, so a piece costs about its own length, not the rest of the word's (a 64 KB base64 line
took 133 s when every piece searched the whole rest).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from chatapp.documents.reading.blocks import Block
from chatapp.documents.reading.tokens import TokenCounter

_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+")
_SEPARATOR = "\n\n"
_HEADING_JOIN = " › "
# Characters per token of the limit past which a text is not counted whole, and the longest
# piece a word is cut into: English averages 4 to 5 characters a token, base64 about 3.
LONG_CHARS = 32


@dataclass(frozen=True)
class Chunk:
    ordinal: int  # its place in the document, from 0
    text: str  # the passage as shown and cited
    heading: str  # the heading path it sits under, "" if none
    page: int | None  # the page it starts on (1-based), where the format has pages
    tokens: int  # the encoder's tokens of `embedded`, special tokens included

    @property
    def embedded(self) -> str:
        return embedded(self.heading, self.text)


def embedded(heading: str, text: str) -> str:
    """What the encoder reads for a passage: its heading path, then its text."""
    return f"{heading}{_SEPARATOR}{text}" if heading else text


def chunk(blocks: list[Block], counter: TokenCounter, max_tokens: int) -> list[Chunk]:
    packer = _Packer(counter, max_tokens)
    for block in blocks:
        if block.kind == "heading":
            packer.heading(block)
        else:
            packer.block(block)
    packer.flush()
    return packer.chunks


class _Packer:
    def __init__(self, counter: TokenCounter, max_tokens: int) -> None:
        self.counter = counter
        self.max_tokens = max_tokens
        self.overhead = counter.count("")  # the special tokens every count includes
        if max_tokens < self.overhead + 8:
            raise ValueError(f"max_tokens {max_tokens} leaves no room for text")
        self.separator = self.cost(_SEPARATOR)
        self.long = LONG_CHARS * max_tokens
        self.chunks: list[Chunk] = []
        self.titles: list[tuple[int, str]] = []  # the heading stack: (level, title)
        self.heading_text = ""
        self.parts: list[str] = []
        self.used = 0  # estimated tokens of the parts, separators included
        self.page: int | None = None

    def cost(self, text: str) -> int:
        # A floor of one token per LONG_CHARS characters: a word a WordPiece tokenizer cannot
        # split is one [UNK] whatever its length, and would make passages of megabytes.
        return max(self.counter.count(text) - self.overhead, len(text) // LONG_CHARS)

    @property
    def budget(self) -> int:
        """Tokens left for text under the current heading."""
        heading = self.cost(self.heading_text) + self.separator if self.heading_text else 0
        return self.max_tokens - self.overhead - heading

    def heading(self, block: Block) -> None:
        self.flush()
        while self.titles and self.titles[-1][0] >= block.level:
            self.titles.pop()
        self.titles.append((block.level, " ".join(block.text.split())))
        self.heading_text = self._fitting_heading()

    def _fitting_heading(self) -> str:
        """The heading path, shortened to its last title, then cut, to leave half for text."""
        limit = (self.max_tokens - self.overhead) // 2
        path = _HEADING_JOIN.join(title for _, title in self.titles)
        if self.cost(path) <= limit:
            return path
        return cut(self.titles[-1][1], lambda text: self.cost(text) <= limit)

    def block(self, block: Block) -> None:
        if self.parts and block.page != self.page:
            self.flush()
        self.page = block.page
        text = block.text.strip()
        if not text:
            return
        cost = self.cost(text) if len(text) <= self.long else None
        if cost is not None and cost <= self.budget:
            self.add(text, cost)
        elif block.kind == "table":
            for part in self._table_parts(text):
                self.add(part, self.cost(part))
        else:
            for part in self._text_parts(text):
                self.add(part, self.cost(part))

    def add(self, text: str, cost: int) -> None:
        extra = cost + (self.separator if self.parts else 0)
        if self.parts and self.used + extra > self.budget:
            self.flush()
            extra = cost
        self.parts.append(text)
        self.used += extra

    def flush(self) -> None:
        if self.parts:
            self._emit(_SEPARATOR.join(self.parts))
        self.parts = []
        self.used = 0

    def _emit(self, text: str) -> None:
        if not text.strip():
            return
        tokens = self.counter.count(embedded(self.heading_text, text))
        if tokens > self.max_tokens:  # the estimate erred: split in two and check each
            first, second = _halves(text)
            self._emit(first)
            self._emit(second)
            return
        self.chunks.append(Chunk(len(self.chunks), text, self.heading_text, self.page, tokens))

    def _table_parts(self, table: str) -> list[str]:
        """The table in parts that fit, each starting with the header row."""
        header, *rows = table.split("\n")
        if len(header) > self.long:  # a huge header row: split as text instead
            return self._text_parts(table)
        room = self.budget - self.cost(header) - self.separator
        if room < self.budget // 4:
            return self._text_parts(table)
        parts: list[str] = []
        group: list[str] = []
        used = 0
        for row in rows:
            cost = self.cost(row) + 1 if len(row) <= self.long else room + 1
            if cost > room:  # one row larger than a passage: its own text pieces
                parts.extend(self._text_parts(row))
                continue
            if group and used + cost > room:
                parts.append("\n".join([header, *group]))
                group, used = [], 0
            group.append(row)
            used += cost
        if group:
            parts.append("\n".join([header, *group]))
        return parts

    def _text_parts(self, text: str) -> list[str]:
        """Sentences (then words, then characters) packed into pieces that fit the budget."""
        budget = self.budget
        units: list[str] = []
        for sentence in _SENTENCE_END.split(text):
            if len(sentence) <= self.long and self.cost(sentence) <= budget:
                units.append(sentence)
                continue
            for word in sentence.split():
                if len(word) <= self.long and self.cost(word) <= budget:
                    units.append(word)
                else:
                    fits = lambda piece: self.cost(piece) <= budget  # noqa: E731
                    units.extend(_pieces(word, fits, self.long))
        parts: list[str] = []
        current: list[str] = []
        used = 0
        for unit in units:
            cost = self.cost(unit) + 1
            if current and used + cost > budget:
                parts.append(" ".join(current))
                current, used = [], 0
            current.append(unit)
            used += cost
        if current:
            parts.append(" ".join(current))
        return parts


def _halves(text: str) -> tuple[str, str]:
    words = text.split(" ")
    if len(words) > 1:
        middle = len(words) // 2
        return " ".join(words[:middle]), " ".join(words[middle:])
    middle = max(len(text) // 2, 1)
    return text[:middle], text[middle:]


def cut(text: str, fits: Callable[[str], bool], first: int = 64) -> str:
    """The longest start of `text` that `fits`: a start of `first` characters doubled while it
    fits, then halved back between the last that fit and the first that did not, so the texts
    counted add up to a few times the answer's length, however long `text` is."""
    low, high = 0, len(text)  # text[:low] fits; nothing longer than text[:high] can
    probe = min(first, high)
    while probe > low:
        if not fits(text[:probe]):
            high = probe - 1
            break
        low, probe = probe, min(probe * 2, high)
    while low < high:
        middle = (low + high + 1) // 2
        if fits(text[:middle]):
            low = middle
        else:
            high = middle - 1
    return text[:low]


def _pieces(word: str, fits: Callable[[str], bool], longest: int) -> list[str]:
    """A word too long for a passage, in the longest pieces that fit, each of at most
    `longest` characters (never searched further: the cost stays linear in the word)."""
    pieces = []
    start = 0
    while start < len(word):
        piece = cut(word[start : start + longest], fits) or word[start]
        pieces.append(piece)
        start += len(piece)
    return pieces
