"""chatapp/documents/names.py: issue 58, a file named with a right-to-left override showed
`txt.exe` as `exe.txt` in the library and in citations."""

from __future__ import annotations

import pytest

from chatapp.documents import library
from chatapp.documents.names import stored_name
from chatapp.documents.reading.formats import Limits
from chatapp.store import Store


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("invoice\u202etxt.exe", "invoicetxt.exe"),  # shown as "invoiceexe.txt"
        ("\u2067report\u2069.pdf", "report.pdf"),
        ("a\u200fb\u200e\u061cc\u202a\u202c.md", "abc.md"),
        ("line\nbreak\t\x00.txt\x7f\x85", "linebreak.txt"),
        ("  notes.md \u202e", "notes.md"),
        ("سلام.txt", "سلام.txt"),  # right-to-left letters are text, not controls
        ("\u202e", ""),
    ],
)
def test_hidden_characters_are_removed(given: str, stored: str) -> None:
    assert stored_name(given) == stored


def test_a_stored_name_shows_its_characters_in_their_order(
    store: Store, owners: tuple[int, int]
) -> None:
    alice, _ = owners
    limits = Limits(max_bytes=1000, max_pages=10)
    added = library.add(store, alice, "invoice\u202etxt.exe", b"MZ\x90\x00", None, limits)
    assert added.document.name == "invoicetxt.exe"
    assert [d.name for d in library.listing(store, alice)] == ["invoicetxt.exe"]
    blank = library.add(store, alice, "\u202e\u2066", b"hello", "text/plain", limits)
    assert blank.document.name == "untitled"
