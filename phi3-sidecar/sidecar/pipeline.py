"""What the generation routes (/predict, /v1/chat/completions) share: the request pipeline.

Everything that can be refused is refused before the response starts, with a proper status:
the body (415, 413, 400, 422), readiness (503), the queue (503), the context (413). A route
only brings its body's schema and its ReplyFormat (how the reply is written, streaming.py).
"""

from __future__ import annotations

import asyncio
import json
from typing import NoReturn, TypeVar

from fastapi import Request, Response
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from sidecar import ipc
from sidecar.admission import QueueFull
from sidecar.errors import ApiError, not_ready, overloaded
from sidecar.logs import RequestRecord
from sidecar.streaming import ReplyFormat, ReplyResponse, wait_for_disconnect
from sidecar.worker_client import WorkerClient

# A body over the limit is still read (and dropped) up to this size, so that the client, which
# is still sending, gets to read the 413 instead of a reset connection.
DRAIN_LIMIT = 4 * 1024 * 1024

Body = TypeVar("Body", bound=BaseModel)


async def read_body(request: Request, limit: int, schema: type[Body]) -> Body:
    """The JSON body, validated by `schema`; ApiError 415/413/400/422 otherwise."""
    media_type, _, params = request.headers.get("content-type", "").partition(";")
    charset = params.strip().lower().removeprefix("charset=").strip('"') if params else "utf-8"
    if media_type.strip().lower() != "application/json" or charset not in ("utf-8", "utf8"):
        raise ApiError(415, "unsupported_media_type", "send the body as application/json (UTF-8)")
    drain_limit = max(limit, DRAIN_LIMIT)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > drain_limit:
        _too_large(limit)
    body = bytearray()
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size <= limit:
                body += chunk
            elif size > drain_limit:
                break
    except ClientDisconnect:
        raise ApiError(400, "invalid_request", "the body was cut off") from None
    if size > limit:
        _too_large(limit)
    try:
        data = json.loads(body.decode("utf-8"), parse_constant=_no_constants)
    except UnicodeDecodeError:
        raise ApiError(400, "invalid_encoding", "the body is not valid UTF-8") from None
    except ValueError:
        raise ApiError(400, "invalid_json", "the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise ApiError(422, "invalid_request", "the body must be a JSON object")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise ApiError(422, "invalid_request", _first_error(exc)) from None


async def run(
    request: Request,
    worker: WorkerClient,
    record: RequestRecord,
    generate: ipc.Generate,
    reply_format: ReplyFormat,
) -> Response:
    """Admit the request (FIFO), start it in the worker and answer with its reply."""
    if worker.settings.log_prompts:
        record.prompt = generate.messages
    if worker.phase.name != "ready":
        raise not_ready(worker.phase.name, worker.phase.reason)
    if not await _admit(request, worker):
        record.outcome = "cancelled"  # the client left while waiting in the queue
        return Response(status_code=204)
    reply = worker.submit(generate)
    try:
        start = await reply.start
    except asyncio.CancelledError:  # the server is stopping
        worker.cancel(reply.key)
        raise not_ready("stopping", None) from None
    if isinstance(start, ipc.Rejected):
        extra = {"limit_tokens": start.limit_tokens} if start.limit_tokens is not None else None
        raise ApiError(start.status, start.kind, start.message, extra=extra)
    if isinstance(start, ipc.End):  # the worker died before it started this request
        raise not_ready(worker.phase.name, worker.phase.reason)
    record.prompt_tokens = start.prompt_tokens
    record.dropped_messages = start.dropped_messages
    keep_text = worker.settings.log_prompts
    return ReplyResponse(reply, worker, record, start, reply_format, keep_text=keep_text)


async def _admit(request: Request, worker: WorkerClient) -> bool:
    """Wait for a slot (FIFO); False if the client disconnected while waiting."""
    if worker.admission.try_acquire():
        return True
    acquire = asyncio.ensure_future(worker.admission.acquire())
    gone = asyncio.ensure_future(wait_for_disconnect(request.receive))
    try:
        await asyncio.wait({acquire, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not acquire.done():
            acquire.cancel()
    if acquire.done() and not acquire.cancelled():
        if isinstance(acquire.exception(), QueueFull):
            raise overloaded()
        acquire.result()
        if worker.phase.name != "ready":  # the worker failed while we waited
            worker.admission.release()
            raise not_ready(worker.phase.name, worker.phase.reason)
        return True
    return False


def _too_large(limit: int) -> NoReturn:
    raise ApiError(413, "body_too_large", f"the body is larger than {limit} bytes")


def _no_constants(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _first_error(exc: ValidationError) -> str:
    """One line naming the field, never echoing the input."""
    error = exc.errors(include_input=False, include_url=False)[0]
    where = ".".join(str(part) for part in error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message
