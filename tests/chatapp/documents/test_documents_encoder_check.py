"""documents/encoder_check.py: the encoder's probe asked at most once a minute (sooner after a
failure or `forget`), the library's state on both engines, and one log line when it changes."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from chatapp.documents.embedder import Embedder, EmbeddingsFailed, InputType
from chatapp.documents.encoder_check import RETRY_S, TTL_S, EncoderCheck
from chatapp.documents.index import vector_space
from chatapp.documents.index.search_index import index_for
from chatapp.store import Store
from tests.chatapp.documents.index.test_documents_index import add_document, unit


class Encoder(Embedder):
    """One vector for every text (an encoder as far as the probe can tell), counting calls."""

    def __init__(self, vector: np.ndarray) -> None:
        super().__init__("http://unused", model="m", send_input_type=True)
        self.vector = vector
        self.asked: list[tuple[list[str], InputType]] = []
        self.down = False

    def _call(self, texts: list[str], input_type: InputType) -> list[list[float]]:
        if self.down:
            raise EmbeddingsFailed("The model service is not reachable for embeddings.")
        self.asked.append((texts, input_type))
        return [self.vector.tolist() for _ in texts]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_probe_is_a_passage_asked_once_a_minute() -> None:
    encoder, clock = Encoder(unit(1.0)), Clock()
    check = EncoderCheck(encoder, clock=clock)
    assert np.allclose(check.probe(), unit(1.0))
    clock.now = TTL_S - 1
    check.probe()
    assert encoder.asked == [([vector_space.PROBE_TEXT], "passage")]
    clock.now = TTL_S
    check.probe()
    assert len(encoder.asked) == 2
    check.forget()  # an embedding failed: the service is asked again at once
    check.probe()
    assert len(encoder.asked) == 3


def test_a_service_that_gives_no_probe_is_asked_again_sooner() -> None:
    encoder, clock = Encoder(unit(1.0)), Clock()
    check = EncoderCheck(encoder, clock=clock)
    encoder.down = True
    with pytest.raises(EmbeddingsFailed, match="not reachable"):
        check.probe()
    encoder.down = False
    with pytest.raises(EmbeddingsFailed):  # the failure stands a while: not asked per search
        check.probe()
    clock.now = RETRY_S
    assert np.allclose(check.probe(), unit(1.0))


def test_the_librarys_state(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    same, other = Encoder(unit(1.0)), Encoder(unit(0.0, 1.0))
    assert EncoderCheck(same).state(store) == "unknown"  # no vector yet
    assert same.asked == []  # ... and nothing asked for it
    with store.session(write=True) as session:
        index_for(store).prepare(session, len(unit(1.0)), unit(1.0))
    assert EncoderCheck(same).state(store) == "same"
    check = EncoderCheck(other)
    with caplog.at_level(logging.INFO, logger="chatapp.documents.encoder"):
        assert check.state(store) == "changed"
        assert check.state(store) == "changed"
        other.down = True
        check.forget()
        assert check.state(store) == "unknown"  # no probe: nothing can be said
    [line] = [r for r in caplog.records if r.getMessage() == "encoder changed"]
    fields = line.__dict__["fields"]
    assert fields["dimensions_library"] == fields["dimensions_now"] == len(unit(1.0))
    assert fields["probe_cosine"] == 0.0 and "reembed" in fields["remedy"]


def test_a_library_made_before_0008_takes_the_encoder_of_its_first_check(
    store: Store, owners: tuple[int, int]
) -> None:
    add_document(store, owners[0], [("kettle", unit(1.0))])  # its width alone recorded
    assert EncoderCheck(Encoder(unit(1.0))).state(store) == "same"
    with store.session() as session:
        found = vector_space.space(session)
    assert found is not None and found.probe is not None
    assert np.allclose(found.probe, unit(1.0), atol=1e-6)
    assert EncoderCheck(Encoder(unit(0.0, 1.0))).state(store) == "changed"
