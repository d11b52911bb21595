"""POST /v1/audio/transcriptions: OpenAI's transcription API on the sidecar's speech model
(sidecar/speech/), so the official SDK's `audio.transcriptions.create` works unchanged.

Request, multipart/form-data (upload.py), at most SPEECH_MAX_BYTES of audio:
  file             the audio: wav, mp3, ogg, webm, m4a, flac or aac (told by its first bytes),
                   at most SPEECH_MAX_SECONDS long
  model            any string of up to 256 characters (clients send fixed names: whisper-1);
                   the reply is the served speech model's
  language         an ISO-639-1 code; an English-only model (.en) reads English whatever it says
  prompt           text the model continues from (names, spelling), at most 2,000 characters
  response_format  json (default) | text | srt | verbose_json | vtt (formats.py)
  temperature      0 to 1 (0: greedy)
  timestamp_granularities[]  segment | word (words: verbose_json's `words`)

Reply, 200: json {"text", "usage": {"type": "duration", "seconds"}}; text and srt as
text/plain; vtt as text/vtt; verbose_json {"task", "language", "duration", "text", "segments",
"words"?, "usage"}.

Refusals (errors.REFUSALS): 404 speech_not_served, 503 not_ready (loading, or failed: `phase`),
415 unsupported_media_type, 413 audio_too_large, 400 audio_missing, audio_empty,
audio_too_long, invalid_audio, invalid_multipart, unsupported_response_format; 503 overloaded
(SPEECH_QUEUE_SIZE). Nothing of the audio or its text is logged or kept.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response

from sidecar.speech.audio import AudioError
from sidecar.speech.service import QueueFull, Speech
from sidecar.speech.transcriber import Options, Transcript
from sidecar.web.audio.formats import render
from sidecar.web.audio.upload import read_form
from sidecar.web.deps import RecordDep, SettingsDep, SpeechDep
from sidecar.web.errors import RETRY_NOT_READY_S, ApiError, overloaded
from sidecar.web.generation.reply import wait_for_disconnect

router = APIRouter()


@router.post("/v1/audio/transcriptions")
async def create_transcription(
    request: Request, settings: SettingsDep, speech: SpeechDep, record: RecordDep
) -> Response:
    ready(speech)
    form = await read_form(request, settings.speech_max_bytes)
    options = Options(form.language, form.prompt, form.temperature, form.words)
    transcript = await transcribe(request, speech, form.data, options)
    if transcript is None:  # the client left
        record.outcome = "cancelled"
        return Response(status_code=499)
    record.outcome = "ok"
    return render(transcript, form.response_format, form.words)


def ready(speech: Speech) -> None:
    """ApiError unless the speech model is loaded."""
    phase = speech.phase
    if phase.name == "off":
        raise ApiError(
            "speech_not_served",
            "no speech model is configured on this sidecar (SPEECH_MODEL_PATH)",
        )
    if phase.name != "ready":
        detail = f"{phase.name}: {phase.reason}" if phase.reason else phase.name
        raise ApiError(
            "not_ready",
            f"the speech model is not ready ({detail})",
            headers={"Retry-After": str(RETRY_NOT_READY_S)},
            extra={"phase": phase.name},
        )


async def transcribe(
    request: Request, speech: Speech, data: bytes, options: Options
) -> Transcript | None:
    """The transcript of one audio file, or None when the client left first."""
    try:
        with speech.admitted():
            work = asyncio.ensure_future(speech.transcribe(data, options))
            gone = asyncio.ensure_future(wait_for_disconnect(request.receive))
            try:
                await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
            if not work.done():
                work.cancel()  # still queued: never run
                return None
            return work.result()
    except QueueFull:
        raise overloaded() from None
    except AudioError as error:
        raise ApiError(error.reason, error.message, param="file") from None
