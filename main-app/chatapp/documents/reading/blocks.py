"""What every parser returns: a file as a list of blocks, and the one way a file is refused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["heading", "text", "table"]

# Every per-file refusal: its code (the document's `error.type`) and what it means. The
# sentence sent with a refusal names the file's own problem; docs/documents.md lists these.
REFUSALS: dict[str, str] = {
    "unsupported_type": "The file is not one of the formats read here (text, Markdown, "
    "reStructuredText, HTML, PDF, DOCX).",
    "too_large": "The file, what it unpacks to or the text it holds is larger than "
    "`DOCUMENT_MAX_BYTES` allows, it has more pages than `DOCUMENT_MAX_PAGES`, or reading it "
    "needed more memory than `DOCUMENT_READ_MEMORY_MB`.",
    "too_slow": "Reading the file took longer than `DOCUMENT_READ_TIMEOUT` allows.",
    "encrypted": "The file is protected by a password.",
    "broken": "The file is damaged or is not what its name says.",
    "no_text": "The file holds no text to read (a scanned PDF has only pictures of pages; "
    "nothing here reads text from pictures).",
}


class Refused(Exception):
    """A file that cannot be read: `code` is one of `REFUSALS`, `message` one sentence."""

    def __init__(self, code: str, message: str) -> None:
        assert code in REFUSALS, code
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Block:
    """One piece of a document in reading order.

    `heading`: a heading of `level` 1..6 (a section's title; 0 is the document's own title);
    `text`: a paragraph, list item or code block; `table`: a table, one row a line, cells
    joined by " | ", the first row its header. `page` is 1-based where the format has pages
    (PDF), else None.
    """

    kind: Kind
    text: str
    level: int = 0
    page: int | None = None
