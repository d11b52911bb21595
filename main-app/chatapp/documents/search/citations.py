"""Citations: the `[n]` marks of a reply, checked against the passages its turn was given.

A grounded turn numbers its passages 1..N. The reply may cite `[2]`, `[1, 3]` or `[1][3]`;
`check` returns the numbers that name a passage (in the order first cited) and those that name
none (a model inventing `[9]` with four passages). The unknown ones are never linked to any
passage: the `done` line lists them apart (`unknown_citations`) and the page shows them struck
through, and `mark` writes them as `[9?]` where the reply's text is kept on the server.
Brackets inside code (fenced blocks, inline spans) and Markdown links (`[1](url)`) are not
citations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FENCED = re.compile(r"(^|\n) {0,3}(```|~~~)[\s\S]*?(\n {0,3}\2[^\n]*|$)")
_INLINE = re.compile(r"`+[^`\n]*`+")
_MARK = re.compile(r"\[(\d{1,4}(?:\s*,\s*\d{1,4})*)\](?!\()")


@dataclass(frozen=True)
class Checked:
    cited: list[int]  # passage numbers cited that exist, in the order first cited
    unknown: list[int]  # numbers cited that name no passage


def _prose(text: str) -> str:
    """The reply with its code blanked out (same length, so offsets still hold)."""

    def blank(match: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", match.group(0))

    return _INLINE.sub(blank, _FENCED.sub(blank, text))


def _numbers(text: str) -> list[tuple[re.Match[str], list[int]]]:
    return [
        (match, [int(part) for part in match.group(1).split(",")])
        for match in _MARK.finditer(_prose(text))
    ]


def check(text: str, passages: int) -> Checked:
    """The citations of `text` against passages numbered 1..`passages`."""
    cited: list[int] = []
    unknown: list[int] = []
    for _, numbers in _numbers(text):
        for number in numbers:
            found = cited if 1 <= number <= passages else unknown
            if number not in found:
                found.append(number)
    return Checked(cited, unknown)


def mark(text: str, passages: int) -> str:
    """`text` with every citation that names no passage written `[n?]`."""
    out: list[str] = []
    end = 0
    for match, numbers in _numbers(text):
        labels = [f"{n}" if 1 <= n <= passages else f"{n}?" for n in numbers]
        out.append(text[end : match.start()])
        out.append("[" + ", ".join(labels) + "]")
        end = match.end()
    out.append(text[end:])
    return "".join(out)
