"""POST /predict: the sample's contract ({"input_text": ...} -> streamed text/plain), done right.

Everything that can be refused is refused before the response starts, with a proper status:
the body (415, 413, 400, 422), readiness (503), the queue (503), the context (413).
"""

from __future__ import annotations

import asyncio
import json
from typing import NoReturn

from fastapi import APIRouter, Request, Response
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from sidecar import ipc
from sidecar.admission import QueueFull
from sidecar.deps import Record, Worker
from sidecar.errors import ApiError, not_ready, overloaded
from sidecar.logs import RequestRecord
from sidecar.schemas import PredictRequest
from sidecar.streaming import ReplyResponse, wait_for_disconnect
from sidecar.worker_client import Reply, WorkerClient

router = APIRouter()

# A body over the limit is still read (and dropped) up to this size, so that the client, which
# is still sending, gets to read the 413 instead of a reset connection.
DRAIN_LIMIT = 4 * 1024 * 1024


@router.post("/predict")
async def predict(request: Request, worker: Worker, record: Record) -> Response:
    body = await read_predict_request(request, worker.settings.max_body_bytes)
    if worker.settings.log_prompts:
        record.prompt = body.conversation()
    if worker.phase.name != "ready":
        raise not_ready(worker.phase.name, worker.phase.reason)
    if not await _admit(request, worker):
        record.outcome = "cancelled"  # the client left while waiting in the queue
        return Response(status_code=204)
    max_new_tokens = body.max_new_tokens or worker.settings.max_new_tokens
    generate = ipc.Generate(
        record.request_id,
        body.conversation(),
        max_new_tokens,
        min_new_tokens=min(body.min_new_tokens or 0, max_new_tokens),
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        seed=body.seed,
    )
    reply = worker.submit(generate)
    try:
        start = await reply.start
    except asyncio.CancelledError:  # the server is stopping
        worker.cancel(reply.key)
        raise not_ready("stopping", None) from None
    return _respond(start, reply, worker, record)


def _respond(
    start: ipc.Started | ipc.Rejected | ipc.End,
    reply: Reply,
    worker: WorkerClient,
    record: RequestRecord,
) -> Response:
    if isinstance(start, ipc.Rejected):
        extra = {"limit_tokens": start.limit_tokens} if start.limit_tokens is not None else None
        raise ApiError(start.status, start.kind, start.message, extra=extra)
    if isinstance(start, ipc.End):  # the worker died before it started this request
        raise not_ready(worker.phase.name, worker.phase.reason)
    record.prompt_tokens = start.prompt_tokens
    record.dropped_messages = start.dropped_messages
    return ReplyResponse(reply, worker, record, start, keep_text=worker.settings.log_prompts)


async def _admit(request: Request, worker: Worker) -> bool:
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


async def read_predict_request(request: Request, limit: int) -> PredictRequest:
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
        return PredictRequest.model_validate(data)
    except ValidationError as exc:
        raise ApiError(422, "invalid_request", _first_error(exc)) from None


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
