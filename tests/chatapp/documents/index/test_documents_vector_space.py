"""The library's encoder on both engines: its width and fingerprint recorded with the first
vector, another encoder refused (another width too), a library made before revision 0008
taking the encoder of its first check, and all of it forgotten for a reembed."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import delete, func, inspect, select

from chatapp.documents.index import vector_space
from chatapp.documents.index.search_index import index_for
from chatapp.documents.index.vector_space import DimensionsChanged, EncoderChanged
from chatapp.documents.models import Chunk, Document
from chatapp.store import Store
from tests.chatapp.documents.index.test_documents_index import add_document, unit

PROBE = unit(1.0, 0.5, 0.25)
OTHER = unit(0.25, 0.5, 1.0)  # the same width, another encoder's


def test_the_first_vector_records_the_encoders_probe(store: Store) -> None:
    with store.session(write=True) as session:
        assert vector_space.space(session) is None
        index_for(store).prepare(session, len(PROBE), PROBE)
    with store.session() as session:
        found = vector_space.space(session)
    assert found is not None and found.dimensions == len(PROBE)
    assert found.probe is not None and np.allclose(found.probe, PROBE, atol=1e-6)
    assert vector_space.state(found, PROBE) == "same"
    # The same encoder on another CPU or batch: the last bits differ, still the same
    noisy = PROBE + np.float32(1e-4) * unit(0, 0, 0, 1)
    assert vector_space.state(found, noisy / np.linalg.norm(noisy)) == "same"
    assert vector_space.state(found, OTHER) == "changed"
    assert vector_space.state(found, np.ones(4, dtype=np.float32) / 2) == "changed"
    assert vector_space.state(None, PROBE) == "unknown"


def test_another_encoder_of_the_same_width_is_refused(store: Store) -> None:
    index = index_for(store)
    with store.session(write=True) as session:
        index.prepare(session, len(PROBE), PROBE)
    remedy = pytest.raises(EncoderChanged, match=r"python -m chatapp\.documents reembed")
    with remedy, store.session(write=True) as session:
        index.prepare(session, len(OTHER), OTHER)
    # A width change is an encoder change (caught as one), said with both widths
    wider = pytest.raises(EncoderChanged, match="8 dimensions and the encoder now makes 4")
    with wider as raised, store.session(write=True) as session:
        index.prepare(session, 4, np.ones(4, dtype=np.float32) / 2)
    assert isinstance(raised.value, DimensionsChanged)
    with store.session(write=True) as session:
        index.prepare(session, len(PROBE), PROBE)  # the library's own: nothing to say


def test_a_library_made_before_0008_takes_the_encoder_of_its_first_check(
    store: Store, owners: tuple[int, int]
) -> None:
    """Vectors written with their width alone (as before the probe was kept): the first
    encoder checked is taken as the library's, and another one is refused after it."""
    add_document(store, owners[0], [("kettle", unit(1))])
    with store.session() as session:
        found = vector_space.space(session)
    assert found is not None and found.probe is None
    assert vector_space.state(found, OTHER) == "same"  # nothing to compare with yet
    with store.session(write=True) as session:
        vector_space.adopt(session, PROBE)
        vector_space.adopt(session, OTHER)  # the first check's stays
    with store.session() as session:
        found = vector_space.space(session)
    assert found is not None and found.probe is not None
    assert vector_space.state(found, PROBE) == "same"
    assert vector_space.state(found, OTHER) == "changed"


def test_a_library_made_before_0008_refuses_another_width_without_taking_its_probe(
    store: Store, owners: tuple[int, int]
) -> None:
    add_document(store, owners[0], [("kettle", unit(1))])
    with pytest.raises(DimensionsChanged), store.session(write=True) as session:
        index_for(store).prepare(session, 4, np.ones(4, dtype=np.float32) / 2)
    with store.session(write=True) as session:
        vector_space.adopt(session, np.ones(4, dtype=np.float32) / 2)  # another width: ignored
        found = vector_space.space(session)
    assert found is not None and (found.dimensions, found.probe) == (8, None)


def test_forget_drops_the_vectors_and_their_encoder(store: Store, owners: tuple[int, int]) -> None:
    alice, _ = owners
    add_document(store, alice, [("kettle", unit(1)), ("warranty", unit(0, 1))])
    index = index_for(store)
    with store.session(write=True) as session:
        assert "chunk_vectors" in inspect(session.connection()).get_table_names()
        index.forget(session)
    with store.session(write=True) as session:
        assert vector_space.space(session) is None
        assert "chunk_vectors" not in inspect(session.connection()).get_table_names()
        assert index.dense(session, alice, unit(1), 5) == []
        # A passage deletes without its vector's trigger (SQLite) or foreign key (PostgreSQL)
        session.execute(delete(Document).where(Document.owner_id == alice))
        assert session.scalar(select(func.count()).select_from(Chunk)) == 0
    # The next vector makes them again, for its own encoder's width
    wide = np.ones(4, dtype=np.float32) / 2
    with store.session(write=True) as session:
        index.prepare(session, 4, wide)
    with store.session() as session:
        assert vector_space.dimensions(session) == 4
