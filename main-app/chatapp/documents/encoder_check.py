"""Whether the encoder now served is the one the library's vectors were made with.

`EncoderCheck` embeds `vector_space.PROBE_TEXT` and keeps the vector `TTL_S` seconds: at most
one extra embedding a minute in each process that asks (the indexer before it writes vectors,
the searcher before a dense or hybrid search). /healthz asks nothing: it says the verdict of the
process's last check (`known`), so a health probe never waits on the model service. An encoder
swapped under a running app is noticed within that minute; a model service that failed an
embedding (a sidecar restarted, perhaps with another encoder) is asked again at the next check.
The library's record is read anew at every check (one row), so `reembed` counts at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from chatapp.documents.embedder import Embedder, EmbeddingsFailed
from chatapp.documents.index import vector_space
from chatapp.documents.index.vector_space import REMEDY, EncoderState
from chatapp.store import Store

log = logging.getLogger("chatapp.documents.encoder")

TTL_S = 60.0  # how long a probe stands for the encoder served
RETRY_S = 10.0  # how soon a model service that gave no probe is asked again


class EncoderCheck:
    """The encoder's probe, kept `ttl_s`; one per process is enough (it is thread-safe)."""

    def __init__(
        self,
        embedder: Embedder,
        ttl_s: float = TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.embedder = embedder
        self.ttl_s = ttl_s
        self.clock = clock
        self._lock = threading.Lock()
        self._probe: np.ndarray | None = None
        self._until = -float("inf")  # the probe (or the failure) stands until then
        self._failed: str | None = None  # why the model service gave no probe
        self._said_changed = False
        self._known: EncoderState = "unknown"  # the last check's verdict

    def probe(self) -> np.ndarray:
        """The encoder's probe now (raises EmbeddingsFailed without one)."""
        with self._lock:
            if self.clock() >= self._until:  # one thread asks; the others wait for its answer
                self._probe, self._failed = None, None
                try:
                    self._probe = self.embedder.embed([vector_space.PROBE_TEXT])[0]
                except EmbeddingsFailed as failed:
                    self._failed = str(failed)
                wait = self.ttl_s if self._failed is None else min(RETRY_S, self.ttl_s)
                self._until = self.clock() + wait
            if self._failed is not None:
                raise EmbeddingsFailed(self._failed)
            assert self._probe is not None
            return self._probe

    def forget(self) -> None:
        """Ask the model service again at the next check (an embedding of it failed)."""
        with self._lock:
            self._until = -float("inf")

    def state(self, store: Store) -> EncoderState:
        """`same`, `changed`, or `unknown` (no vector yet, or no probe from the model
        service); a library without a probe takes this encoder's (vector_space.adopt)."""
        with store.session() as session:
            found = vector_space.space(session)
        if found is None:
            self._known = "unknown"
            return "unknown"
        try:
            probe = self.probe()
        except EmbeddingsFailed:
            self._known = "unknown"
            return "unknown"
        if found.probe is None and found.dimensions == len(probe):
            with store.session(write=True) as session:
                vector_space.adopt(session, probe)
                found = vector_space.space(session)
        verdict = vector_space.state(found, probe)
        self.noticed(verdict, found, probe)
        return verdict

    def known(self) -> EncoderState:
        """The verdict of this process's last check (`unknown` before one): what /healthz
        says, without asking the model service."""
        return self._known

    def noticed(
        self, verdict: EncoderState, found: vector_space.Space | None, probe: np.ndarray
    ) -> None:
        """Keep the verdict (`known`), and log the first check that finds the encoder changed
        (and the first after it that finds it the same again): one line, whatever the searches
        and documents it refuses."""
        changed = verdict == "changed"
        with self._lock:
            self._known = verdict
            if changed == self._said_changed:
                return
            self._said_changed = changed
        if not changed:
            log.info("encoder the same again", extra={"fields": {"dimensions": len(probe)}})
            return
        fields: dict[str, object] = {"dimensions_now": len(probe), "remedy": REMEDY}
        if found is not None:
            fields["dimensions_library"] = found.dimensions
            if found.probe is not None and found.probe.shape == probe.shape:
                fields["probe_cosine"] = round(float(found.probe @ probe), 4)
        log.warning("encoder changed", extra={"fields": fields})
