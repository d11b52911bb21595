"""Speech as the web process holds it: the model loaded in a thread at start (the port opens and
the chat model loads meanwhile), its phase for /readyz and /v1/models, and `transcribe` for the
routes.

Phases: `off` (no SPEECH_MODEL_PATH), `loading`, `ready`, `failed` (the reason is logged and
shown on /readyz; chat goes on without speech). Nothing of the audio or its text is logged or
kept: the bytes and the transcript live only as long as the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sidecar.settings import Settings
from sidecar.speech.folder import SpeechFolderError, check_folder

if TYPE_CHECKING:
    from sidecar.speech.transcriber import Options, Transcriber, Transcript

log = logging.getLogger("sidecar.speech")


class QueueFull(Exception):
    """SPEECH_QUEUE_SIZE transcriptions already wait."""


@dataclass(frozen=True)
class Phase:
    name: str
    reason: str | None = None


class Speech:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.path = settings.speech_model_path
        if settings.speech_model_name:
            self.name = settings.speech_model_name
        else:
            self.name = self.path.name if self.path is not None else ""
        self.phase = Phase("off" if self.path is None else "loading")
        self.transcriber: Transcriber | None = None
        self.waiting = 0  # transcriptions submitted and not finished

    @property
    def served(self) -> bool:
        return self.phase.name == "ready"

    def readiness(self) -> dict[str, object]:
        """/readyz's `speech`: whether it is served, and the model's phase."""
        body: dict[str, object] = {"served": self.served, "phase": self.phase.name}
        if self.phase.name != "off":
            body |= {"model": self.name, "reason": self.phase.reason}
        return body

    def model_object(self) -> dict[str, object] | None:
        """The speech model in /v1/models (None when none is configured)."""
        if self.path is None:
            return None
        try:
            created = int((self.path / "model.bin").stat().st_mtime)
        except OSError:
            created = 0
        return {
            "id": self.name,
            "object": "model",
            "created": created,
            "owned_by": "phi3-sidecar",
            "type": "transcription",  # served at /v1/audio/transcriptions
            "ready": self.served,
            "max_audio_seconds": self.settings.speech_max_seconds,
            "max_audio_bytes": self.settings.speech_max_bytes,
        }

    def start(self) -> None:
        if self.path is not None:
            threading.Thread(target=self._load, name="speech-load", daemon=True).start()

    def stop(self) -> None:
        if self.transcriber is not None:
            self.transcriber.stop()

    def _load(self) -> None:
        assert self.path is not None
        began = time.monotonic()
        settings = self.settings
        try:
            check_folder(self.path)
            from sidecar.speech.transcriber import Transcriber

            threads = settings.speech_threads or _cpu_count()
            self.transcriber = Transcriber(
                self.path,
                threads=threads,
                nice=settings.speech_nice,
                compute_type=settings.speech_compute_type,
                beam_size=settings.speech_beam_size,
                vad=settings.speech_vad,
                max_seconds=settings.speech_max_seconds,
            )
        except Exception as error:  # a bad folder, a model.bin CTranslate2 refuses
            reason = str(error) if isinstance(error, SpeechFolderError) else type(error).__name__
            self.phase = Phase("failed", reason)
            log.error(
                "speech model failed to load",
                extra={"fields": {"speech_model": self.name, "reason": reason}},
            )
            return
        fields = {
            "speech_model": self.name,
            "threads": threads,
            "nice": settings.speech_nice,
            "compute_type": settings.speech_compute_type,
            "load_s": round(time.monotonic() - began, 2),
        }
        log.info("speech model ready", extra={"fields": fields})
        self.phase = Phase("ready")

    @contextlib.contextmanager
    def admitted(self) -> Iterator[None]:
        """A place in the queue for one request; QueueFull when SPEECH_QUEUE_SIZE already wait
        beside the one running."""
        if self.waiting > self.settings.speech_queue_size:
            raise QueueFull
        self.waiting += 1
        try:
            yield
        finally:
            self.waiting -= 1

    async def transcribe(self, data: bytes, options: Options) -> Transcript:
        """The audio file's transcript (within `admitted`); AudioError for bad audio."""
        assert self.transcriber is not None
        future = self.transcriber.submit(data, options)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()  # still queued: never run
            raise


def _cpu_count() -> int:
    from sidecar.model.cpus import cpu_budget

    return cpu_budget().count
