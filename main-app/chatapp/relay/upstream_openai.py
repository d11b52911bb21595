"""Any OpenAI-compatible server's `POST /v1/chat/completions` (UPSTREAM_API=openai).

Our sidecar's `/v1`, App Service's built-in model sidecars, Ollama, llama.cpp's `llama-server`,
Foundry Local and vLLM all speak it; they differ in what they send, and the reader takes each
difference as it comes:

- The request streams (`stream: true`) and asks for the usage chunk
  (`stream_options.include_usage`); a server that sends none leaves the counts out.
- Server-sent events: `data: <chunk>` lines; comment lines (`: keep-alive`) and other fields
  (`event:`, `id:`) are skipped; `data: [DONE]` ends the stream, and a stream that ends after
  a chunk with a `finish_reason` but without `[DONE]` is complete too. One that ends with
  neither broke off.
- An error mid-stream (`data: {"error": {...}}`, as llama-server and vLLM send it) breaks the
  reply with the server's message. Before any text, one with the code of a refusal our
  sidecar sends in its stream once the stream has started early (`STREAM_START_AFTER_S`:
  `context_length_exceeded`, `overloaded`, `model_not_ready`) is that refusal, as if it had
  been the HTTP status. Chunks with an empty content (the sidecar's keep-alives) add nothing;
  one with a `progress` member (our sidecar, while it reads a long prompt) is a `Progress`,
  one with a `loading` member (our sidecar, while the model asked for loads) a `Loading`.
- The model: the chat's `model` (the page's picker, from `GET /api/models`: this server's
  list, `models`), else `UPSTREAM_MODEL`, else the first one `GET /v1/models` lists (asked
  once, and again while none is known). A 404 for a model the chat named is
  `model_not_found`; for the app's own, a setting to fix. Readiness is that list naming a
  model; a server without the list (404) counts as ready when `UPSTREAM_MODEL` names the
  model, and its picker lists that one.
- The conversation's `cache_scope` goes as `prompt_cache_key` (our sidecar's cache scope; other
  servers ignore it); `min_new_tokens` has no OpenAI equivalent and is left out.
- Messages go as the app checked them: a message with images as its content parts
  (`image_url` with a `data:` URL, OpenAI's own format), unchanged. Whether the model reads
  images is known only when the model list's entry says `input_modalities` (our sidecar's
  does); otherwise the page offers images and the server's 400 shows as the chat's error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import requests

from chatapp.errors import ApiError
from chatapp.relay import upstream_models, upstream_speech
from chatapp.relay.upstream import (
    NOT_REACHABLE,
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
    trimmed,
    unauthorized,
    upstream_failed,
)
from chatapp.relay.upstream_speech import speech_of

# The name its log lines have always carried, not the module's path.
log = logging.getLogger("chatapp.upstream_openai")

CHAT_PATH = "/chat/completions"
TRANSCRIPTIONS_PATH = "/audio/transcriptions"
MODELS_PATH = "/models"


# Seconds a chat refused because the model list was busy waits before its retry (the sidecar's
# own Retry-After for a busy answer).
BUSY_RETRY_AFTER = 2


class OpenAIUpstream:
    def __init__(
        self, connection: Connection, model: str | None, speech_model: str = "whisper-1"
    ) -> None:
        self._connection = connection
        self.base_url = connection.base_url
        self._configured = model
        self._speech_model = speech_model
        self._discovered: str | None = None
        self._models_status: int | None = None  # the model list's last answer (None: none)
        # The API's root: SIDECAR_URL may name the server (http://host:11434) or its /v1.
        self._root = "" if connection.base_url.endswith("/v1") else "/v1"

    @property
    def model(self) -> str | None:
        if self._configured:
            return self._configured
        if self._discovered is None:
            self._discovered = self._first_model()
        return self._discovered

    def start(self, payload: dict[str, Any], request_id: str) -> ReplyStream:
        named = payload.get("model")  # the chat's own choice (wire.py), else the app's
        model = named or self.model
        if model is None:
            raise self._no_model()
        body: dict[str, Any] = {
            "model": model,
            "messages": payload["messages"],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if "max_new_tokens" in payload:
            body["max_tokens"] = payload["max_new_tokens"]
        if "temperature" in payload:
            body["temperature"] = payload["temperature"]
        if "cache_scope" in payload:
            body["prompt_cache_key"] = payload["cache_scope"]
        headers = {"Accept": "text/event-stream", "X-Request-Id": request_id}
        response = self._connection.post_stream(self._root + CHAT_PATH, body, headers)
        if response.status_code != 200:
            with response:
                error = model_not_found(named) if named and response.status_code == 404 else None
                error = error or _refusal(response)
            log.warning(
                "the model service answered %s; relayed as %s", response.status_code, error.type
            )
            if response.status_code == 404 and not named:
                self._discovered = None  # the model may have changed: ask again next time
            raise error
        return ReplyStream(response, events)

    def readiness(self) -> dict[str, Any]:
        answer = self._connection.get_json(self._root + MODELS_PATH)
        if answer is None:
            return {"reachable": False, "ready": False}
        status, body = answer
        ready = status == 200 and bool(_model_ids(body))
        if ready and not self._configured:
            self._discovered = _model_ids(body)[0]
        if status in (404, 405) and self._configured:
            # A server without a model list: it answers, and the model is named; whether that
            # model is loaded only a chat can tell.
            ready = True
        phase = "ready" if ready else ("failed" if status in (401, 403) else "loading")
        detail: dict[str, Any] = {"ready": ready, "phase": phase}
        if ready:
            detail["model"] = self._configured or self._discovered
            image_input = _image_input(body, detail["model"])
            if image_input is not None:
                detail["image_input"] = image_input
            speech = speech_of(None, body)  # a model of type "transcription" (our sidecar's)
            if speech is not None:
                detail["speech"] = speech
        return {"reachable": True, "ready": ready, "detail": detail}

    def transcribe(self, recording: Recording, request_id: str) -> str:
        path = self._root + TRANSCRIPTIONS_PATH
        return upstream_speech.transcribe(
            self._connection, path, self._speech_model, recording, request_id
        )

    def models(self) -> list[ChatModel]:
        status, body = upstream_models.fetch(self._connection, self._root + MODELS_PATH)
        if status in (404, 405) and self._configured:
            return [ChatModel(self._configured, default=True)]  # a server without the list
        if status != 200:
            raise upstream_models.refusal(status, body)
        # The model a chat naming none gets: UPSTREAM_MODEL, else the first listed (`model`)
        default = self._configured or upstream_models.first_id(body)
        return upstream_models.chat_models(body, default)

    def _first_model(self) -> str | None:
        answer = self._connection.get_json(self._root + MODELS_PATH)
        self._models_status = None if answer is None else answer[0]
        ids = _model_ids(answer[1]) if answer is not None and answer[0] == 200 else []
        return ids[0] if ids else None

    def _no_model(self) -> ApiError:
        """Why no model could be named: the real cause of the model list's answer (a refused
        key once read as "lists no model")."""
        status = self._models_status
        if status in (401, 403):
            return unauthorized()
        if status is None:
            return ApiError("upstream_unavailable", NOT_REACHABLE, status=503)
        if status == 400:
            return host_refused()
        if status in (429, 503):  # busy (its connection cap, a queue): not a missing model
            seconds = BUSY_RETRY_AFTER
            return ApiError(
                "busy",
                f"The model is busy with other replies; trying again in {seconds} s.",
                status=503,
                retry_after=seconds,
            )
        if status == 200:
            message = "The model service lists no model; set UPSTREAM_MODEL to the one to use."
        else:
            message = (
                f"The model service's model list answered {status}; set UPSTREAM_MODEL to the "
                "model to use."
            )
        return ApiError("upstream_error", message, status=502)


def _model_ids(body: Any) -> list[str]:
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return []
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


def _image_input(body: Any, model: str | None) -> bool | None:
    """Whether the model list says `model` reads images (its entry's `input_modalities`, as
    our sidecar's /v1/models gives it); None: it does not say (most servers), so the page
    offers images and the server's own refusal shows."""
    data = body.get("data") if isinstance(body, dict) else None
    for entry in data if isinstance(data, list) else ():
        if isinstance(entry, dict) and entry.get("id") == model:
            modalities = entry.get("input_modalities")
            if isinstance(modalities, list):
                return "image" in modalities
    return None


def events(response: requests.Response) -> Iterator[Event]:
    finish: str | None = None
    usage: dict[str, Any] = {}
    said = False  # any text yet
    for line in lines(response):
        if not line.startswith(b"data:"):
            continue  # comments (": keep-alive"), event:, id:, retry:, blank separators
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            continue
        if "error" in chunk:
            refusal = None if said else _stream_refusal(chunk["error"])
            if refusal is not None:
                yield Refused(refusal)
            else:
                yield Broken(timed_out=False, message=_error_message(chunk["error"]))
            return
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        if not said and (progress := Progress.of(chunk.get("progress"))) is not None:
            yield progress  # our sidecar's extension: a long prompt being read
        if not said and (loading := Loading.of(chunk.get("loading"))) is not None:
            yield loading  # our sidecar's extension: the model asked for is loading
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            content = (choice.get("delta") or {}).get("content")
            if isinstance(content, str) and content:
                said = True
                yield Text(content)
            if isinstance(choice.get("finish_reason"), str):
                finish = choice["finish_reason"]
    else:
        if finish is None:  # ended with neither [DONE] nor a finish: broken off
            return
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    yield Done(
        finish_reason=finish,
        generated_tokens=int_or_none(usage.get("completion_tokens")),
        prompt_tokens=int_or_none(usage.get("prompt_tokens")),
        cached_tokens=int_or_none(cached),
    )


def _error_message(error: Any) -> str | None:
    message = error.get("message") if isinstance(error, dict) else error
    if not isinstance(message, str) or not message.strip():
        return None
    return f"The model service stopped: {trimmed(message)}."


def _stream_refusal(error: Any) -> ApiError | None:
    """The refusal an error event stands for (our sidecar's codes, what it answers with an
    HTTP status when its stream has not started); None: a failure of the server's own."""
    code = error.get("code") if isinstance(error, dict) else None
    if code == "context_length_exceeded":
        return context_overflow()
    if code == "overloaded":
        return busy(None)
    if code == "model_not_ready":
        phase = error.get("phase")
        return not_ready(phase if isinstance(phase, str) else "", None)
    return None


def _error_of(response: requests.Response) -> tuple[str, str, str]:
    """(message, type, code) from an OpenAI-style error body; empty strings where absent."""
    try:
        error = response.json().get("error", {})
    except (ValueError, AttributeError):
        return "", "", ""
    if isinstance(error, str):  # some servers answer {"error": "text"}
        return error, "", ""
    if not isinstance(error, dict):
        return "", "", ""
    fields = (error.get("message"), error.get("type"), error.get("code"))
    message, kind, code = (f if isinstance(f, str) else "" for f in fields)
    return message, kind, code


def _refusal(response: requests.Response) -> ApiError:
    """The ApiError for an answer that is not a 200 stream, whichever server gave it."""
    status = response.status_code
    message, kind, code = _error_of(response)
    if status in (401, 403):
        return unauthorized()
    if status == 400 and code == "invalid_host":  # our sidecar's ALLOWED_HOSTS
        return host_refused()
    if status == 429 or (status == 503 and code in ("overloaded", "")):
        return busy(response)
    if status == 503:  # our sidecar: model_not_ready, with its phase
        return not_ready(_phase(response), response)
    if code == "context_length_exceeded" or "context" in kind or "context" in code:
        return context_overflow()
    if status == 413:
        return payload_too_large()
    if status == 404:
        return ApiError(
            "upstream_error",
            f"The model service does not know the model ({trimmed(message) or 'not found'}); "
            "set UPSTREAM_MODEL to one it lists.",
            status=502,
        )
    if 400 <= status < 500 and trimmed(message):
        return refused(message)
    return upstream_failed()


def _phase(response: requests.Response) -> str:
    try:
        error = response.json().get("error", {})
        phase = error.get("phase", "") if isinstance(error, dict) else ""
    except (ValueError, AttributeError):
        return ""
    return phase if isinstance(phase, str) else ""
