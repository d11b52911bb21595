"""`python -m chatapp.documents reembed`: index the whole library again with the encoder now
served, after the encoder was changed (`encoder_changed`: vector_space.py).

In one transaction: the vectors' table and the record of its encoder are dropped (the next
vector makes them again, for the new encoder's width and fingerprint), every passage is deleted
(an indexer writes only the passages a document lacks), and every document whose passages came
from the encoder is queued again: `ready`, `queued`, `reading` (its indexer sees the claim gone
within a second and stops) and `failed` with `encoder_changed` or `embeddings_failed`. A document
that failed for a reason of its own file (a refusal of its reading, `cancelled`) stays as it is:
it would fail the same way, and a cancelled one was not wanted. Its bytes are kept, so the
indexer (the app's, wherever it runs) reads it again from them.

Until a document is ready again it is not searched; a search of the library finds what is
ready so far.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, func, or_, select, update

from chatapp.documents.index.search_index import index_for
from chatapp.documents.library import queued_again
from chatapp.documents.models import STORING, Chunk, Document
from chatapp.store import Store

# The encoder's failures: queued again with the rest. Any other failure is the file's own.
ENCODER_FAILURES = ("encoder_changed", "embeddings_failed")


@dataclass(frozen=True)
class Reembedded:
    queued: int  # documents queued to be read and embedded again
    passages: int  # passages deleted, with their vectors
    left: int  # documents left failed for a reason of their own file

    def summary(self) -> str:
        return (
            f"Forgot the library's vectors, {self.passages} passages and its encoder; queued "
            f"{self.queued} documents to be indexed again with the encoder now served "
            f"({self.left} failed for a reason of their own file left as they are). The "
            "indexer reads them again as it runs; /healthz says the encoder is `unknown` until "
            "the first is embedded."
        )


def reembed(store: Store) -> Reembedded:
    """Forget the vectors and their encoder and queue the library again (the module's text)."""
    again = or_(
        Document.status.in_(("queued", "reading", "ready")),
        (Document.status == "failed") & Document.error_type.in_(ENCODER_FAILURES),
    )
    with store.session(write=True) as session:
        index_for(store).forget(session)  # the table first: no vector deleted one by one
        passages = session.execute(delete(Chunk)).rowcount  # type: ignore[attr-defined]
        queued = session.execute(
            update(Document)
            .where(again, or_(Document.claim.is_(None), Document.claim != STORING))
            .values(**queued_again())
        ).rowcount  # type: ignore[attr-defined]
        left = session.scalar(
            select(func.count()).select_from(Document).where(Document.status == "failed")
        )
    return Reembedded(queued=queued, passages=passages, left=left or 0)
