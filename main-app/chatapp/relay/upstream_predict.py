"""Our sidecar's `POST /predict` (UPSTREAM_API=predict, the default).

The request asks for `Accept: application/x-ndjson`: `{"progress"}` events while a long prompt
is read, `{"text"}` events, then a `done` event
that says how the reply ended (`finish_reason`) and its counts, or an `error` event. A sidecar
that answers `text/plain` (before it had events) still works: its chunks are the text, UTF-8
decoded incrementally so a character split across chunks stays whole, and the end of the stream
is the end of the reply, without a finish reason. Refusals are the sidecar's envelope
(`{"error": {"message", "type", "phase"?}}`, phi3-sidecar/sidecar/web/errors.py).

A message with images goes as its list of content parts (`text` and `image_url` with a `data:`
URL), which `/predict` takes as `/v1/chat/completions` does; a text-only one as its string, as
before. The sidecar's `/readyz` says `image_input` once its model is loaded (chatapp/health.py
lets the page see it).
"""

from __future__ import annotations

import codecs
import json
import logging
from collections.abc import Iterator
from typing import Any

import requests

from chatapp.errors import ApiError
from chatapp.relay import upstream_speech
from chatapp.relay.upstream import (
    Broken,
    Connection,
    Done,
    Event,
    Progress,
    Recording,
    ReplyStream,
    Text,
    busy,
    context_overflow,
    host_refused,
    int_or_none,
    lines,
    not_ready,
    payload_too_large,
    refused,
    unauthorized,
    upstream_failed,
)
from chatapp.relay.upstream_speech import speech_of

# The name its log lines have always carried, not the module's path.
log = logging.getLogger("chatapp.upstream_predict")

TRANSCRIPTIONS_PATH = "/v1/audio/transcriptions"
SPEECH_MODEL = "whisper-1"  # any name: the sidecar answers with its own speech model


class PredictUpstream:
    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self.base_url = connection.base_url

    def start(self, payload: dict[str, Any], request_id: str) -> ReplyStream:
        headers = {"Accept": "application/x-ndjson", "X-Request-Id": request_id}
        response = self._connection.post_stream("/predict", payload, headers)
        if response.status_code != 200:
            with response:
                error = _refusal(response)
            log.warning("sidecar answered %s; relayed as %s", response.status_code, error.type)
            raise error
        return ReplyStream(response, events)

    def readiness(self) -> dict[str, Any]:
        answer = self._connection.get_json("/readyz")
        if answer is None:
            return {"reachable": False, "ready": False}
        status, body = answer
        result: dict[str, Any] = {"reachable": True, "ready": status == 200}
        # /v1/models takes the key whenever the sidecar has API_KEY, and costs it nothing:
        # whether the key is refused, and the speech model's limits.
        models = self._connection.get_json("/v1/models") if status == 200 else None
        if isinstance(body, dict):
            listed = models[1] if models is not None and models[0] == 200 else None
            speech = speech_of(body.get("speech"), listed)
            result["detail"] = {**body, "speech": speech} if speech else body
        if models is not None and models[0] == 401:
            # /readyz is open to probes, so it said ready while every chat was refused 401.
            result["ready"] = False
            result["error"] = "upstream_unauthorized"
            if isinstance(body, dict):
                result["detail"] = {**result["detail"], "ready": False, "phase": "failed"}
        return result

    def transcribe(self, recording: Recording, request_id: str) -> str:
        return upstream_speech.transcribe(
            self._connection, TRANSCRIPTIONS_PATH, SPEECH_MODEL, recording, request_id
        )


def events(response: requests.Response) -> Iterator[Event]:
    if response.headers.get("Content-Type", "").startswith("application/x-ndjson"):
        yield from _ndjson(response)
    else:
        yield from _plain(response)


def _ndjson(response: requests.Response) -> Iterator[Event]:
    for line in lines(response):
        if not line.strip():
            continue
        event = json.loads(line)
        if "text" in event:
            yield Text(str(event["text"]))
        elif "progress" in event:  # a long prompt being read (docs/api.md)
            if (progress := Progress.of(event["progress"])) is not None:
                yield progress
        elif event.get("done"):
            yield Done(
                finish_reason=_str(event.get("finish_reason")),
                generated_tokens=int_or_none(event.get("generated_tokens")),
                prompt_tokens=int_or_none(event.get("prompt_tokens")),
                cached_tokens=int_or_none(event.get("cached_tokens")),
                dropped_messages=int_or_none(event.get("dropped_messages")),
                passage_cached_tokens=int_or_none(event.get("passage_cached_tokens")),
            )
            return
        elif "error" in event:
            yield Broken(timed_out=False)
            return


def _plain(response: requests.Response) -> Iterator[Event]:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for chunk in response.iter_content(chunk_size=None):
        if text := decoder.decode(chunk):
            yield Text(text)
    if tail := decoder.decode(b"", final=True):
        yield Text(tail)
    yield Done(
        prompt_tokens=_int_header(response, "X-Prompt-Tokens"),
        cached_tokens=_int_header(response, "X-Cached-Tokens"),
        dropped_messages=_int_header(response, "X-Dropped-Messages"),
        passage_cached_tokens=_int_header(response, "X-Passage-Cached-Tokens"),
    )


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int_header(response: requests.Response, name: str) -> int | None:
    raw = response.headers.get(name, "")
    return int(raw) if raw.isdigit() else None


def _error_body(response: requests.Response) -> tuple[str, str, str]:
    """(message, type, phase) from the sidecar's error envelope; empty strings where absent."""
    try:
        error = response.json().get("error", {})
        fields = error.get("message", ""), error.get("type", ""), error.get("phase", "")
    except (ValueError, AttributeError):
        return "", "", ""
    message, type, phase = (field if isinstance(field, str) else "" for field in fields)
    return message, type, phase


def _refusal(response: requests.Response) -> ApiError:
    """The ApiError for a sidecar answer that is not a 200 stream.

    The sidecar's error types (phi3-sidecar/sidecar/web/errors.py): `not_ready` (503, with the
    `phase`: starting, downloading, loading, warming_up, restarting, or failed), `overloaded`
    (503, its queue is full),
    `context_length_exceeded` and `body_too_large` (413), `invalid_request` and others (4xx).
    """
    status = response.status_code
    message, type, phase = _error_body(response)
    if status == 503:
        return not_ready(phase, response) if type == "not_ready" else busy(response)
    if status == 401:  # the sidecar has an API_KEY, and ours is missing or wrong
        return unauthorized()
    if status == 400 and type == "invalid_host":  # its ALLOWED_HOSTS, not the conversation
        return host_refused()
    if status == 413:
        return payload_too_large() if type == "body_too_large" else context_overflow()
    if 400 <= status < 500 and message:
        # The sidecar's validation messages name the field and never echo the input.
        return refused(message)
    return upstream_failed()
