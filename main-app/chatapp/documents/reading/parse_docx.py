"""DOCX: paragraphs, headings (by style) and tables, in reading order, read as a stream.

A .docx is a zip of XML. Each part read is inflated here with a cap on the bytes it really
produces: a zip's directory may understate a member's size (one that said little and held
200 MB was inflated whole), so its sizes may refuse a file but never admit one. The XML is
parsed as it is inflated (lxml's pull parser) and each element dropped once read, so memory
is about the longest paragraph's text whatever the file unpacks to, and time is linear in the
XML: python-docx, which read these files before, built the whole tree (1.46 GB for 60 MB of
XML) and looked each paragraph's style up among all the styles (60,000 short paragraphs took
328 s). The text kept is capped too (`max_text` characters: `too_large`).

What is read is what python-docx read: each paragraph's runs (text, tabs, line breaks), its
style's name (`Heading N`, `Title`, and their translations), tables a row a line, cells joined
by " | ", a cell spanning columns once, a cell merged down repeated in each row it covers.
Paragraphs in content controls, tracked insertions and text boxes are read too. A
password-protected Word file is not a zip at all but an OLE container (so is an old .doc):
both start with the same bytes and are refused as `encrypted`, with a sentence that names both.
"""

from __future__ import annotations

import re
import struct
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from io import BytesIO
from posixpath import dirname, join, normpath
from typing import Any

from chatapp.documents.reading.blocks import Block, Refused

_OLE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_HEADING_STYLE = re.compile(r"^(?:heading|überschrift|titre|título)\s*(\d)$", re.IGNORECASE)
_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_RELS = "{http://schemas.openxmlformats.org/package/2006/relationships}Relationship"
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, ..., name length, extra length
_PIECE = 64 * 1024  # compressed bytes inflated at a time
_OUT = 1024 * 1024  # the most bytes inflated and parsed at a time
# A run's children that are text, as python-docx reads them (w:t's own text, w:br's below).
_RUN_TEXT = {
    f"{_W}t": "",
    f"{_W}br": "",
    f"{_W}tab": "\t",
    f"{_W}ptab": "\t",
    f"{_W}cr": "\n",
    f"{_W}noBreakHyphen": "-",
}
_FRAMES = {f"{_W}p", f"{_W}tbl", f"{_W}tr", f"{_W}tc"}
_PROPERTIES = {f"{_W}pStyle", f"{_W}gridSpan", f"{_W}vMerge", f"{_W}gridBefore"}
# What the body's reader is told of; a run's formatting and the like go with their run.
_BODY_TAGS = {f"{_W}r", *_FRAMES, *_RUN_TEXT, *_PROPERTIES}


def parse_docx(data: bytes, max_unpacked: int, max_text: int) -> list[Block]:
    if data.startswith(_OLE):
        raise Refused(
            "encrypted",
            "The Word file is password-protected (or is an old .doc, not a .docx).",
        )
    try:
        members = {info.filename: info for info in zipfile.ZipFile(BytesIO(data)).infolist()}
    except zipfile.BadZipFile as error:
        raise Refused("broken", "The file is not a DOCX (not a zip archive).") from error
    declared = sum(info.file_size for info in members.values())
    if declared > max_unpacked:
        raise Refused("too_large", f"The DOCX unpacks to {declared} bytes; at most {max_unpacked}.")
    archive = _Archive(data, members, max_unpacked)
    try:
        document = _target(archive, "_rels/.rels", "officeDocument") or "word/document.xml"
        rels = join(dirname(document), "_rels", document.rsplit("/", 1)[-1] + ".rels")
        styles = _styles(archive, _target(archive, rels, "styles", dirname(document)))
        return _Body(styles, max_text).read(archive.xml(document, _BODY_TAGS))
    except Refused:
        raise
    except (zlib.error, ValueError, KeyError, SyntaxError) as error:  # lxml's errors included
        raise Refused("broken", "The DOCX is damaged and cannot be read.") from error


class _Archive:
    """The zip's members inflated by the bytes they produce, all of them together capped."""

    def __init__(self, data: bytes, members: dict[str, zipfile.ZipInfo], cap: int) -> None:
        self.data = memoryview(data)
        self.members = members
        self.left = cap
        self.cap = cap

    def has(self, name: str) -> bool:
        return name in self.members

    def chunks(self, name: str) -> Iterator[bytes]:
        info = self.members.get(name)
        if info is None:
            raise Refused("broken", f"The DOCX has no {name}: it is damaged.")
        if info.flag_bits & 1:
            raise Refused("encrypted", "The DOCX's parts are encrypted.")
        head = bytes(self.data[info.header_offset : info.header_offset + _LOCAL_HEADER.size])
        if len(head) < _LOCAL_HEADER.size or not head.startswith(b"PK\x03\x04"):
            raise Refused("broken", "The DOCX is damaged and cannot be read.")
        _, name_length, extra_length = _LOCAL_HEADER.unpack(head)
        start = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
        raw = self.data[start : start + info.compress_size]
        if info.compress_type == zipfile.ZIP_STORED:
            yield self._take(bytes(raw))
        elif info.compress_type == zipfile.ZIP_DEFLATED:
            inflate = zlib.decompressobj(-zlib.MAX_WBITS)
            for offset in range(0, len(raw), _PIECE):
                pending = bytes(raw[offset : offset + _PIECE])
                while pending and not inflate.eof:
                    # A megabyte at a time (the parser's events for it are held at once), and
                    # never past the cap: the bytes produced are counted, not the directory's
                    # word for them.
                    yield self._take(inflate.decompress(pending, min(self.left + 1, _OUT)))
                    pending = inflate.unconsumed_tail
        else:
            raise Refused("broken", "The DOCX uses a compression Word does not write.")

    def _take(self, chunk: bytes) -> bytes:
        self.left -= len(chunk)
        if self.left < 0:
            raise Refused("too_large", f"The DOCX unpacks to more than {self.cap} bytes.")
        return chunk

    def xml(self, name: str, tags: Iterable[str]) -> Iterator[tuple[str, Any]]:
        """The part's (event, element) pairs for `tags` as it is inflated; each element is
        cleared after its end event is handled (the caller has read what it needs by then),
        the others with the element they are in."""
        from lxml import etree  # type: ignore[import-untyped]  # no stubs pinned

        parser = etree.XMLPullParser(
            events=("start", "end"),
            tag=list(tags),
            resolve_entities=False,
            no_network=True,
            load_dtd=False,
        )
        for chunk in self.chunks(name):
            parser.feed(chunk)
            yield from _dropping(parser.read_events())
        parser.close()
        yield from _dropping(parser.read_events())


def _dropping(events: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    for event, element in events:
        yield event, element
        if event == "end":
            element.clear(keep_tail=False)
            while element.getprevious() is not None:  # the siblings read before it
                del element.getparent()[0]


def _target(archive: _Archive, rels: str, kind: str, base: str = "") -> str | None:
    """The part a relationships part names for `kind` (its type's last word)."""
    if not archive.has(rels):
        return None
    for event, element in archive.xml(rels, [_RELS]):
        related = element.get("Type", "").rsplit("/", 1)[-1]
        if event == "end" and element.tag == _RELS and related == kind:
            return normpath(join(base, element.get("Target", ""))).lstrip("/")
    return None


@dataclass
class _Styles:
    names: dict[str, str] = field(default_factory=dict)  # paragraph style id -> its name
    default: str = ""  # the default paragraph style's name

    def name(self, style_id: str | None) -> str:
        return self.names.get(style_id or "", self.default)


def _styles(archive: _Archive, name: str | None) -> _Styles:
    styles = _Styles()
    if name is None or not archive.has(name):
        return styles
    style_name = ""
    for event, element in archive.xml(name, [f"{_W}name", f"{_W}style"]):
        if event == "end" and element.tag == f"{_W}name":
            style_name = element.get(f"{_W}val", "")
        elif event == "end" and element.tag == f"{_W}style":
            if element.get(f"{_W}type") == "paragraph":
                styles.names[element.get(f"{_W}styleId", "")] = style_name
                if element.get(f"{_W}default") in ("1", "true", "on"):
                    styles.default = style_name
            style_name = ""
    return styles


@dataclass
class _Frame:
    """An element being read: a paragraph (its text), a cell (its paragraphs' text), a row
    (its cells), a table (its rows, and what each column's last cell said, for merges)."""

    tag: str
    texts: list[str] = field(default_factory=list)
    style: str | None = None
    column: int = 0  # a row: the grid column of its next cell
    span: int = 1  # a cell: the grid columns it covers
    merged: bool = False  # a cell: continues the cell above it
    above: dict[int, str] = field(default_factory=dict)  # a table: column -> last cell's text


class _Body:
    def __init__(self, styles: _Styles, max_text: int) -> None:
        self.styles = styles
        self.left = max_text
        self.max_text = max_text
        self.stack: list[_Frame] = []
        self.blocks: list[Block] = []

    def read(self, events: Iterator[tuple[str, Any]]) -> list[Block]:
        for event, element in events:
            tag = element.tag
            if event == "start":
                if tag in _FRAMES:
                    self.stack.append(_Frame(tag))
            elif tag in _FRAMES:
                getattr(self, "_end_" + tag[len(_W) :])(self.stack.pop())
            elif tag in _RUN_TEXT:
                self._run_text(tag, element)
            elif tag in _PROPERTIES and self.stack:
                self._property(tag, element)
        return self.blocks

    def _run_text(self, tag: str, element: Any) -> None:
        """A run's piece of text, read at its own end (it is cleared right after)."""
        parent = element.getparent()
        if parent is None or parent.tag != f"{_W}r" or not self.stack:
            return
        if self.stack[-1].tag != f"{_W}p":
            return
        if tag == f"{_W}t":
            text = element.text or ""
        elif tag == f"{_W}br":
            wraps = element.get(f"{_W}type", "textWrapping") == "textWrapping"
            text = "\n" if wraps else ""
        else:
            text = _RUN_TEXT[tag]
        self.left -= len(text)
        if self.left < 0:
            raise Refused("too_large", f"The DOCX holds more than {self.max_text} characters.")
        self.stack[-1].texts.append(text)

    def _property(self, tag: str, element: Any) -> None:
        frame = self.stack[-1]
        value = element.get(f"{_W}val")
        if tag == f"{_W}pStyle" and frame.tag == f"{_W}p" and frame.style is None:
            frame.style = value or ""
        elif tag == f"{_W}gridSpan" and frame.tag == f"{_W}tc":
            frame.span = max(int(value or 1), 1)
        elif tag == f"{_W}vMerge" and frame.tag == f"{_W}tc":
            frame.merged = value in (None, "continue")
        elif tag == f"{_W}gridBefore" and frame.tag == f"{_W}tr":
            frame.column = max(int(value or 0), 0)

    def _container(self) -> _Frame | None:
        """The cell this paragraph or table is in, None at the body's level."""
        for frame in reversed(self.stack):
            if frame.tag == f"{_W}tc":
                return frame
        return None

    def _end_p(self, paragraph: _Frame) -> None:
        text = "".join(paragraph.texts).strip()
        cell = self._container()
        if cell is not None:
            cell.texts.append(text)
            return
        if not text:
            return
        style = self.styles.name(paragraph.style)
        match = _HEADING_STYLE.match(style)
        if style.lower() == "title":  # above every "Heading 1"
            self.blocks.append(Block("heading", text, level=0))
        elif match:
            self.blocks.append(Block("heading", text, level=min(max(int(match[1]), 1), 6)))
        else:
            self.blocks.append(Block("text", text))

    def _end_tc(self, cell: _Frame) -> None:
        row = self.stack[-1] if self.stack and self.stack[-1].tag == f"{_W}tr" else None
        table = self.stack[-2] if row is not None and len(self.stack) > 1 else None
        if row is None or table is None:
            return
        text = " ".join(" ".join(cell.texts).split())
        if cell.merged:
            text = table.above.get(row.column, "")
        for column in range(row.column, row.column + cell.span):
            table.above[column] = text
        row.column += cell.span
        row.texts.append(text)

    def _end_tr(self, row: _Frame) -> None:
        if self.stack and self.stack[-1].tag == f"{_W}tbl" and any(row.texts):
            # A table in a cell is that cell's text: its cells joined as words, not columns.
            nested = self._container() is not None
            line = " ".join(filter(None, row.texts)) if nested else " | ".join(row.texts)
            self.stack[-1].texts.append(line)

    def _end_tbl(self, table: _Frame) -> None:
        if not table.texts:
            return
        cell = self._container()
        if cell is not None:  # a table in a cell: its rows are the cell's text
            cell.texts.append(" ".join(table.texts))
        else:
            self.blocks.append(Block("table", "\n".join(table.texts)))
