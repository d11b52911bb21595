"""The Whisper model (faster-whisper on CTranslate2) and the one thread that runs it.

**Priority.** The thread lowers its own Linux nice value by `nice` before it loads the model:
CTranslate2 makes its compute threads while the model loads, and a new thread inherits its
maker's nice value, so every thread that transcribes runs below the chat's model worker (nice
0). When both want a core the kernel gives the chat most of it; an idle machine gives speech
everything. **One transcription at a time**, each on `threads` CTranslate2 threads: a second
one at once would only share the same cores. Decoding (PyAV) runs on the same thread, at the
same priority.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.embeddings.scheduler import lower_priority
from sidecar.speech.audio import RATE, Audio, decode

log = logging.getLogger("sidecar.speech")


@dataclass(frozen=True)
class Options:
    """What a request may ask of one transcription (OpenAI's fields)."""

    language: str | None = None
    prompt: str | None = None
    temperature: float = 0.0
    words: bool = False  # word timestamps (timestamp_granularities[] word)


@dataclass(frozen=True)
class Segment:
    id: int
    start: float
    end: float
    text: str
    tokens: tuple[int, ...]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: tuple[tuple[str, float, float], ...] = ()  # (word, start, end)


@dataclass(frozen=True)
class Transcript:
    text: str
    language: str
    seconds: float  # the audio's length
    segments: tuple[Segment, ...] = field(default=())


class Transcriber:
    def __init__(
        self,
        folder: Path,
        *,
        threads: int,
        nice: int,
        compute_type: str,
        beam_size: int,
        vad: bool,
        max_seconds: float,
    ) -> None:
        self.beam_size = beam_size
        self.vad = vad
        self.max_seconds = max_seconds
        self._queue: queue.Queue[tuple[Callable[[], Any], Future[Any]] | None] = queue.Queue()
        loaded: Future[Any] = Future()
        self._thread = threading.Thread(
            target=self._run,
            args=(folder, threads, nice, compute_type, loaded),
            name="speech",
            daemon=True,
        )
        self._thread.start()
        self.model: Any = loaded.result()  # raises what loading raised

    def _run(
        self, folder: Path, threads: int, nice: int, compute_type: str, loaded: Future[Any]
    ) -> None:
        lower_priority(nice, "speech")
        try:
            from faster_whisper import WhisperModel

            model = WhisperModel(
                str(folder), device="cpu", compute_type=compute_type, cpu_threads=threads
            )
        except Exception as error:  # CTranslate2 raises RuntimeError for a bad model.bin
            loaded.set_exception(error)
            return
        loaded.set_result(model)
        while (item := self._queue.get()) is not None:
            work, future = item
            if not future.set_running_or_notify_cancel():  # the client left meanwhile
                continue
            try:
                result = work()
            except BaseException as error:
                with contextlib.suppress(InvalidStateError):
                    future.set_exception(error)
                continue
            with contextlib.suppress(InvalidStateError):
                future.set_result(result)
        # Freed on this thread, before the interpreter ends: CTranslate2 aborts the process
        # when its threads are torn down at exit instead.
        self.model = model = None

    def submit(self, data: bytes, options: Options) -> Future[Transcript]:
        """Queue the audio file `data`: decoded (AudioError) and transcribed on the thread."""
        future: Future[Transcript] = Future()
        self._queue.put((lambda: self._transcribe(decode(data, self.max_seconds), options), future))
        return future

    def _transcribe(self, audio: Audio, options: Options) -> Transcript:
        segments, info = self.model.transcribe(
            audio.samples,
            language=options.language,
            initial_prompt=options.prompt,
            temperature=options.temperature if options.temperature > 0 else 0.0,
            beam_size=self.beam_size,
            vad_filter=self.vad,
            word_timestamps=options.words,
            condition_on_previous_text=False,  # no loop of one sentence repeated
        )
        kept = tuple(_segment(s) for s in segments)  # the generator does the work here
        text = "".join(s.text for s in kept).strip()
        return Transcript(text, info.language, len(audio.samples) / RATE, kept)

    def stop(self) -> None:
        """The thread ends once the transcription running is done, and frees the model."""
        self._queue.put(None)
        self._thread.join(timeout=60)


def _segment(s: Any) -> Segment:
    words = tuple((w.word, round(w.start, 2), round(w.end, 2)) for w in s.words or ())
    return Segment(
        id=s.id - 1,  # faster-whisper counts from 1, OpenAI from 0
        start=round(s.start, 2),
        end=round(s.end, 2),
        text=s.text,
        tokens=tuple(s.tokens),
        temperature=s.temperature,
        avg_logprob=s.avg_logprob,
        compression_ratio=s.compression_ratio,
        no_speech_prob=s.no_speech_prob,
        words=words,
    )
