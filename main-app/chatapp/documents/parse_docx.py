"""DOCX with python-docx (MIT): paragraphs, headings (by style) and tables, in reading order.

A .docx is a zip of XML; the sizes its entries unpack to are checked before anything is read
(a small file can unpack to gigabytes). A password-protected Word file is not a zip at all but
an OLE container (so is an old .doc): both start with the same bytes and are refused as
`encrypted`, with a sentence that names both.
"""

from __future__ import annotations

import io
import re
import zipfile
from typing import Any

from chatapp.documents.blocks import Block, Refused

_OLE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_HEADING_STYLE = re.compile(r"^(?:heading|überschrift|titre|título)\s*(\d)$", re.IGNORECASE)


def parse_docx(data: bytes, max_unpacked: int) -> list[Block]:
    if data.startswith(_OLE):
        raise Refused(
            "encrypted",
            "The Word file is password-protected (or is an old .doc, not a .docx).",
        )
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
    except zipfile.BadZipFile as error:
        raise Refused("broken", "The file is not a DOCX (not a zip archive).") from error
    if unpacked > max_unpacked:
        raise Refused("too_large", f"The DOCX unpacks to {unpacked} bytes; at most {max_unpacked}.")
    import docx
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    try:
        document = docx.Document(io.BytesIO(data))
        blocks: list[Block] = []
        for element in document.element.body.iterchildren():
            tag = element.tag.rsplit("}", 1)[-1]
            if tag == "p":
                block = _paragraph(Paragraph(element, document))
                if block is not None:
                    blocks.append(block)
            elif tag == "tbl":
                rows = _table_rows(Table(element, document))
                if rows:
                    blocks.append(Block("table", "\n".join(rows)))
    except Refused:
        raise
    except Exception as error:  # python-docx and lxml raise many kinds for a damaged part
        raise Refused("broken", "The DOCX is damaged and cannot be read.") from error
    return blocks


def _paragraph(paragraph: Any) -> Block | None:
    text = paragraph.text.strip()
    if not text:
        return None
    style = paragraph.style.name if paragraph.style is not None else ""
    if style == "Title":  # above every "Heading 1"
        return Block("heading", text, level=0)
    match = _HEADING_STYLE.match(style or "")
    if match:
        return Block("heading", text, level=min(max(int(match.group(1)), 1), 6))
    return Block("text", text)


def _table_rows(table: Any) -> list[str]:
    rows = []
    for row in table.rows:
        cells: list[str] = []
        seen: set[int] = set()
        for cell in row.cells:
            if id(cell._tc) in seen:  # a merged cell repeats across the columns it spans
                continue
            seen.add(id(cell._tc))
            cells.append(" ".join(cell.text.split()))
        if any(cells):
            rows.append(" | ".join(cells))
    return rows
