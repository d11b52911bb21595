"""Every refusal's status and type (REFUSALS), and one error shape for every failure:
{"error": {"message": ..., "type": ...}}, or under /v1/ OpenAI's
{"error": {"message", "type", "param", "code"}}.

Handlers are registered in the factory, so no path answers with FastAPI's {"detail": ...} or
with a stack trace; exception text never reaches a client.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("sidecar.web.errors")

RETRY_NOT_READY_S = 5
RETRY_OVERLOADED_S = 2


@dataclass(frozen=True)
class Answer:
    status: int  # /predict and the probes: the sidecar's own envelope
    type: str
    openai_status: int  # /v1/...: OpenAI's statuses, types and codes (what its SDK expects)
    openai_code: str | None
    openai_type: str = "invalid_request_error"


# Every reason the sidecar refuses a request for, and its answer: the one place where an
# error status is decided. Routes and the pipeline raise ApiError(reason, ...); the model worker
# reports ipc.Rejected(reason, ...) (ipc.Refusal); Starlette's and FastAPI's own errors are
# mapped by the handlers below. A request to /v1/... gets OpenAI's column (chat_completions/api.py);
# /predict's statuses are the original sample's clients' contract and do not change.
REFUSALS: dict[str, Answer] = {
    # the request body (pipeline.read_body)
    "unsupported_media_type": Answer(415, "unsupported_media_type", 415, "unsupported_media_type"),
    "body_too_large": Answer(413, "body_too_large", 413, "request_too_large"),
    "body_cut_off": Answer(400, "invalid_request", 400, "invalid_body"),
    "invalid_encoding": Answer(400, "invalid_encoding", 400, "invalid_encoding"),
    "invalid_json": Answer(400, "invalid_json", 400, "invalid_json"),
    "invalid_field": Answer(422, "invalid_request", 400, "invalid_value"),
    "request_timeout": Answer(408, "request_timeout", 408, "request_timeout"),
    # who is asking (guards/access.py)
    "unauthorized": Answer(401, "unauthorized", 401, "invalid_api_key"),
    "invalid_host": Answer(400, "invalid_host", 400, "invalid_host"),
    # the path and method (Starlette), the model asked for
    "not_found": Answer(404, "not_found", 404, "not_found"),
    "model_not_found": Answer(404, "not_found", 404, "model_not_found"),
    "response_not_found": Answer(404, "not_found", 404, "response_not_found"),
    # a model pinned or answering, asked to unload (web/models/api.py)
    "model_busy": Answer(409, "conflict", 409, "model_busy"),
    "method_not_allowed": Answer(405, "method_not_allowed", 405, "method_not_allowed"),
    # the service's state (pipeline): clients retry after Retry-After
    "not_ready": Answer(503, "not_ready", 503, "model_not_ready", "server_error"),
    "overloaded": Answer(503, "overloaded", 503, "overloaded", "server_error"),
    # the connection cap (guards/connections.py): answered by the HTTP protocol, before any route.
    # /v1's code is "overloaded", what OpenAI clients (and the chat app) read as "retry later".
    "too_many_connections": Answer(503, "too_many_connections", 503, "overloaded", "server_error"),
    # the model worker (ipc.Refusal) and the generation
    "context_length_exceeded": Answer(
        413, "context_length_exceeded", 400, "context_length_exceeded"
    ),
    "unencodable_prompt": Answer(400, "invalid_request", 400, "invalid_prompt"),
    # a response_format schema or tool parameters llguidance cannot compile (model/guidance.py)
    "invalid_guidance": Answer(422, "invalid_request", 400, "invalid_schema"),
    # images (images/decoding.py): each checked in the web process before the model sees it; an
    # image the model's image processor refused anyway (ipc.Refusal) is invalid_image too
    "invalid_image": Answer(400, "invalid_image", 400, "invalid_image"),
    "image_too_large": Answer(400, "image_too_large", 400, "image_too_large"),
    "too_many_images": Answer(400, "too_many_images", 400, "too_many_images"),
    "unsupported_image_url": Answer(400, "unsupported_image_url", 400, "unsupported_image_url"),
    # the images of requests in flight fill IMAGE_MEMORY_MB (images/memory.py): retry later
    "images_busy": Answer(503, "images_busy", 503, "overloaded", "server_error"),
    # an image for a model that reads text only (generation/pipeline.py, after readiness)
    "image_input_unsupported": Answer(
        400, "image_input_unsupported", 400, "image_input_unsupported"
    ),
    # /v1/embeddings (embeddings/api.py): the encoder, and its inputs
    "embeddings_not_served": Answer(400, "embeddings_not_served", 400, "embeddings_not_served"),
    "invalid_input": Answer(400, "invalid_input", 400, "invalid_input"),
    "too_many_inputs": Answer(400, "too_many_inputs", 400, "too_many_inputs"),
    "input_too_long": Answer(400, "input_too_long", 400, "context_length_exceeded"),
    "too_many_characters": Answer(400, "too_many_characters", 400, "too_many_characters"),
    "dimensions_unsupported": Answer(400, "dimensions_unsupported", 400, "invalid_value"),
    # speech (web/audio/): /v1/audio/transcriptions and input_audio parts
    "speech_not_served": Answer(404, "speech_not_served", 404, "speech_not_served"),
    "audio_input_unsupported": Answer(
        400, "audio_input_unsupported", 400, "audio_input_unsupported"
    ),
    "audio_missing": Answer(400, "audio_missing", 400, "audio_missing"),
    "audio_empty": Answer(400, "audio_empty", 400, "audio_empty"),
    "audio_too_large": Answer(413, "audio_too_large", 413, "audio_too_large"),
    "audio_too_long": Answer(400, "audio_too_long", 400, "audio_too_long"),
    "invalid_audio": Answer(400, "invalid_audio", 400, "invalid_audio"),
    "invalid_multipart": Answer(400, "invalid_multipart", 400, "invalid_multipart"),
    "unsupported_response_format": Answer(
        400, "unsupported_response_format", 400, "unsupported_response_format"
    ),
    "no_speech": Answer(400, "no_speech", 400, "no_speech"),
    "start_failed": Answer(500, "internal_error", 500, None, "server_error"),
    "generation_failed": Answer(500, "internal_error", 500, None, "server_error"),
    # a finished structured reply that fails its final check (structured/reply_check.py)
    "invalid_reply": Answer(500, "invalid_reply", 500, "invalid_reply", "server_error"),
    # anything unexpected
    "internal_error": Answer(500, "internal_error", 500, None, "server_error"),
}

# When each refusal happens, in a sentence: docs/api.md's table is generated from REFUSALS and
# this (scripts/gen_docs.py); a test requires a sentence for every reason.
WHEN: dict[str, str] = {
    "unsupported_media_type": "the body is not `application/json` (for "
    "`/v1/audio/transcriptions`, not `multipart/form-data`)",
    "body_too_large": "the body is over `MAX_BODY_BYTES` (`/predict`, `/v1/chat/completions`, "
    "`/v1/completions`, `/v1/responses`), not counting its images' data URLs, of which "
    "`MAX_IMAGES` of `MAX_IMAGE_BYTES` fit beyond it; for `/v1/embeddings`, over "
    "`EMBED_MAX_BODY_BYTES`",
    "body_cut_off": "the body ended before its `Content-Length`",
    "request_timeout": "the body did not arrive within `REQUEST_BODY_TIMEOUT_S` of the headers "
    "(a stalled or endless body; the connection is closed)",
    "invalid_encoding": "the body is not UTF-8",
    "invalid_json": "the body is not JSON, or is nested too deeply",
    "invalid_field": 'a field is wrong (`"field.path: reason"`; the input is never echoed)',
    "unauthorized": "`API_KEY` is set and the request has no valid `Authorization: Bearer <key>` "
    "(the answer carries `WWW-Authenticate: Bearer`)",
    "invalid_host": "the `Host` is not one of `ALLOWED_HOSTS` (by default the loopback names; "
    "/healthz, /readyz and /metrics answer any)",
    "not_found": "no such path",
    "model_not_found": "`GET /v1/models/{id}` names a model this sidecar does not serve; with "
    "`MODELS_FILE`, any request whose `model` is neither an id nor an alias ([Several "
    "models](#several-models-models_file))",
    "model_busy": "`POST /v1/models/{id}/unload` of a pinned model or one answering requests, "
    "or `/unpin` of the default",
    "response_not_found": "`previous_response_id`, or `GET`/`DELETE /v1/responses/{id}`, names no "
    "response stored for this API key (for `previous_response_id`, in this `prompt_cache_key` "
    "or `user` scope too): never stored (`store: false`, `RESPONSE_STORE_MB=0`), evicted, "
    "deleted, or another caller's (the same answer: whether it exists is not told)",
    "method_not_allowed": "the path exists, not with this method (`Allow` says which)",
    "not_ready": "the model is not ready; `phase` says why: loading (`starting`, `downloading`, "
    "`loading`, `warming_up`; `Retry-After: 5`; for `/v1/embeddings`, the encoder's phase: "
    "`starting`, `downloading`, `loading`), `restarting` (the worker died, stopped "
    "answering or hung while loading, and is being replaced; `Retry-After`: the back-off of "
    "1, 2, 5, 10 or 30 s left plus the last load time), or `failed` (waiting will not help)",
    "overloaded": "the queue is full (`QUEUE_SIZE`; for `/v1/embeddings`, `EMBED_QUEUE_SIZE`; "
    "`Retry-After: 2`); with `MODELS_FILE`, a model that cannot be loaded because the models "
    "answering fill `MODELS_MEMORY_BYTES` (`Retry-After: 5`), or that needs more than all of it",
    "too_many_connections": "the connection opened while `MAX_CONNECTIONS` connections were "
    "open and none was idle (`Retry-After: 2`, `Connection: close`; /healthz, /readyz and "
    "/metrics are answered instead, then closed)",
    "context_length_exceeded": "the newest turn alone does not fit the context; `limit_tokens` "
    "says the limit (older turns are dropped first)",
    "unencodable_prompt": "the messages cannot be encoded by the model's tokenizer (or hold a "
    "lone surrogate, which a tool's `parameters` can bring into the prompt)",
    "invalid_guidance": "a `response_format` schema or a tool's `parameters` that no reply can be "
    "held to: not valid JSON Schema, one the grammar engine cannot compile (an unknown type, a "
    "bad `pattern`, a `$ref` it cannot resolve), one with a value that can only nest itself for "
    "ever (a `$ref` loop, a required property that recurses), or more than 480 properties that "
    "may come next at one place; `param` names the field. Refused before anything is sent, "
    "streamed or not",
    "invalid_image": "an image that cannot be read: not valid base64, a media type other than "
    "`image/png`, `image/jpeg`, `image/webp` or `image/gif`, bytes of another type than the "
    "one declared, a file that is not an image or is truncated, a side under 14 pixels, or a "
    "long side more than 200 times the short one; or, rarely, one the model's image processor "
    "could not read after the web process's checks (the model worker stays up); `param` names "
    "the image's field",
    "image_too_large": "an image over `MAX_IMAGE_BYTES` (its file, after base64) or "
    "`MAX_IMAGE_PIXELS` (read from its header, before anything is decoded), or with a side "
    "over 16384 pixels (the image processor's bound)",
    "too_many_images": "the request holds more than `MAX_IMAGES` images, earlier turns' included",
    "images_busy": "the images of the requests in flight already hold so much of "
    "`IMAGE_MEMORY_MB` that this request's, counted from their headers before any is decoded, "
    "do not fit now (`Retry-After: 2`; not queued)",
    "unsupported_image_url": "an image's URL is not a `data:` URL: the sidecar fetches nothing "
    "(`http(s)` URLs included, so that no caller can make it request an address)",
    "image_input_unsupported": "the request holds images and the model served reads text only "
    "(`/readyz` `image_input`, `/v1/models` `input_modalities`); the message names the model. "
    "Checked after the images themselves and readiness",
    "embeddings_not_served": "`POST /v1/embeddings` on a sidecar with no encoder configured "
    "(`EMBED_MODEL_PATH`, `EMBED_MODEL_ID`); the route exists, so this is not a 404",
    "invalid_input": "an embeddings `input` that is empty (the string, the array, or one of "
    "its items), mixes types, holds a token id outside the encoder's vocabulary or a lone "
    "surrogate; or a `truncate_prompt_tokens` outside 2 to the encoder's limit (or -1); or an "
    "`input_type` with token ids (its prompt is written before texts only)",
    "too_many_inputs": "an embeddings request with more than `EMBED_MAX_INPUTS` inputs",
    "input_too_long": "an embeddings input with more tokens than the encoder reads (256 for "
    "all-MiniLM-L6-v2, 512 for bge-small), and no `truncate_prompt_tokens`; the message names "
    "the input, `limit_tokens` the limit. Never cut silently. A word of more than 100 "
    "characters without a separator counts as the tokens of its 100-character pieces, never "
    "as one unknown token",
    "too_many_characters": "an embeddings input of more characters than its encoder's token "
    "limit times 100 (25,600 for all-MiniLM-L6-v2), or inputs of more than `EMBED_MAX_CHARS` "
    "characters together; checked before anything is tokenized, `limit_chars` says the limit. "
    "With `truncate_prompt_tokens` an input is cut to its first characters within the bound "
    "instead (the tokens beyond them would be cut anyway)",
    "dimensions_unsupported": "`dimensions` other than the encoder's width, on an encoder not "
    "trained for shorter vectors (Matryoshka), or wider than its width",
    "speech_not_served": "`POST /v1/audio/transcriptions` on a sidecar with no speech model "
    "(`SPEECH_MODEL_PATH` unset; `/readyz` `speech.served` and `/v1/models` say so)",
    "audio_input_unsupported": "an `input_audio` part for a sidecar with no speech model: the "
    "chat model reads no audio, and nothing here can turn it into text",
    "audio_missing": "a transcription request without a `file` part (multipart/form-data), or "
    "an `input_audio` part without `data`",
    "audio_empty": "the audio file is empty, or decodes to no samples",
    "audio_too_large": "the audio file is over `SPEECH_MAX_BYTES` (an upload, or an "
    "`input_audio` part after base64)",
    "audio_too_long": "the audio is longer than `SPEECH_MAX_SECONDS`, a request's parts "
    "together, counted in decoded samples (a header's claim is not trusted)",
    "invalid_audio": "the file is not audio the sidecar reads (wav, mp3, ogg, webm, m4a, flac, "
    "aac, told by its first bytes, never by its name or declared type), or it cannot be "
    "decoded; an `input_audio` part whose `data` is not base64 or whose `format` is not one "
    "of those",
    "invalid_multipart": "the transcription body is not `multipart/form-data` that parses: a "
    "part's headers over 8 KiB, more than one file or 16 fields, a field over 64 KiB, an "
    "unknown field (named), or a field's value out of range (`language`, `temperature`, "
    "`timestamp_granularities[]`)",
    "unsupported_response_format": "`response_format` other than json, text, srt, "
    "verbose_json or vtt",
    "no_speech": "a user message whose only content was audio in which no speech was heard: "
    "nothing would reach the model",
    "start_failed": "the model worker could not start the generation",
    "generation_failed": "the generation failed before its first byte (after it, the stream is "
    "cut off instead); a fault of one reply's own (logits that hold NaN, a grammar that leaves no "
    "token) ends that reply alone, never the others decoded with it",
    "invalid_reply": "a structured reply (`response_format`, tool calls) ended but fails its "
    "final check: it is not JSON with each key once, or does not validate against its schema "
    "(what the grammar cannot prevent, such as a key repeated in an object open to other "
    "properties); streamed, an error event ends the stream instead of the final chunk and "
    "`[DONE]`",
    "internal_error": "anything unexpected (logged with the request id; no detail reaches the "
    "client)",
}


def is_openai(path: str) -> bool:
    """Requests whose errors take OpenAI's shape (chat_completions/api.py's routes)."""
    return path == "/v1" or path.startswith("/v1/")


class ApiError(Exception):
    """A refusal: its reason (a key of REFUSALS) and one sentence for the client."""

    def __init__(
        self,
        reason: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.answer = REFUSALS[reason]
        self.reason = reason
        self.status = self.answer.status
        self.kind = self.answer.type
        self.message = message
        self.headers = headers or {}
        self.extra = extra or {}
        self.param = param  # the field at fault, for OpenAI's `param`

    def response(self, path: str) -> JSONResponse:
        """The answer: OpenAI's shape and status for /v1/..., the sidecar's own otherwise."""
        if not is_openai(path):
            return error_response(self.status, self.kind, self.message, self.headers, self.extra)
        return JSONResponse(
            {"error": self.openai_body()},
            status_code=self.answer.openai_status,
            headers=self.headers,
        )

    def openai_body(self) -> dict[str, Any]:
        """OpenAI's error object: {"message", "type", "param", "code"}."""
        answer = self.answer
        return {
            "message": self.message,
            "type": answer.openai_type,
            "param": self.param,
            "code": answer.openai_code,
            **self.extra,
        }


def not_ready(phase: str, reason: str | None, retry_after: int = RETRY_NOT_READY_S) -> ApiError:
    """503: `retry_after` from the real back-off while a worker is replaced (model_client)."""
    detail = f"{phase}: {reason}" if reason else phase
    return ApiError(
        "not_ready",
        f"the model is not ready ({detail})",
        headers={"Retry-After": str(retry_after)},
        extra={"phase": phase},  # for clients: "failed" will not heal by waiting, "loading" will
    )


def overloaded() -> ApiError:
    return ApiError(
        "overloaded",
        "too many requests are waiting for the model; retry later",
        headers={"Retry-After": str(RETRY_OVERLOADED_S)},
    )


def error_response(
    status: int,
    kind: str,
    message: str,
    headers: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": kind, **(extra or {})}},
        status_code=status,
        headers=headers,
    )


_HTTP_REASONS = {404: "not_found", 405: "method_not_allowed"}


def _mark(request: Request, kind: str) -> None:
    record = request.scope.get("state", {}).get("record")
    if record is not None:
        record.error_type = kind


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    _mark(request, exc.kind)
    return exc.response(request.url.path)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 405 and "Allow" in headers:
        # Starlette names the methods of the one route that matched the path; every GET route
        # here has a HEAD twin (probes.py, chat_completions/api.py), so either means both.
        methods = {m.strip() for m in headers["Allow"].split(",")}
        if methods & {"GET", "HEAD"}:
            methods |= {"GET", "HEAD"}
        headers["Allow"] = ", ".join(sorted(methods))
    reason = _HTTP_REASONS.get(exc.status_code)
    if reason is None:  # another status raised by Starlette: kept, with a generic type
        _mark(request, "http_error")
        return error_response(exc.status_code, "http_error", str(exc.detail), headers)
    message = "no such path" if reason == "not_found" else str(exc.detail)
    return await _api_error(request, ApiError(reason, message, headers=headers))


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    error = ApiError("invalid_field", "the request does not match the API")
    return await _api_error(request, error)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    # The traceback without messages (jsonlog.without_messages): one may quote the request.
    record = request.scope.get("state", {}).get("record")
    fields = {"error_type": type(exc).__name__}
    if record is not None:
        fields["request_id"] = record.request_id
    log.error("unexpected error", exc_info=exc, extra={"fields": fields})
    error = ApiError("internal_error", "internal error; see the sidecar log")
    return await _api_error(request, error)


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected)
