"""A document's name as it is stored and shown: the upload's file name without the characters
that would make it show as another name.

Bidirectional controls reorder what follows them when the name is drawn: `invoice\u202etxt.exe`
(U+202E, right-to-left override) shows as `invoiceexe.txt` in the library and in citations.
They are removed, with the other formatting marks of the bidirectional algorithm and control
characters (tabs, new lines, NUL), so a name shows its characters in the order they are in.
"""

from __future__ import annotations

import re

# Embeddings and overrides (U+202A-U+202E), isolates (U+2066-U+2069), the marks (U+200E, U+200F,
# U+061C), and C0, DEL and C1 controls.
HIDDEN = re.compile("[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c\x00-\x1f\x7f-\x9f]")


def stored_name(name: str) -> str:
    """The name without hidden characters, blank space at its ends trimmed ("" if nothing is
    left: the caller names it)."""
    return HIDDEN.sub("", name).strip()
