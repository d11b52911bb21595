"""The encoder's width the library's vectors were made with (the `vector_space` table).

The vectors' table is made at the first vector, for that width; a later encoder of another
width cannot share it: `DimensionsChanged` says so (docs/documents.md, "One schema, two engines").
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.orm import Session


class DimensionsChanged(Exception):
    """The encoder's vectors are not as wide as those the library was indexed with."""

    def __init__(self, have: int, got: int) -> None:
        super().__init__(
            f"The library's vectors have {have} dimensions and the encoder now makes {got}: "
            "delete and add the documents again after changing the encoder."
        )
        self.have = have
        self.got = got


def dimensions(session: Session) -> int | None:
    """The width the vectors' table was made for; None before the first vector."""
    row = session.execute(text("SELECT dimensions FROM vector_space WHERE id = 1")).first()
    return None if row is None else int(row[0])


def claim_dimensions(session: Session, width: int) -> bool:
    """Record `width` as the library's; True when this made the table's first record."""
    have = dimensions(session)
    if have is None:
        session.execute(
            text("INSERT INTO vector_space (id, dimensions) VALUES (1, :d)"), {"d": width}
        )
        return True
    if have != width:
        raise DimensionsChanged(have, width)
    return False
