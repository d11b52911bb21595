"""`input_audio` parts in /v1/chat/completions (and the Responses API, which says its request as
one): the chat model reads no audio, so each part is transcribed by the speech model before
admission and read by the model as the user's text where the part stands (messages.AudioPart).
The usage counts the audio's seconds (`prompt_tokens_details.audio_seconds`). A Phi-4-multimodal
folder that reads audio itself is not served here (docs/speech.md says why).
"""

from __future__ import annotations

import base64
import binascii

from fastapi import Request

from sidecar.settings import Settings
from sidecar.speech.service import Speech
from sidecar.speech.transcriber import Options
from sidecar.web.audio.api import ready, transcribe
from sidecar.web.errors import ApiError
from sidecar.web.generation.messages import AudioPart


def audio_allowance(settings: Settings) -> int:
    """What a chat body may hold beyond MAX_BODY_BYTES for its audio: one file of
    SPEECH_MAX_BYTES in base64 (none without a speech model)."""
    if settings.speech_model_path is None:
        return 0
    return (settings.speech_max_bytes + 2) // 3 * 4


async def transcribe_parts(
    request: Request, speech: Speech, settings: Settings, messages: list[object]
) -> float | None:
    """Each audio part's transcript set in place; the audio's seconds together (None: no audio
    part). ApiError for audio that cannot be read, or no speech model."""
    found = [
        (index, number, part)
        for index, message in enumerate(messages)
        for number, part in enumerate(getattr(message, "content", None) or ())
        if isinstance(part, AudioPart)
    ]
    if not found:
        return None
    if speech.phase.name == "off":
        raise ApiError(
            "audio_input_unsupported",
            f"the model {settings.served_model_name!r} reads no audio and no speech model is "
            "configured to transcribe it (SPEECH_MODEL_PATH)",
        )
    ready(speech)
    seconds = 0.0
    for index, number, part in found:
        field = f"messages.{index}.content.{number}.input_audio.data"
        data = _bytes(part, field, settings.speech_max_bytes)
        try:
            transcript = await transcribe(request, speech, data, Options())
        except ApiError as error:
            error.param = field
            raise
        if transcript is None:
            raise ApiError("body_cut_off", "the client left")
        seconds += transcript.seconds
        if seconds > settings.speech_max_seconds:
            raise ApiError(
                "audio_too_long",
                f"the request's audio is longer than SPEECH_MAX_SECONDS "
                f"({settings.speech_max_seconds:g} s)",
                param=field,
            )
        part._transcript = transcript.text
    for index, message in enumerate(messages):
        text = getattr(message, "text", None)
        user = getattr(message, "role", None) == "user"
        blank = text is not None and not text.strip()
        if user and blank and not getattr(message, "has_images", False):
            raise ApiError(
                "no_speech",
                f"messages.{index}: no speech was heard in its audio",
                param=f"messages.{index}.content",
            )
    return round(seconds, 2)


def _bytes(part: AudioPart, field: str, limit: int) -> bytes:
    encoded = part.input_audio.data
    if len(encoded) > (limit + 2) // 3 * 4:
        raise ApiError(
            "audio_too_large", f"the audio is over SPEECH_MAX_BYTES ({limit} bytes)", param=field
        )
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError("invalid_audio", "input_audio.data is not base64", param=field) from None
