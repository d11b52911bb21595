"""The encoder as the web process holds it: loaded in a thread at start (the port opens and the
chat model loads meanwhile), its phase for /readyz, and `embed` for the route.

Phases: `off` (no EMBED_MODEL_PATH / EMBED_MODEL_ID), `downloading`, `loading`, `ready`,
`failed` (the reason is logged and shown on /readyz; chat goes on without embeddings).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.embeddings import catalog
from sidecar.embeddings.folder import EncoderFolderError, EncoderSpec, is_complete
from sidecar.settings import Settings

if TYPE_CHECKING:
    import numpy as np

    from sidecar.embeddings.encoder import Encoder, Ids
    from sidecar.embeddings.scheduler import EncoderPool

log = logging.getLogger("sidecar.embeddings")
TOKENIZER_PATH = "/v1/embeddings/tokenizer"  # web/embeddings/tokenizer.py


class QueueFull(Exception):
    """EMBED_QUEUE_SIZE requests already wait."""


@dataclass(frozen=True)
class Phase:
    name: str
    reason: str | None = None
    since: float = 0.0


class Embeddings:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.path = settings.embed_model_path
        entry = catalog.ENTRIES.get(settings.embed_model_id or "")
        self.entry = entry
        if settings.embed_model_name:
            self.name = settings.embed_model_name
        elif entry is not None:
            self.name = entry.name
        else:
            self.name = self.path.name if self.path is not None else ""
        matryoshka = settings.embed_matryoshka
        self.matryoshka = matryoshka if matryoshka is not None else bool(entry and entry.matryoshka)
        self.phase = Phase("off" if self.path is None else "starting", since=time.monotonic())
        self.encoder: Encoder | None = None
        self.pool: EncoderPool | None = None
        self.threads = 0
        self.waiting = 0  # requests submitted and not finished
        # The loaded encoder's tokenizer.json as read at load, for GET /v1/embeddings/tokenizer:
        # what the app sizes passages with (the file on disk may change under a running encoder).
        self.tokenizer_json: bytes | None = None
        self.tokenizer_sha256: str | None = None

    @property
    def spec(self) -> EncoderSpec | None:
        return self.encoder.spec if self.encoder is not None else None

    def readiness(self) -> dict[str, object]:
        """/readyz's `embeddings`: whether they are served, and the encoder's phase."""
        phase = self.phase
        body: dict[str, object] = {"served": phase.name == "ready", "phase": phase.name}
        if phase.name == "off":
            return body
        body |= {"model": self.name, "reason": phase.reason}
        spec = self.spec
        if spec is not None:
            body |= {"dimensions": spec.dimensions, "max_input_tokens": spec.max_tokens}
        return body

    def model_object(self) -> dict[str, object] | None:
        """The encoder in /v1/models (None when none is configured)."""
        if self.path is None:
            return None
        try:  # when the folder was written: the closest thing to OpenAI's "created"
            created = int((self.path / "modules.json").stat().st_mtime)
        except OSError:
            created = 0
        spec = self.spec
        return {
            "id": self.name,
            "object": "model",
            "created": created,
            "owned_by": "phi3-sidecar",
            "type": "embedding",  # what the route serves it at: /v1/embeddings
            "ready": self.phase.name == "ready",
            "dimensions": spec.dimensions if spec else None,
            "max_input_tokens": spec.max_tokens if spec else None,
            "pooling": spec.pooling if spec else None,
            "matryoshka": self.matryoshka,
            # The texts written before an input by its `input_type` (the folder's prompts); a
            # client that counts an input's tokens counts its prompt's too
            "prompts": dict(spec.prompts) if spec else None,
            # Where a client gets the tokenizer that counts max_input_tokens (None until ready)
            "tokenizer": (
                {"url": TOKENIZER_PATH, "sha256": self.tokenizer_sha256}
                if self.tokenizer_sha256 is not None
                else None
            ),
        }

    def start(self) -> None:
        if self.path is not None:
            threading.Thread(target=self._load, name="encoder-load", daemon=True).start()

    def stop(self) -> None:
        if self.pool is not None:
            self.pool.stop()

    def _set(self, name: str, reason: str | None = None) -> None:
        self.phase = Phase(name, reason, time.monotonic())

    def _load(self) -> None:
        assert self.path is not None
        began = time.monotonic()
        try:
            if self.entry is not None and not is_complete(self.path):
                if not self.settings.model_download:
                    raise EncoderFolderError(
                        f"{self.path} holds no complete encoder; set MODEL_DOWNLOAD=1 to fetch "
                        f"{self.entry.name}"
                    )
                self._set("downloading")
                catalog.download(self.entry, self.path)
            self._set("loading")
            self._open(self.path)
        except Exception as error:  # a bad folder, a failed download, a graph onnxruntime refuses
            reason = str(error) if isinstance(error, EncoderFolderError) else type(error).__name__
            self._set("failed", reason)
            log.error(
                "embedding model failed to load",
                extra={"fields": {"embed_model": self.name, "reason": reason}},
            )
            return
        spec = self.spec
        assert spec is not None
        fields = {
            "embed_model": self.name,
            "dimensions": spec.dimensions,
            "max_tokens": spec.max_tokens,
            "pooling": spec.pooling,
            "normalize": spec.normalize,
            "threads": self.threads,
            "nice": self.settings.embed_nice,
            "load_s": round(time.monotonic() - began, 2),
        }
        log.info("embedding model ready", extra={"fields": fields})
        self._set("ready")

    def _open(self, path: Path) -> None:
        from sidecar.embeddings.encoder import Encoder
        from sidecar.embeddings.folder import read_spec
        from sidecar.embeddings.scheduler import EncoderPool

        encoder = Encoder(read_spec(path))
        threads = self.settings.embed_threads or _cpu_count()
        self.pool = EncoderPool(
            encoder,
            threads=threads,
            nice=self.settings.embed_nice,
            batch_tokens=self.settings.embed_batch_tokens,
        )
        self.threads = threads
        self.tokenizer_json = encoder.spec.tokenizer.read_bytes()
        self.tokenizer_sha256 = hashlib.sha256(self.tokenizer_json).hexdigest()
        self.encoder = encoder

    @contextlib.contextmanager
    def admitted(self) -> Iterator[None]:
        """A place in the queue for one request, held while it is tokenized and encoded;
        QueueFull when EMBED_QUEUE_SIZE requests already wait beside the one running. Nothing
        of a request is tokenized before it has its place: the queue bounds that work too."""
        if self.waiting > self.settings.embed_queue_size:
            raise QueueFull
        self.waiting += 1
        try:
            yield
        finally:
            self.waiting -= 1

    async def tokenize(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's token ids, by the pool's threads (within `admitted`)."""
        assert self.pool is not None
        return await asyncio.wrap_future(self.pool.tokenize(texts))

    async def embed(self, inputs: Sequence[Ids]) -> np.ndarray:
        """The vectors of token-id inputs (checked by the route), in order (within
        `admitted`)."""
        assert self.pool is not None
        return await asyncio.wrap_future(self.pool.submit(inputs))


def _cpu_count() -> int:
    """The CPUs this process may use: its affinity, capped by a cgroup quota (as NUM_THREADS).
    sidecar.model.cpus is plain Python (no model runtime): the one copy of that rule."""
    from sidecar.model.cpus import cpu_budget

    return cpu_budget().count
