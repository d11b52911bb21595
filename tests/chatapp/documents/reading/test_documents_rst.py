"""reStructuredText read as the text it shows, with its headings."""

from __future__ import annotations

from chatapp.documents.reading.blocks import Block
from chatapp.documents.reading.formats import Limits, read

PAGE = b"""\
=====
Guide
=====

Install
-------

Use :func:`os.path.join` and :mod:`the docs <pdb>`, see `Python
<https://python.org>`_ or ``pip``. Run this::

   pip install x

.. note::

   Kept as text.
"""


def test_headings_roles_links_literals_and_directives() -> None:
    format, blocks = read(PAGE, "guide.rst", None, Limits(10**6, 10))
    assert format == "rst"
    assert blocks == [
        Block("heading", "Guide", level=1),
        Block("heading", "Install", level=2),
        Block("text", "Use os.path.join and the docs, see Python or pip. Run this:"),
        Block("text", "   pip install x"),
        Block("text", "   Kept as text."),
    ]
