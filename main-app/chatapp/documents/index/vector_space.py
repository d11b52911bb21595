"""Which encoder the library's vectors were made with (the `vector_space` table, one row).

`dimensions`: the encoder's width. The vectors' table is made at the first vector, for that
width; an encoder of another width cannot share it (`DimensionsChanged`).

`probe`: the encoder's fingerprint, the vector it gives `PROBE_TEXT` embedded as a passage
(JSON), recorded with the first vector. Two encoders of the same width (all-MiniLM-L6-v2 and
multilingual-e5-small both give 384 numbers) would otherwise mix without a word: a question
embedded by one searched among passages embedded by the other. Any OpenAI-compatible server
gives a probe; no encoder's name is needed. The same encoder on another CPU or in another batch
differs in the last bits only: a cosine of `SAME_COSINE` or more is the same encoder. A library
made before the probe was kept (revision 0008) takes the encoder of its first check as its own.

Another encoder's vectors are never written beside these (`EncoderChanged`); the remedy is
`python -m chatapp.documents reembed` (documents/reembed.py), which forgets this row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

import numpy as np
from sqlalchemy import text
from sqlalchemy.orm import Session

# Embedded as a passage, as the library's passages are (their prompt, if the encoder has one).
# Short, so any encoder's limit takes it (the tests' generated encoder reads 32 tokens).
PROBE_TEXT = "The kettle boils water."
SAME_COSINE = 0.999
REMEDY = (
    "run `python -m chatapp.documents reembed` to index every document again with the encoder "
    "now served, or serve the previous encoder again"
)
EncoderState = Literal["same", "changed", "unknown"]


class EncoderChanged(Exception):
    """The encoder now served is not the one the library's vectors were made with."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(
            message
            or "The encoder has changed since the library was indexed (another model serves "
            f"the embeddings): {REMEDY}."
        )


class DimensionsChanged(EncoderChanged):
    """The encoder's vectors are not as wide as those the library was indexed with."""

    def __init__(self, have: int, got: int) -> None:
        super().__init__(
            f"The library's vectors have {have} dimensions and the encoder now makes {got}: "
            f"{REMEDY}."
        )
        self.have = have
        self.got = got


@dataclass(frozen=True)
class Space:
    dimensions: int
    probe: np.ndarray | None  # None: a library made before revision 0008, not checked yet


def space(session: Session) -> Space | None:
    """The library's record; None before the first vector."""
    row = session.execute(text("SELECT dimensions, probe FROM vector_space WHERE id = 1")).first()
    if row is None:
        return None
    probe = None if row[1] is None else np.asarray(json.loads(row[1]), dtype=np.float32)
    return Space(int(row[0]), probe)


def dimensions(session: Session) -> int | None:
    """The width the vectors' table was made for; None before the first vector."""
    found = space(session)
    return None if found is None else found.dimensions


def same_encoder(stored: np.ndarray, probe: np.ndarray) -> bool:
    """Whether two probes (unit vectors) come from one encoder."""
    return stored.shape == probe.shape and float(stored @ probe) >= SAME_COSINE


def state(found: Space | None, probe: np.ndarray) -> EncoderState:
    """The library's encoder against `probe` (a record without a probe: the same)."""
    if found is None:
        return "unknown"
    if found.dimensions != len(probe):
        return "changed"
    return "same" if found.probe is None or same_encoder(found.probe, probe) else "changed"


def claim_dimensions(session: Session, width: int, probe: np.ndarray | None = None) -> bool:
    """Record `width` (and the encoder's `probe`) as the library's; True when this made the
    table's first record. Raises DimensionsChanged or EncoderChanged for another encoder; a
    record without a probe takes this one (None: the width alone is checked)."""
    have = space(session)
    if have is None:
        session.execute(
            text("INSERT INTO vector_space (id, dimensions, probe) VALUES (1, :d, :p)"),
            {"d": width, "p": None if probe is None else _json(probe)},
        )
        return True
    if have.dimensions != width:
        raise DimensionsChanged(have.dimensions, width)
    if probe is not None and have.probe is None:
        adopt(session, probe)
    elif probe is not None and have.probe is not None and not same_encoder(have.probe, probe):
        raise EncoderChanged
    return False


def adopt(session: Session, probe: np.ndarray) -> None:
    """A library made before revision 0008 takes `probe`'s encoder, the one of its first check,
    as its own (the one its vectors were made with, unless it was changed before 0008)."""
    session.execute(
        text(
            "UPDATE vector_space SET probe = :p WHERE id = 1 AND probe IS NULL AND dimensions = :d"
        ),
        {"p": _json(probe), "d": len(probe)},
    )


def forget(session: Session) -> None:
    """No record: the next vector's encoder becomes the library's."""
    session.execute(text("DELETE FROM vector_space"))


def _json(probe: np.ndarray) -> str:
    return json.dumps([round(float(x), 7) for x in np.asarray(probe).ravel()])
