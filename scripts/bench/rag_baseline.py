"""Issue 44's baseline reproduced in the same run: Open WebUI's default retrieval.

Open WebUI cuts a document with LangChain's `RecursiveCharacterTextSplitter` (1,000
characters, 100 of overlap: split at blank lines, then lines, then spaces, then anywhere, and
pieces merged back up to the size), embeds each chunk with all-MiniLM-L6-v2 through
sentence-transformers (which cuts an input at the model's 256 tokens), and a document's score is
its best chunk's. `recursive_split` is that splitter written again from its documented
behaviour (no LangChain here); the chunks go to `/v1/embeddings` with `truncate_prompt_tokens`
at the encoder's limit, as sentence-transformers truncates. The issue's fixed figures (recall@5
0.959, MRR@10 0.852) were measured elsewhere and could not be reproduced here; this row puts the
same method beside ours in one run, on the same pairs and encoder.
"""

from __future__ import annotations

CHUNK_CHARS = 1000
OVERLAP_CHARS = 100
SEPARATORS = ("\n\n", "\n", " ", "")


def recursive_split(
    text: str,
    size: int = CHUNK_CHARS,
    overlap: int = OVERLAP_CHARS,
    separators: tuple[str, ...] = SEPARATORS,
) -> list[str]:
    """Chunks of at most `size` characters (a piece with no separator left may be longer),
    neighbours sharing up to `overlap` characters, each stripped."""
    separator, finer = separators[-1], separators[:0]
    for n, candidate in enumerate(separators):
        if candidate == "" or candidate in text:
            separator, finer = candidate, separators[n + 1 :]
            break
    pieces = [p for p in (text.split(separator) if separator else list(text)) if p]
    chunks: list[str] = []
    small: list[str] = []
    for piece in pieces:
        if len(piece) < size:
            small.append(piece)
            continue
        chunks.extend(_merge(small, separator, size, overlap))
        small = []
        chunks.extend(recursive_split(piece, size, overlap, finer) if finer else [piece])
    chunks.extend(_merge(small, separator, size, overlap))
    return chunks


def _merge(pieces: list[str], separator: str, size: int, overlap: int) -> list[str]:
    """Pieces joined into chunks of at most `size`; each new chunk starts with the last
    pieces of the one before, up to `overlap` characters."""
    chunks: list[str] = []
    current: list[str] = []
    total = 0
    gap = len(separator)
    for piece in pieces:
        if current and total + len(piece) + gap > size:
            _keep(chunks, separator.join(current))
            while current and (total > overlap or total + len(piece) + gap > size):
                total -= len(current[0]) + (gap if len(current) > 1 else 0)
                current = current[1:]
        current.append(piece)
        total += len(piece) + (gap if len(current) > 1 else 0)
    _keep(chunks, separator.join(current))
    return chunks


def _keep(chunks: list[str], text: str) -> None:
    if text.strip():
        chunks.append(text.strip())
