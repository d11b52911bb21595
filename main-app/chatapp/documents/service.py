"""What the app keeps for the library (`app.extensions["documents"]`): the searcher, and the
indexer where it runs in this process.

Where indexing runs (`DOCUMENT_INDEXER`): under gunicorn, `process`: the master starts one
indexer process beside the workers (`chatapp.gunicorn_conf`, `python -m
chatapp.documents`), so no gevent worker ever parses a file or waits on the encoder;
`thread` (the development server, tests): an OS thread of this process; `off`: nowhere here
(another process or machine runs it against the same database).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select

from chatapp.documents.embedder import Embedder
from chatapp.documents.encoder_check import EncoderCheck
from chatapp.documents.index.search_index import index_for
from chatapp.documents.indexer.worker import QUICK_S, Indexer
from chatapp.documents.models import Document
from chatapp.documents.reading.formats import Limits
from chatapp.documents.search.grounding import ChatTokenRatio
from chatapp.documents.search.retrieval import Searcher
from chatapp.documents.sizing import PassageSizing
from chatapp.documents.warming import Warmer
from chatapp.store import Store


def _pending(store: Store) -> bool:
    """Whether any document waits to be read or was being read."""
    with store.session() as session:
        found = session.scalar(
            select(Document.id).where(Document.status.in_(("queued", "reading"))).limit(1)
        )
        return found is not None


def make_indexer(
    store: Store,
    config: Mapping[str, Any],
    *,
    quick: bool = False,
    instance: str | None = None,
    warmer: Warmer | None = None,
    encoder: EncoderCheck | None = None,
) -> Indexer:
    """An indexer of the app's settings; `quick`: the quick lane (indexer/worker.py); `instance`:
    the name its claims carry (claims.take_over), a random one if None; `warmer`: the process's
    one (PASSAGE_WARM, documents/warming.py); `encoder`: the process's check of the encoder
    (encoder_check.py), its own if None."""
    indexer = Indexer(
        store=store,
        index=index_for(store),
        embedder=embedder_for(config),
        encoder=encoder,
        sizing=PassageSizing.from_config(config),
        limits=Limits(config["DOCUMENT_MAX_BYTES"], config["DOCUMENT_MAX_PAGES"]),
        read_timeout_s=config["DOCUMENT_READ_TIMEOUT"],
        read_memory_mb=config["DOCUMENT_READ_MEMORY_MB"],
        quick_s=QUICK_S if quick else None,
        warmer=warmer,
    )
    if instance is not None:
        indexer.instance = instance
    return indexer


def embedder_for(config: Mapping[str, Any]) -> Embedder:
    return Embedder(
        config["SIDECAR_URL"],
        model=config["EMBED_MODEL"],
        api_key=config["UPSTREAM_API_KEY"],
        timeout=config["SIDECAR_READ_TIMEOUT"],
        # Our sidecar takes input_type (its encoder's prompts); an OpenAI-compatible one may not
        send_input_type=config["UPSTREAM_API"] != "openai",
    )


class Documents:
    def __init__(self, store: Store, config: Mapping[str, Any]) -> None:
        embedder = embedder_for(config)
        self.searcher = Searcher(
            store=store,
            index=index_for(store),
            embedder=embedder,
            sizing=PassageSizing.from_config(config),
            method=config["DOCUMENT_SEARCH"],
            keyword_weight=config["DOCUMENT_KEYWORD_WEIGHT"],
            encoder=EncoderCheck(embedder),
        )
        # The chat model's tokens per encoder token, learned from grounded turns
        # (search/grounding.py)
        self.chat_tokens = ChatTokenRatio()
        self._store = store
        self._config = config
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # PASSAGE_WARM with the indexer here: the library is swept from the start, not only
        # once the indexer thread starts (with the first document to read)
        self._warmer = Warmer.of(store, config) if config["DOCUMENT_INDEXER"] == "thread" else None
        if self._warmer is not None:
            self._warmer.start(self._stop)
        # The thread starts with the first document to read: now, if the database holds one
        # (a restart in the middle), else at the first upload or retry.
        if config["DOCUMENT_INDEXER"] == "thread" and _pending(store):
            self._start()

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None or self._config["DOCUMENT_INDEXER"] != "thread":
                return
            indexer = make_indexer(
                self._store, self._config, warmer=self._warmer, encoder=self.searcher.encoder
            )
            self._thread = threading.Thread(
                target=indexer.run,
                args=(self._stop, self._wake),
                name="documents-indexer",
                daemon=True,
            )
            self._thread.start()

    def wake(self) -> None:
        """A document was queued: an indexer thread here looks now instead of at its next poll
        (an indexer process polls every second)."""
        self._start()
        self._wake.set()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
