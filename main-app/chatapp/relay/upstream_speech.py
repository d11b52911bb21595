"""Speech to text through the model service: OpenAI's `POST /v1/audio/transcriptions`, which
our sidecar serves on its speech model (docs/speech.md) and OpenAI-compatible servers may serve
too. Both upstream modules call `transcribe` with their API's path; the answer is the JSON
format's `text`. Refusals become the app's errors with one sentence each, by the server's code
(our sidecar's are OpenAI-shaped under /v1: `{"error": {"message", "type", "param", "code"}}`).

Whether speech is served, for the page (`speech_of`): our sidecar's /readyz `speech` object
(`served`, `phase`) and the transcription model its /v1/models lists (`type:
"transcription"`, with `max_audio_seconds`); a server that says neither leaves it unknown.
Nothing of the audio or its text is logged.
"""

from __future__ import annotations

import logging
from typing import Any

import requests

from chatapp.errors import ApiError
from chatapp.relay.upstream import (
    Connection,
    Recording,
    busy,
    host_refused,
    retry_after,
    trimmed,
    unauthorized,
    upstream_failed,
)

log = logging.getLogger("chatapp.upstream_speech")

NOT_SERVED = "Voice input is off: the model service has no speech model."


def transcribe(
    connection: Connection, path: str, model: str, recording: Recording, request_id: str
) -> str:
    file = (recording.filename, recording.data, recording.content_type)
    fields = {"model": model, "response_format": "json"}
    response = connection.post_form(path, fields, file, {"X-Request-Id": request_id})
    with response:
        if response.status_code != 200:
            error = refusal(response)
            log.warning(
                "the model service answered a transcription %s; relayed as %s",
                response.status_code,
                error.type,
            )
            raise error
        try:
            text = response.json().get("text")
        except (ValueError, AttributeError):
            text = None
    if not isinstance(text, str):
        raise upstream_failed()
    return text.strip()


def refusal(response: requests.Response) -> ApiError:
    """The app's error for a transcription answer that is not a 200."""
    status = response.status_code
    message, code, phase = _error_of(response)
    if status in (401, 403):
        return unauthorized()
    if status == 400 and code == "invalid_host":
        return host_refused()
    if status in (404, 405) or code == "speech_not_served":  # none here, or no such route
        return ApiError("speech_not_served", NOT_SERVED, status=503)
    if status == 503 and code == "model_not_ready":
        if phase == "failed":
            sentence = "The speech model could not be loaded; voice input is off."
            return ApiError("speech_failed", sentence, status=503)
        seconds = retry_after(response)
        sentence = f"The speech model is still loading; try again in {seconds} s."
        return ApiError("speech_loading", sentence, status=503, retry_after=seconds)
    if status in (429, 503):
        return busy(response)
    if status == 413 or code == "audio_too_large":
        return ApiError(
            "audio_too_large", "The recording is too large for the model service.", status=413
        )
    if code == "audio_too_long":
        return ApiError(
            "audio_too_long", f"The recording is too long ({trimmed(message)}).", status=400
        )
    if code in ("audio_empty", "audio_missing"):
        return ApiError("audio_empty", "The recording holds no sound.", status=400)
    if code == "invalid_audio":
        return ApiError("invalid_audio", "The recording could not be read as audio.", status=400)
    if 400 <= status < 500 and trimmed(message):
        return ApiError(
            "invalid_audio",
            f"The model service refused the recording ({trimmed(message)}).",
            status=400,
        )
    return upstream_failed()


def _error_of(response: requests.Response) -> tuple[str, str, str]:
    """(message, code, phase) of an OpenAI-shaped error body; empty strings where absent."""
    try:
        error = response.json().get("error", {})
    except (ValueError, AttributeError):
        return "", "", ""
    if not isinstance(error, dict):
        return (error if isinstance(error, str) else ""), "", ""
    fields = (error.get("message"), error.get("code"), error.get("phase"))
    message, code, phase = (f if isinstance(f, str) else "" for f in fields)
    return message, code, phase


def speech_of(readyz: Any, models: Any) -> dict[str, Any] | None:
    """`{"served", "phase", "max_seconds"?}` for the page, from a /readyz `speech` object
    and a model list (either may be None); None: the server does not say."""
    entry = _transcription_model(models)
    if isinstance(readyz, dict) and isinstance(readyz.get("served"), bool):
        phase = readyz.get("phase")
        speech: dict[str, Any] = {
            "served": readyz["served"],
            "phase": phase if isinstance(phase, str) else "unknown",
        }
    elif entry is not None:
        speech = {"served": True, "phase": "ready" if entry.get("ready", True) else "loading"}
    else:
        return None
    seconds = entry.get("max_audio_seconds") if entry is not None else None
    if isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds > 0:
        speech["max_seconds"] = seconds
    return speech


def _transcription_model(models: Any) -> dict[str, Any] | None:
    data = models.get("data") if isinstance(models, dict) else None
    for entry in data if isinstance(data, list) else ():
        if isinstance(entry, dict) and entry.get("type") == "transcription":
            return entry
    return None
