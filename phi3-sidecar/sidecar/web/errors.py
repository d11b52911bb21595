"""Every refusal's status and type (REFUSALS), and one error shape for every failure:
{"error": {"message": ..., "type": ...}}.

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
    status: int
    type: str


# Every reason the sidecar refuses a request for, and its answer: the one place where an
# error status is decided. Routes and the pipeline raise ApiError(reason, ...); the model worker
# reports ipc.Rejected(reason, ...) (ipc.Refusal); Starlette's and FastAPI's own errors are
# mapped by the handlers below.
REFUSALS: dict[str, Answer] = {
    # the request body (pipeline.read_body)
    "unsupported_media_type": Answer(415, "unsupported_media_type"),
    "body_too_large": Answer(413, "body_too_large"),
    "body_cut_off": Answer(400, "invalid_request"),
    "invalid_encoding": Answer(400, "invalid_encoding"),
    "invalid_json": Answer(400, "invalid_json"),
    "invalid_field": Answer(422, "invalid_request"),
    # who is asking (access.py)
    "unauthorized": Answer(401, "unauthorized"),
    "invalid_host": Answer(400, "invalid_host"),
    # the path and method (Starlette)
    "not_found": Answer(404, "not_found"),
    "method_not_allowed": Answer(405, "method_not_allowed"),
    # the service's state (pipeline)
    "not_ready": Answer(503, "not_ready"),
    "overloaded": Answer(503, "overloaded"),
    # the model worker (ipc.Refusal) and the generation
    "context_length_exceeded": Answer(413, "context_length_exceeded"),
    "unencodable_prompt": Answer(400, "invalid_request"),
    "start_failed": Answer(500, "internal_error"),
    "generation_failed": Answer(500, "internal_error"),
    # anything unexpected
    "internal_error": Answer(500, "internal_error"),
}


class ApiError(Exception):
    """A refusal: its reason (a key of REFUSALS) and one sentence for the client."""

    def __init__(
        self,
        reason: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        answer = REFUSALS[reason]
        self.reason = reason
        self.status = answer.status
        self.kind = answer.type
        self.message = message
        self.headers = headers or {}
        self.extra = extra or {}


def not_ready(phase: str, reason: str | None) -> ApiError:
    detail = f"{phase}: {reason}" if reason else phase
    return ApiError(
        "not_ready",
        f"the model is not ready ({detail})",
        headers={"Retry-After": str(RETRY_NOT_READY_S)},
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
    return error_response(exc.status, exc.kind, exc.message, exc.headers, exc.extra)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 405 and "Allow" in headers:
        # Starlette names the methods of the one route that matched the path; every GET route
        # here has a HEAD twin (probes.py, openai_api.py), so either means both.
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
    log.error("unexpected error", exc_info=exc)
    error = ApiError("internal_error", "internal error; see the sidecar log")
    return await _api_error(request, error)


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected)
