"""HTML with the standard library's parser: headings, paragraphs and tables, no scripts.

The parser never fails on bad markup (it reads what it can, as a browser would); what it keeps
is the text a reader sees: `<script>`, `<style>`, `<template>`, `<noscript>` and the `<head>`
(but its `<title>`, the document's first heading when the body has none) are left out.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

from chatapp.documents.reading.blocks import Block
from chatapp.documents.reading.parse_text import decode

_HIDDEN = {"script", "style", "template", "noscript", "head", "svg", "math"}
_HEADINGS = {f"h{n}": n for n in range(1, 7)}
# Elements that end the text before them (a paragraph, a list item, a line break...).
_BREAKS = {
    "p",
    "div",
    "li",
    "br",
    "section",
    "article",
    "blockquote",
    "pre",
    "dd",
    "dt",
    "ul",
    "ol",
    "dl",
    "hr",
    "main",
    "header",
    "footer",
    "nav",
    "aside",
    "figure",
    "figcaption",
    "address",
    "details",
    "summary",
    "body",
}
_SPACES = re.compile(r"[ \t\r\n\f\v]+")


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[Block] = []
        self.title = ""
        self._hidden = 0  # depth inside elements whose text nobody sees
        self._in_title = False
        self._text: list[str] = []
        self._heading = 0  # the level of the heading being read, 0 outside one
        self._rows: list[list[str]] | None = None  # the table being read
        self._cell: list[str] | None = None
        self._pre = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        if tag in _HIDDEN:
            self._hidden += 1
            return
        if tag == "pre":
            self._flush()
            self._pre += 1
        elif tag in _HEADINGS:
            self._flush()
            self._heading = _HEADINGS[tag]
        elif tag == "table" and self._rows is None:
            self._flush()
            self._rows = []
        elif tag == "tr" and self._rows is not None:
            self._rows.append([])
        elif tag in ("td", "th") and self._rows is not None:
            self._cell = []
        elif tag in _BREAKS and self._rows is None:
            self._flush()

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        if tag in _HIDDEN:
            self._hidden = max(0, self._hidden - 1)
            return
        if tag in _HEADINGS and self._heading:
            self._flush()
        elif tag in ("td", "th") and self._rows is not None and self._cell is not None:
            if not self._rows:
                self._rows.append([])
            self._rows[-1].append(_SPACES.sub(" ", "".join(self._cell)).strip())
            self._cell = None
        elif tag == "table" and self._rows is not None:
            rows = [" | ".join(row) for row in self._rows if any(row)]
            if rows:
                self.blocks.append(Block("table", "\n".join(rows)))
            self._rows = None
        elif tag == "pre":
            self._flush()
            self._pre = max(0, self._pre - 1)
        elif tag in _BREAKS and self._rows is None:
            self._flush()

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        if self._hidden:
            return
        if self._cell is not None:
            self._cell.append(data)
        elif self._rows is None:
            self._text.append(data)

    def _flush(self) -> None:
        raw = "".join(self._text)
        self._text = []
        text = raw.strip("\n") if self._pre else _SPACES.sub(" ", raw).strip()
        if not text.strip():
            self._heading = 0
            return
        if self._heading:
            self.blocks.append(Block("heading", text, level=self._heading))
            self._heading = 0
        else:
            self.blocks.append(Block("text", text))


def parse_html(data: bytes) -> list[Block]:
    reader = _Reader()
    reader.feed(decode(data))
    reader.close()
    reader._flush()
    blocks = reader.blocks
    title = _SPACES.sub(" ", reader.title).strip()
    if title and blocks and not any(block.kind == "heading" for block in blocks):
        blocks.insert(0, Block("heading", title, level=1))
    return blocks
