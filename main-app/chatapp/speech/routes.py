"""`POST /api/transcribe`: the page's recording, as text (docs/api.md, "Voice").

    POST /api/transcribe   multipart/form-data, one `file` field (webm/opus, ogg, mp4, wav, ...)
                           -> 200 {"text": "..."} ("" when no speech was heard)

The guards of the app's other large bodies hold (guards/uploads.py: a body over
MAX_REQUEST_BYTES takes one of MAX_IMAGE_CHATS slots, else 503 `busy`; guards/body_deadline.py:
408 `request_timeout`), and of its other writes (accounts/: the cross-site check, the sign-in's
401). The body is read up to the app's largest (`largest_body`, about 35 MiB by default);
the model service's own limits (SPEECH_MAX_BYTES, SPEECH_MAX_SECONDS) are relayed as
sentences (relay/upstream_speech.py). The form is parsed into memory: a file part is never
spooled to disk, as Werkzeug would do past 500 KB.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import IO, Any

from flask import Blueprint, Response, current_app, jsonify, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge
from werkzeug.formparser import FormDataParser

from chatapp.accounts import current_user
from chatapp.errors import ApiError
from chatapp.guards.body_deadline import LATE
from chatapp.guards.uploads import FULL
from chatapp.observability.logs import request_id
from chatapp.relay.images import body_limit
from chatapp.relay.upstream import DEFAULT_RETRY_AFTER, Recording

bp = Blueprint("speech", __name__)

MAX_PARTS = 8  # the file and a few fields a client may add; more is not a recording
TYPE_CHARS = 100


@bp.post("/api/transcribe")
def transcribe() -> Response:
    if request.environ.get(FULL):  # guards/uploads.py
        seconds = DEFAULT_RETRY_AFTER
        raise ApiError(
            "busy",
            f"The chat app is taking as many large uploads as it can; try again in {seconds} s.",
            status=503,
            retry_after=seconds,
        )
    late = request.environ.get(LATE)
    if late is not None:  # guards/body_deadline.py
        message = f"The recording did not arrive within {late:g} seconds."
        raise ApiError("request_timeout", message, status=408)
    if request.mimetype != "multipart/form-data":
        raise ApiError(
            "unsupported_media_type",
            "Send the recording as multipart/form-data, in a `file` field.",
            status=415,
        )
    current_user()  # who is asking, before the body is read: a 401 first
    recording = _recording()
    rid = request_id(request.headers.get("X-Request-Id"))
    text = current_app.extensions["upstream"].transcribe(recording, rid)
    response = jsonify({"text": text})
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Request-Id"] = rid
    return response


def largest_body(config: Mapping[str, Any]) -> int:
    """The largest body the app reads at all (create_app's BodyDeadline bound): a chat's with
    its images, or an import's."""
    return body_limit(config, max(config["MAX_CONTENT_LENGTH"], config["MAX_IMPORT_BYTES"]))


def _in_memory(
    total_content_length: int | None,
    content_type: str | None,
    filename: str | None,
    content_length: int | None = None,
) -> IO[bytes]:
    return io.BytesIO()


def _recording() -> Recording:
    limit = largest_body(current_app.config)
    request.max_content_length = limit
    parser = FormDataParser(
        stream_factory=_in_memory,
        # Werkzeug's decoder counts a file's undecoded buffer against this too (a wav's
        # bytes were refused past 64 KiB): the body's own bound holds everything.
        max_form_memory_size=limit,
        max_content_length=limit,
        silent=False,
        max_form_parts=MAX_PARTS,
    )
    try:
        _, _, files = parser.parse(
            request.stream, request.mimetype, request.content_length, request.mimetype_params
        )
    except RequestEntityTooLarge:
        raise ApiError(
            "audio_too_large",
            f"The recording is too large: send at most {limit / 1024 / 1024:.0f} MB.",
            status=413,
        ) from None
    except (HTTPException, ValueError):
        raise ApiError("invalid_request", "The form could not be read.", status=400) from None
    except OSError:  # the server could not read it: a cut-off body
        raise ApiError(
            "invalid_request", "The request body could not be read.", status=400
        ) from None
    found = files.getlist("file")
    if len(found) != 1:
        raise ApiError("audio_missing", "Send one recording, in a `file` field.", status=400)
    file = found[0]
    data = file.stream.read()
    if not data:
        raise ApiError("audio_empty", "The recording holds no sound.", status=400)
    return Recording(data, _name(file.filename), _kind(file.mimetype))


def _name(filename: Any) -> str:
    """A plain name for the model service (it tells the format by the bytes, not the name)."""
    name = filename if isinstance(filename, str) else ""
    return "".join(c for c in name if c.isalnum() or c in "._-")[:64] or "recording"


def _kind(mimetype: str) -> str:
    kind = mimetype.strip()[:TYPE_CHARS]
    return kind if kind.isascii() and kind else "application/octet-stream"
