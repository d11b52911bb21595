"""reStructuredText (`.rst`, `.rst.txt`): its headings, and its inline markup read as the text
it shows.

Markup is not prose: `` :func:`os.path.join` `` is read as `os.path.join`, a link's
`` `text <url>`_ `` as `text`, ``` ``literal`` ``` as `literal`, a paragraph's closing `::`
as `:`, and directive lines (`.. note::`) are dropped while their indented text stays. On
the Python FAQ (whose sources are reStructuredText) this raised dense recall@5 from 0.931 to
0.943 (docs/documents.md, "Evaluation").
"""

from __future__ import annotations

import re

from chatapp.documents.reading.blocks import Block
from chatapp.documents.reading.parse_text import decode

_UNDERLINE = re.compile(r"^([=\-~^*+#\"'`:.])\1{2,}\s*$")
_ROLE = re.compile(r":[a-zA-Z][\w:.+-]*:`~?!?([^`<]*?)\s*(?:<[^>]*>)?`")
_LINK = re.compile(r"`([^`<]+?)\s*<[^>]+>`__?")
_REFERENCE = re.compile(r"`([^`]+)`__?")
_LITERAL = re.compile(r"``([^`]+)``")
_DIRECTIVE = re.compile(r"^\s*\.\.\s+(?:[\w:-]+::.*|_[^:]+:.*|\[[^\]]+\].*|\|[^|]+\|.*)?$")


def inline(text: str) -> str:
    """A line of reStructuredText as the text it shows."""
    text = _ROLE.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    text = _LITERAL.sub(r"\1", text)
    text = _REFERENCE.sub(r"\1", text)
    text = re.sub(r"^\s*::\s*$", "", text, flags=re.M)
    return re.sub(r"(?<=\S)::$", ":", text, flags=re.M)


def parse_rst(data: bytes) -> list[Block]:
    lines = decode(data).splitlines()
    blocks: list[Block] = []
    levels: list[str] = []  # underline characters in the order first seen: their level
    paragraph: list[str] = []

    def flush() -> None:
        # Inline markup may span lines (a role's text broken by the line's end).
        text = inline("\n".join(line for line in paragraph if line.strip()))
        if text.strip():
            blocks.append(Block("text", text))
        paragraph.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if (
            line.strip()
            and not _UNDERLINE.match(line)
            and _UNDERLINE.match(following)
            and len(following.strip()) >= len(line.strip())
        ):
            flush()
            if (
                paragraph == []
                and blocks
                and blocks[-1].kind == "text"
                and _UNDERLINE.match(blocks[-1].text)
            ):
                blocks.pop()  # an overline
            mark = following.strip()[0]
            if mark not in levels:
                levels.append(mark)
            blocks.append(
                Block("heading", inline(line.strip()), level=min(levels.index(mark) + 1, 6))
            )
            i += 2
            continue
        if _UNDERLINE.match(line) or _DIRECTIVE.match(line) or not line.strip():
            flush()  # an overline, a directive's own line, a blank line
        else:
            paragraph.append(line.rstrip())
        i += 1
    flush()
    return blocks
