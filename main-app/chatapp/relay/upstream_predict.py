"""Our sidecar's `POST /predict` (UPSTREAM_API=predict, the default).

The request asks for `Accept: application/x-ndjson`: `{"loading"}` events while the model asked
for loads (`model`, with several models: docs/api.md "Several models"), `{"progress"}` events
while a long prompt is read, `{"text"}` events, then a `done` event that says how the reply
ended (`finish_reason`) and its counts, or an `error` event: before any text, a refusal of a
stream that started early for a model that loads (relayed as the refusal it is), after it a
failure. A model the sidecar does not serve is its 404 (`model_not_found`). A sidecar
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
from chatapp.relay import upstream_models, upstream_speech
from chatapp.relay.upstream import (
    Broken,
    ChatModel,
    Connection,
    Done,
    Event,
    Loading,
    Progress,
    Recording,
    Refused,
    ReplyStream,
    Text,
    busy,
    context_overflow,
    host_refused,
    int_or_none,
    lines,
    model_not_found,
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
MODELS_PATH = "/v1/models"
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
                error = _refusal(response, payload.get("model"))
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
        models = self._connection.get_json(MODELS_PATH) if status == 200 else None
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

    def models(self) -> list[ChatModel]:
        status, body = upstream_models.fetch(self._connection, MODELS_PATH)
        if status != 200:
            raise upstream_models.refusal(status, body)
        return upstream_models.chat_models(body)


def events(response: requests.Response) -> Iterator[Event]:
    if response.headers.get("Content-Type", "").startswith("application/x-ndjson"):
        yield from _ndjson(response)
    else:
        yield from _plain(response)


def _ndjson(response: requests.Response) -> Iterator[Event]:
    said = False  # any text yet
    for line in lines(response):
        if not line.strip():
            continue
        event = json.loads(line)
        if "text" in event:
            said = True
            yield Text(str(event["text"]))
        elif "loading" in event:  # the model asked for is loading (several models)
            if (loading := Loading.of(event["loading"])) is not None:
                yield loading
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
            refusal = None if said else _stream_refusal(event["error"])
            yield Broken(timed_out=False) if refusal is None else Refused(refusal)
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


def _stream_refusal(error: object) -> ApiError | None:
    """The refusal an `error` line before any text stands for: the sidecar started the stream
    at once for a model that loads (its `loading` lines), then could not answer (the model
    failed to load, no memory for it, the conversation too long or with images for it). None:
    not one of those (a generation that failed: a broken reply)."""
    if not isinstance(error, dict):
        return None
    fields = (error.get("message"), error.get("type"), error.get("phase"))
    message, type, phase = (field if isinstance(field, str) else "" for field in fields)
    if type == "not_ready":
        # Its sentence names the phase ("the model is not ready (failed: ...)") when the line
        # carries none: a model that failed to load is not retried for ever.
        phase = phase or ("failed" if "(failed" in message else "loading")
        return not_ready(phase, None)
    if type == "overloaded":
        return busy(None)
    if type == "context_length_exceeded":
        return context_overflow()
    # Written out, not a tuple: tests/test_contracts.py checks each type against the sidecar's
    if type == "image_input_unsupported" or type == "invalid_image" or type == "invalid_request":
        return refused(message) if message else upstream_failed()
    return None


def _refusal(response: requests.Response, model: str | None = None) -> ApiError:
    """The ApiError for a sidecar answer that is not a 200 stream (`model`: the one the chat
    named, which a 404 says the sidecar does not serve).

    The sidecar's error types (phi3-sidecar/sidecar/web/errors.py): `not_ready` (503, with the
    `phase`: starting, downloading, loading, warming_up, restarting, or failed), `overloaded`
    (503, its queue is full),
    `context_length_exceeded` and `body_too_large` (413), `not_found` (404: with several
    models, one it does not serve), `invalid_request` and others (4xx).
    """
    status = response.status_code
    message, type, phase = _error_body(response)
    if status == 404 and model is not None:
        return model_not_found(model)
    return _refused_as(status, message, type, phase, response)


def _refused_as(
    status: int, message: str, type: str, phase: str, response: requests.Response | None
) -> ApiError:
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
