"""What the generation routes (/predict, /v1/chat/completions) share: the request pipeline.

Everything that can be refused is refused before the response starts (the body, readiness,
the queue, the context), with the status and type that errors.REFUSALS gives each reason. A
route only brings its body's schema and its ReplyFormat (how the reply is written,
generation/reply.py). The one exception: a stream with a keepalive (/v1's server-sent events) whose
reply has not started within STREAM_START_AFTER_S starts anyway (generation/early_start.py), and a
refusal after that is the format's error event.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import NoReturn, TypeVar

from fastapi import Request, Response
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from sidecar import ipc
from sidecar.web.errors import ApiError, not_ready, overloaded
from sidecar.web.generation.admission import Admission, QueueFull
from sidecar.web.generation.early_start import EarlyStart
from sidecar.web.generation.messages import PART_TAGS
from sidecar.web.generation.model_client import ModelClient
from sidecar.web.generation.reply import ReplyFormat, ReplyResponse, wait_for_disconnect
from sidecar.web.models.pool import ModelPool
from sidecar.web.models.registry import ModelEntry
from sidecar.web.observability.record import RequestRecord

# A body over the limit is still read (and dropped) up to this size, so that the client, which
# is still sending, gets to read the 413 instead of a reset connection.
DRAIN_LIMIT = 4 * 1024 * 1024

Body = TypeVar("Body", bound=BaseModel)
# Of the API key's fingerprint (SHA-256, hex), what names its cache scopes: 128 bits.
OWNER_CHARS = 32


async def read_body(request: Request, limit: int, schema: type[Body], images: int = 0) -> Body:
    """The JSON body, validated by `schema`; ApiError 415/413/400/422 otherwise. `images`: how
    many bytes more a body may hold in its images' data URLs (images.body_allowance); the rest
    of the body stays within `limit` (`schema` has `image_refs()`)."""
    media_type, _, params = request.headers.get("content-type", "").partition(";")
    charset = params.strip().lower().removeprefix("charset=").strip('"') if params else "utf-8"
    if media_type.strip().lower() != "application/json" or charset not in ("utf-8", "utf8"):
        raise ApiError("unsupported_media_type", "send the body as application/json (UTF-8)")
    whole = limit + images
    drain_limit = max(whole, DRAIN_LIMIT)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > drain_limit:
        _too_large(limit, images)
    body = bytearray()
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size <= whole:
                body += chunk
            elif size > drain_limit:
                break
    except ClientDisconnect:
        raise ApiError("body_cut_off", "the body was cut off") from None
    # the latter: no image (nor audio) in it
    if size > whole or (size > limit and b"data:" not in body and b"input_audio" not in body):
        _too_large(limit, images)
    if size <= limit:
        return _parse(body, schema)
    # A body with images: megabytes of JSON, parsed beside the event loop.
    parsed = await asyncio.to_thread(_parse, body, schema)
    refs = getattr(parsed, "image_refs", None)
    urls = sum(len(ref.url) for ref in refs()) if refs is not None else 0
    audio = getattr(parsed, "audio_chars", None)  # input_audio parts' base64 (web/audio/parts.py)
    urls += audio() if audio is not None else 0
    if size - urls > limit:
        _too_large(limit, images)
    return parsed


def _parse(body: bytes | bytearray, schema: type[Body]) -> Body:
    try:
        data = json.loads(body.decode("utf-8"), parse_constant=_no_constants)
    except UnicodeDecodeError:
        raise ApiError("invalid_encoding", "the body is not valid UTF-8") from None
    except ValueError:
        raise ApiError("invalid_json", "the body is not valid JSON") from None
    except RecursionError:  # a few KB of [[[[...]]]] is deeper than the parser goes
        raise ApiError("invalid_json", "the body's JSON is nested too deeply") from None
    if not isinstance(data, dict):
        raise ApiError("invalid_field", "the body must be a JSON object")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        param, message = _first_error(exc)
        raise ApiError("invalid_field", message, param=param) from None


class Pipeline:
    """Admission (FIFO), then the model worker, then the reply: what both APIs share. With
    several models (web/models/), the model a request names: loaded first if it is not (the
    stream starts at once and says so: `loading` events), admitted behind the other models'
    generations (generation/admission.py)."""

    def __init__(
        self,
        models: ModelPool,
        admission: Admission,
        *,
        log_prompts: bool,
        time_limit_s: float = 0.0,
        start_after_s: float = 2.0,
        keepalive_s: float = 5.0,
        progress_s: float = 1.0,
    ) -> None:
        self._models = models
        self._admission = admission
        self._log_prompts = log_prompts
        self._time_limit_s = time_limit_s  # REPLY_TIME_LIMIT_S; 0: none
        self._start_after_s = start_after_s  # STREAM_START_AFTER_S
        self._keepalive_s = keepalive_s  # STREAM_KEEPALIVE_S
        self._progress_s = progress_s  # PROGRESS_INTERVAL_S

    @property
    def strict(self) -> bool:
        """Whether models are named (MODELS_FILE): replies then name the one that answered."""
        return self._models.registry.strict

    def resolve(self, name: str | None) -> ModelEntry:
        """The model a request names (404 model_not_found with MODELS_FILE)."""
        return self._models.registry.resolve(name)

    async def run(
        self,
        request: Request,
        record: RequestRecord,
        generate: ipc.Generate,
        reply_format: ReplyFormat,
        entry: ModelEntry | None = None,
    ) -> Response:
        """Admit the request (FIFO), start it in the worker and answer with its reply."""
        models = self._models
        entry = entry or models.registry.default
        # Every scope is the API key's own (ipc.owned_scope): the one place all routes pass.
        owner = request.scope.get("state", {}).get("key_owner", "")
        scope = ipc.owned_scope(owner[:OWNER_CHARS], generate.cache_scope)
        passage_scope = ipc.owned_scope(owner[:OWNER_CHARS], generate.passage_scope)
        generate = dataclasses.replace(generate, cache_scope=scope, passage_scope=passage_scope)
        generate = with_defaults(generate, entry)
        if self._log_prompts:
            record.prompt = generate.messages or generate.prompt  # a plain prompt: /v1/completions
        if models.registry.strict:
            record.model = reply_format.model_id = entry.id
        resident = models.resident(entry)
        # A model loaded on demand is waited for (its stream says so); a pinned one that is
        # loading (at start, or replaced after a crash) is refused as ever: retry after
        cold = entry.id not in models.pinned and (
            resident is None or not resident.client.phase.ready
        )
        if not cold:
            assert resident is not None  # pinned models are always resident
            phase = resident.client.phase
            if not phase.ready:
                raise not_ready(phase.name, phase.reason, phase.retry_after_s())
            check_images(generate, entry, phase.image_input)
        begin = asyncio.ensure_future(self._begin(record, generate, reply_format, entry, cold))
        gone = asyncio.ensure_future(wait_for_disconnect(request.receive))
        # A format that can keep a stream alive may start it before its reply starts; one
        # that can say a model loads starts at once when it must load first
        start_after = None
        if cold and reply_format.loading({"model": entry.id}):
            start_after = 0.0
        elif reply_format.keepalive():
            start_after = self._start_after_s
        try:
            await asyncio.wait(
                {begin, gone}, timeout=start_after, return_when=asyncio.FIRST_COMPLETED
            )
        except asyncio.CancelledError:  # the server is stopping
            begin.cancel()
            raise not_ready("stopping", None) from None
        finally:
            gone.cancel()
        if begin.done():
            return begin.result()  # a refusal raises: its HTTP status
        if gone.done():
            begin.cancel()  # out of the queue, or cancelled in the worker
            record.outcome = "cancelled"  # the client left while its reply was starting
            return Response(status_code=204)
        if not cold:
            return EarlyStart(begin, record, reply_format, self._keepalive_s)
        # A model loading: said as often as a long prompt's reading (PROGRESS_INTERVAL_S)
        interval = min(self._keepalive_s, self._progress_s)
        return EarlyStart(begin, record, reply_format, interval, lambda: models.loading(entry))

    async def _begin(
        self,
        record: RequestRecord,
        generate: ipc.Generate,
        reply_format: ReplyFormat,
        entry: ModelEntry,
        cold: bool,
    ) -> ReplyResponse:
        """The model (loaded if need be), a slot, then the worker's start: the reply's
        response, or the refusal raised."""
        models = self._models
        model = await models.take(entry)  # 503 when no room can be made
        submitted = False
        try:
            if cold:
                await models.wait_ready(entry, model)
                check_images(generate, entry, model.phase.image_input)
            # telemetry: the queue wait (web/observability/metrics.py, observability/telemetry.py)
            queued_at = time.monotonic()
            await self._admit(model, entry.id)
            record.admitted(queued_at)  # telemetry
            if self._time_limit_s:
                # Counted from the request's arrival, as App Service's front end counts its 230 s.
                deadline = record.started_at + self._time_limit_s
                generate = dataclasses.replace(generate, deadline=deadline)
            # The worker starts it at once, or keeps it until the KV memory it needs is free
            # (model/kv/tiers.py): a client that leaves meanwhile takes its request with it.
            reply = model.submit(generate)
            submitted = True
        finally:
            if not submitted:  # its generation never began: the model is not its any more
                models.release(entry)
        try:
            start = await reply.start
        except asyncio.CancelledError:  # the client left, or the server is stopping
            model.cancel(reply.key)
            raise
        if isinstance(start, ipc.Rejected):
            # What the refusal cost the model's side (issue 46: an attack of refusals shows)
            record.refusal_ms = round(start.spent_s * 1000, 1)
            record.byte_bound = start.byte_bound or None
            if start.reason == "overloaded":  # it waited for KV memory until its deadline
                raise ApiError(start.reason, start.message, headers=overloaded().headers)
            extra = {"limit_tokens": start.limit_tokens} if start.limit_tokens is not None else None
            raise ApiError(start.reason, start.message, extra=extra)
        if not isinstance(start, ipc.Started):  # End: the worker died before starting it
            raise not_ready(model.phase.name, model.phase.reason, model.phase.retry_after_s())
        record.prompt_tokens = start.prompt_tokens
        if generate.images:
            record.image_tokens = start.image_tokens
        record.cached_tokens = start.cached_tokens
        if generate.passages:
            record.passage_cached_tokens = start.passage_cached_tokens
        record.cache_reason = start.cache_reason or None
        record.cache_tier = start.cache_tier
        if start.cache_tier in ("compact", "disk"):
            record.restore_ms = round(start.restore_s * 1000, 1)
        record.dropped_messages = start.dropped_messages
        record.tokenized_chars = start.tokenized_chars
        record.prepare_ms = round(start.prepare_s * 1000, 1)
        record.kv_wait_ms = round(start.kv_wait_s * 1000, 1)
        record.room_ms = round(start.room_s * 1000, 1)
        record.room_compacted, record.room_spilled = start.room_moves
        return ReplyResponse(
            reply,
            model,
            record,
            start,
            reply_format,
            keep_text=self._log_prompts,
            keepalive_s=self._keepalive_s,
            progress_s=self._progress_s,
        )

    async def _admit(self, model: ModelClient, model_id: str) -> None:
        """Wait for a slot (FIFO); 503 when the queue is full or the worker failed meanwhile.
        Cancelled (the client left), the request leaves the queue."""
        admission = self._admission
        if admission.try_acquire(model_id):
            return
        try:
            await admission.acquire(model_id)
        except QueueFull:
            raise overloaded() from None
        phase = model.phase
        if not phase.ready:  # the worker failed while we waited
            admission.release()
            raise not_ready(phase.name, phase.reason, phase.retry_after_s())


def check_images(generate: ipc.Generate, entry: ModelEntry, image_input: bool) -> None:
    """A request with images for a model that reads text only: 400, naming the model."""
    if generate.images and not image_input:
        raise ApiError(
            "image_input_unsupported",
            f"the model {entry.id!r} reads text only: send the request without images, or "
            "serve a vision model (Phi-3.5-vision)",
        )


def with_defaults(generate: ipc.Generate, entry: ModelEntry) -> ipc.Generate:
    """The model's own defaults (MODELS_FILE): its system prompt for a conversation without
    one, its temperature for a request that sets none."""
    if entry.temperature is not None and generate.temperature is None:
        generate = dataclasses.replace(generate, temperature=entry.temperature)
    messages = generate.messages
    if entry.system_prompt and messages and messages[0][0] != "system":
        slots = tuple((message + 1, offset) for message, offset in generate.image_slots)
        messages = (("system", entry.system_prompt), *messages)
        generate = dataclasses.replace(generate, messages=messages, image_slots=slots)
    return generate


def _too_large(limit: int, images: int = 0) -> NoReturn:
    if not images:
        raise ApiError("body_too_large", f"the body is larger than {limit} bytes")
    raise ApiError(
        "body_too_large",
        f"the body is larger than {limit} bytes besides its images' data URLs, or than "
        f"{limit + images} bytes in all",
    )


def _no_constants(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _first_error(exc: ValidationError) -> tuple[str | None, str]:
    """The field at fault (None if the whole body) and one line naming it, never echoing the
    input. A whole-body check names its field at the start of its message ("stop: ...")."""
    error = exc.errors(include_input=False, include_url=False)[0]
    where = ".".join(str(part) for part in _untagged(error["loc"]))
    message = str(error["msg"]).removeprefix("Value error, ")
    if where:
        return where, f"{where}: {message}"
    field, colon, _ = message.partition(": ")
    return (field if colon and field.isidentifier() else None), message


def _untagged(loc: tuple[int | str, ...]) -> list[int | str]:
    """An error's path without the tag pydantic puts after a content part's index
    (`messages.0.content.1.image_url.image_url.url`: the part's kind, not a field)."""

    def tag(i: int) -> bool:
        return (
            i >= 2
            and loc[i] in PART_TAGS
            and isinstance(loc[i - 1], int)
            and loc[i - 2] == "content"
        )

    return [part for i, part in enumerate(loc) if not tag(i)]
