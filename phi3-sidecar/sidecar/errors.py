"""One error shape for every failure: {"error": {"message": ..., "type": ...}}.

Handlers are registered in the factory, so no path answers with FastAPI's {"detail": ...} or
with a stack trace; exception text never reaches a client.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("sidecar.errors")

RETRY_NOT_READY_S = 5
RETRY_OVERLOADED_S = 2


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        kind: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.headers = headers or {}
        self.extra = extra or {}


def not_ready(phase: str, reason: str | None) -> ApiError:
    detail = f"{phase}: {reason}" if reason else phase
    return ApiError(
        503,
        "not_ready",
        f"the model is not ready ({detail})",
        headers={"Retry-After": str(RETRY_NOT_READY_S)},
        extra={"phase": phase},  # for clients: "failed" will not heal by waiting, "loading" will
    )


def overloaded() -> ApiError:
    return ApiError(
        503,
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


_HTTP_TYPES = {404: "not_found", 405: "method_not_allowed"}


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
    kind = _HTTP_TYPES.get(exc.status_code, "http_error")
    _mark(request, kind)
    message = "no such path" if exc.status_code == 404 else str(exc.detail)
    return error_response(exc.status_code, kind, message, dict(exc.headers or {}))


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    _mark(request, "invalid_request")
    return error_response(422, "invalid_request", "the request does not match the API")


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    _mark(request, "internal_error")
    log.error("unexpected error", exc_info=exc)
    return error_response(500, "internal_error", "internal error; see the sidecar log")


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected)
