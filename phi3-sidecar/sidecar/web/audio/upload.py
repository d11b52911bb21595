"""The body of POST /v1/audio/transcriptions: multipart/form-data, read within its bounds.

The whole body is read first, at most SPEECH_MAX_BYTES plus FIELDS_ROOM (413 audio_too_large
beyond), and held in memory only: the parser's spooled files never reach the disk
(`_InMemory`), so no audio is ever written anywhere. Each part's headers are bounded
(HEADER_BYTES) before the parser reads them, the fields by count and size.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from fastapi import Request
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect

from sidecar.web.audio.formats import FORMATS
from sidecar.web.errors import ApiError

FIELDS_ROOM = 64 * 1024  # the fields beside the file, and the parts' headers
HEADER_BYTES = 8 * 1024  # one part's headers
MAX_FIELDS = 16
MAX_PROMPT_CHARS = 2000  # OpenAI: the last 224 tokens are read
LANGUAGE = re.compile(r"[a-z]{2,3}")
KNOWN = {
    "file",
    "model",
    "language",
    "prompt",
    "response_format",
    "temperature",
    "timestamp_granularities[]",
    "timestamp_granularities",
    "stream",
}


@dataclass(frozen=True)
class TranscriptionForm:
    data: bytes
    model: str | None
    language: str | None
    prompt: str | None
    response_format: str
    temperature: float
    words: bool


class _InMemory(MultiPartParser):
    """Files kept in memory (the body's bound is theirs): nothing is spooled to a disk."""

    spool_max_size = 1 << 62


async def read_form(request: Request, max_bytes: int) -> TranscriptionForm:
    media_type, _, params = request.headers.get("content-type", "").partition(";")
    if media_type.strip().lower() != "multipart/form-data" or "boundary=" not in params:
        raise ApiError("unsupported_media_type", "send the audio as multipart/form-data")
    body = await _bounded_body(request, max_bytes + FIELDS_ROOM, max_bytes)
    boundary = params.split("boundary=", 1)[1].split(";")[0].strip().strip('"').encode()
    _check_headers(body, boundary)

    async def once() -> AsyncGenerator[bytes, None]:
        yield body

    parser = _InMemory(
        request.headers, once(), max_files=1, max_fields=MAX_FIELDS, max_part_size=FIELDS_ROOM
    )
    try:
        form = await parser.parse()
    except MultiPartException as error:
        raise ApiError("invalid_multipart", f"the multipart body: {error.message}") from None
    unknown = sorted(set(form.keys()) - KNOWN)
    if unknown:
        raise ApiError("invalid_multipart", f"unknown fields: {', '.join(unknown)[:200]}")
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise ApiError(
            "audio_missing", "no `file` part: send the audio as the field `file`", param="file"
        )
    data = await upload.read()
    await form.close()
    if len(data) > max_bytes:
        raise _too_large(max_bytes)
    fields = {k: v for k, v in form.multi_items() if isinstance(v, str)}
    _no_stream(fields)
    granularities = form.getlist("timestamp_granularities[]")
    return TranscriptionForm(
        data=data,
        model=_text(fields, "model", 256),
        language=_language(fields.get("language")),
        prompt=_text(fields, "prompt", MAX_PROMPT_CHARS),
        response_format=_format(fields.get("response_format")),
        temperature=_temperature(fields.get("temperature")),
        words=_words(granularities or form.getlist("timestamp_granularities")),
    )


async def _bounded_body(request: Request, limit: int, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(max_bytes)
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise _too_large(max_bytes)
    except ClientDisconnect:
        raise ApiError("body_cut_off", "the body was cut off") from None
    return bytes(body)


def _check_headers(body: bytes, boundary: bytes) -> None:
    """Each part's headers within HEADER_BYTES, read before the parser buffers them."""
    delimiter = b"--" + boundary
    at = body.find(delimiter)
    while at != -1:
        start = at + len(delimiter)
        if body[start : start + 2] == b"--":  # the closing delimiter
            return
        end = body.find(b"\r\n\r\n", start)
        if end == -1 or end - start > HEADER_BYTES:
            raise ApiError(
                "invalid_multipart", f"a part's headers are over {HEADER_BYTES // 1024} KiB"
            )
        at = body.find(b"\r\n" + delimiter, end)
        at = at + 2 if at != -1 else -1


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(
        "audio_too_large", f"the audio is over SPEECH_MAX_BYTES ({max_bytes} bytes)", param="file"
    )


def _text(fields: dict[str, str], name: str, limit: int) -> str | None:
    value = fields.get(name)
    if value is not None and len(value) > limit:
        raise ApiError("invalid_multipart", f"{name}: at most {limit} characters", param=name)
    return value or None


def _language(value: str | None) -> str | None:
    if not value:
        return None
    if not LANGUAGE.fullmatch(value):
        raise ApiError(
            "invalid_multipart", "language: an ISO-639-1 code such as 'en'", param="language"
        )
    return value


def _format(value: str | None) -> str:
    if not value:
        return "json"
    if value not in FORMATS:
        raise ApiError(
            "unsupported_response_format",
            f"response_format must be one of {', '.join(FORMATS)}",
            param="response_format",
        )
    return value


def _temperature(value: str | None) -> float:
    if not value:
        return 0.0
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0.0 <= number <= 1.0:
        raise ApiError(
            "invalid_multipart", "temperature: a number from 0 to 1", param="temperature"
        )
    return number


def _words(values: Sequence[object]) -> bool:
    if any(v not in ("segment", "word") for v in values):
        raise ApiError(
            "invalid_multipart",
            "timestamp_granularities[]: segment or word",
            param="timestamp_granularities[]",
        )
    return "word" in values


def _no_stream(fields: dict[str, str]) -> None:
    if fields.get("stream", "false").lower() not in ("false", "0", ""):
        raise ApiError("invalid_multipart", "stream: not supported (false only)", param="stream")
