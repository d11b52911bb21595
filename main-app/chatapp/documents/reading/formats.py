"""Which parser reads a file: its name's extension, else its declared type, else its bytes.

`read(data, name, mime, limits)` returns the file's blocks or raises `Refused`; it never
returns a file with no text (`no_text`), so nothing is ever indexed as zero passages in silence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath

from chatapp.documents.reading.blocks import Block, Refused
from chatapp.documents.reading.parse_docx import parse_docx
from chatapp.documents.reading.parse_html import parse_html
from chatapp.documents.reading.parse_pdf import parse_pdf
from chatapp.documents.reading.parse_rst import parse_rst
from chatapp.documents.reading.parse_text import parse_markdown, parse_text

# The formats read here: name -> (extensions, MIME types). The MIME type stored for a document
# is the first of its format's.
FORMATS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "text": ((".txt", ".text", ".log", ".csv"), ("text/plain", "text/csv")),
    "rst": ((".rst",), ("text/x-rst", "text/prs.fallenstein.rst")),
    "markdown": ((".md", ".markdown"), ("text/markdown", "text/x-markdown")),
    "html": ((".html", ".htm", ".xhtml"), ("text/html", "application/xhtml+xml")),
    "pdf": ((".pdf",), ("application/pdf",)),
    "docx": (
        (".docx",),
        ("application/vnd.openxmlformats-officedocument.wordprocessingml.document",),
    ),
}


_MIB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    max_bytes: int  # the file itself (DOCUMENT_MAX_BYTES)
    max_pages: int  # a PDF's pages (DOCUMENT_MAX_PAGES)

    def max_unpacked(self, size: int) -> int:
        """What a DOCX of `size` bytes may unpack to: its XML is verbose, but not 20 times its
        zip (a file under a mebibyte counted as one: 60,000 short paragraphs are 40 KB of zip
        and 2 MB of XML). It was 20 times DOCUMENT_MAX_BYTES whatever the file: a 209 KB DOCX
        could unpack to 400 MB."""
        return 20 * min(max(size, _MIB), self.max_bytes)

    @property
    def max_text(self) -> int:
        """The characters of text a file may yield, counted as they are extracted: as many as
        the file may have bytes. A compressed format can hold far more (a 315 KB PDF whose
        1,999 pages share one content stream yields 308 MB), which is not a document."""
        return self.max_bytes


def format_of(data: bytes, name: str, mime: str | None) -> str:
    """The format's name (a key of FORMATS); `unsupported_type` if none fits."""
    suffix = PurePosixPath(name.lower()).suffix
    for format, (suffixes, _) in FORMATS.items():
        if suffix in suffixes:
            return format
    base = (mime or "").split(";")[0].strip().lower()
    for format, (_, types) in FORMATS.items():
        if base in types:
            return format
    head = data[:512].lstrip().lower()
    if head.startswith(b"%pdf-"):
        return "pdf"
    if head.startswith((b"<!doctype html", b"<html")):
        return "html"
    if not suffix and b"\x00" not in head and head:
        return "text"
    raise Refused(
        "unsupported_type",
        f"Files of type {suffix or base or 'unknown'} are not read "
        "here: send text, Markdown, reStructuredText, HTML, PDF or DOCX.",
    )


def mime_of(format: str) -> str:
    return FORMATS[format][1][0]


def read(data: bytes, name: str, mime: str | None, limits: Limits) -> tuple[str, list[Block]]:
    """The file's format and its blocks, or `Refused` with the reason."""
    if len(data) > limits.max_bytes:
        raise Refused(
            "too_large",
            f"The file has {len(data)} bytes; at most {limits.max_bytes} "
            "are read (DOCUMENT_MAX_BYTES).",
        )
    format = format_of(data, name, mime)
    parsers: dict[str, Callable[[bytes], list[Block]]] = {
        "text": parse_text,
        "markdown": parse_markdown,
        "rst": parse_rst,
        "html": parse_html,
        "pdf": lambda body: parse_pdf(body, limits.max_pages, limits.max_text),
        "docx": lambda body: parse_docx(body, limits.max_unpacked(len(body)), limits.max_text),
    }
    blocks = parsers[format](data)
    if not any(block.kind != "heading" and block.text.strip() for block in blocks):
        raise Refused("no_text", "The file holds no text to read.")
    text = sum(len(block.text) for block in blocks)
    if text > limits.max_text:
        raise Refused(
            "too_large", f"The file holds {text} characters of text; at most {limits.max_text}."
        )
    return format, blocks
