"""Plain text and Markdown: decoding, paragraphs, and Markdown's headings, tables and code.

Markdown is read by its line structure only (ATX `#` and setext headings, pipe tables, fenced
code blocks, paragraphs between blank lines): enough to keep headings with their passages and
tables and code whole; the text itself is kept as written, since the encoder and the model both
read Markdown well.
"""

from __future__ import annotations

import codecs
import re

from chatapp.documents.reading.blocks import Block, Refused

_ATX = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t#]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(```+|~~~+)")
_TABLE_ROW = re.compile(r"^ {0,3}\|")
_TABLE_RULE = re.compile(r"^[\s|:\-]+$")


def decode(data: bytes) -> str:
    """The file's text: UTF-8 (or UTF-16 with its byte-order mark), else Windows-1252.

    A NUL byte outside UTF-16 means a binary file named as text: refused as broken, rather than
    read as a page of mojibake.
    """
    for bom, encoding in (
        (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF16_LE, "utf-16"),
        (codecs.BOM_UTF16_BE, "utf-16"),
    ):
        if data.startswith(bom):
            try:
                return data.decode(encoding)
            except UnicodeDecodeError as error:
                raise Refused("broken", "The file's text is not valid Unicode.") from error
    if b"\x00" in data:
        raise Refused("broken", "The file is binary, not text.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("cp1252", errors="replace")


def parse_text(data: bytes) -> list[Block]:
    """Paragraphs between blank lines; no headings."""
    return [Block("text", part) for part in _paragraphs(decode(data).splitlines())]


def parse_markdown(data: bytes) -> list[Block]:
    lines = decode(data).splitlines()
    blocks: list[Block] = []
    loose: list[str] = []  # lines of the paragraphs read since the last structure

    def flush() -> None:
        blocks.extend(Block("text", part) for part in _paragraphs(loose))
        loose.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence:
            flush()
            end = _fence_end(lines, i, fence.group(1))
            blocks.append(Block("text", "\n".join(lines[i:end])))
            i = end
            continue
        atx = _ATX.match(line)
        if atx:
            flush()
            blocks.append(Block("heading", atx.group(2).strip(), level=len(atx.group(1))))
            i += 1
            continue
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if line.strip() and (not loose or not loose[-1].strip()) and _SETEXT.match(following):
            flush()
            level = 1 if following.strip().startswith("=") else 2
            blocks.append(Block("heading", line.strip(), level=level))
            i += 2
            continue
        if _TABLE_ROW.match(line):
            flush()
            end = i
            while end < len(lines) and _TABLE_ROW.match(lines[end]):
                end += 1
            rows = [_table_row(row) for row in lines[i:end] if not _TABLE_RULE.match(row)]
            blocks.append(Block("table", "\n".join(rows)))
            i = end
            continue
        loose.append(line)
        i += 1
    flush()
    return blocks


def _fence_end(lines: list[str], start: int, marker: str) -> int:
    """The index after the fence opened at `start` closes (the end of the file if it never does)."""
    for j in range(start + 1, len(lines)):
        if lines[j].strip().startswith(marker[0] * len(marker)):
            return j + 1
    return len(lines)


def _table_row(line: str) -> str:
    cells = line.strip().strip("|").split("|")
    return " | ".join(cell.strip() for cell in cells)


def _paragraphs(lines: list[str]) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    for line in [*lines, ""]:
        if line.strip():
            current.append(line.rstrip())
        elif current:
            parts.append("\n".join(current))
            current = []
    return parts
