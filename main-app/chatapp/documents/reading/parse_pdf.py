"""PDF: the text layer of each page, with pypdf (BSD); the outline gives headings to pages.

Nothing here reads pictures of text (no OCR): a PDF whose pages hold no text layer is refused
as `no_text`, the usual case of a scanned document. A PDF that opens with the empty password
(an owner password only restricts printing or copying) is read; one that needs a password is
refused as `encrypted`.
"""

from __future__ import annotations

import io
import logging
from typing import Any

from chatapp.documents.reading.blocks import Block, Refused

# pypdf logs every oddity it repairs in a damaged file as a warning; a file's problems are
# reported once, as its refusal or not at all.
logging.getLogger("pypdf").setLevel(logging.ERROR)


def parse_pdf(data: bytes, max_pages: int, max_text: int) -> list[Block]:
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    if not data.lstrip()[:5] == b"%PDF-":
        raise Refused("broken", "The file is not a PDF.")
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not _opens_without_password(reader):
            raise Refused("encrypted", "The PDF needs a password to open.")
        pages = len(reader.pages)
        if pages > max_pages:
            raise Refused("too_large", f"The PDF has {pages} pages; at most {max_pages} are read.")
        headings = _outline_by_page(reader)
        blocks: list[Block] = []
        extracted: dict[str, str] = {}  # a page's drawing (_drawing) -> its text
        left = max_text
        for number, page in enumerate(reader.pages, start=1):
            for title, level in headings.get(number, []):
                blocks.append(Block("heading", title, level=level, page=number))
            key = _drawing(page)
            text = extracted.get(key) if key is not None else None
            if text is None:
                text = page.extract_text() or ""
                if key is not None:
                    extracted[key] = text
            left -= len(text)
            if left < 0:
                raise Refused(
                    "too_large",
                    f"The PDF holds more than {max_text} characters of text by page {number}.",
                )
            blocks.extend(Block("text", part, page=number) for part in _paragraphs(text))
    except Refused:
        raise
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:
        raise Refused("broken", "The PDF is damaged and cannot be read.") from error
    if not any(block.kind == "text" for block in blocks):
        raise Refused(
            "no_text",
            f"None of the PDF's {pages} pages has a text layer: it looks scanned, and "
            "pictures of text are not read here.",
        )
    return blocks


def _drawing(page: Any) -> str | None:
    """What a page's text depends on, when it is shared objects: its content streams and its
    resources (fonts) by reference, and its rotation. Pages that share them have the same text,
    read once: 1,999 pages drawing one stream were read at 1.2 s each. None: not shared."""
    contents = page.raw_get("/Contents") if "/Contents" in page else None
    refs: list[Any] = contents if isinstance(contents, list) else [contents]
    if not refs or not all(hasattr(ref, "idnum") for ref in refs):
        return None  # a stream of the page's own: nothing to share
    resources = page.raw_get("/Resources") if "/Resources" in page else None
    key = repr(([(r.idnum, r.generation) for r in refs], resources, page.get("/Rotate")))
    return key if len(key) <= 4096 else None  # resources of the page's own, written out


def _opens_without_password(reader: Any) -> bool:
    try:
        return bool(reader.decrypt(""))
    except Exception:  # pypdf raises a variety of errors for ciphers it cannot read
        return False


def _outline_by_page(reader: Any) -> dict[int, list[tuple[str, int]]]:
    """Each page's outline entries (title, level 1..6); none when the outline cannot be read."""
    found: dict[int, list[tuple[str, int]]] = {}

    def walk(items: list[Any], level: int) -> None:
        for item in items:
            if isinstance(item, list):
                walk(item, level + 1)
                continue
            page = reader.get_destination_page_number(item)
            title = str(getattr(item, "title", "") or "").strip()
            if page is not None and page >= 0 and title:
                found.setdefault(page + 1, []).append((title, min(level, 6)))

    try:
        walk(reader.outline, 1)
    except Exception:  # a damaged outline costs the headings, not the text
        return {}
    return found


def _paragraphs(text: str) -> list[str]:
    """A page's text in paragraphs: blank lines split them; lines inside one are joined."""
    parts: list[str] = []
    current: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.strip():
            current.append(line.strip())
        elif current:
            parts.append(" ".join(current))
            current = []
    return parts
