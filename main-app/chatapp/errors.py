"""Errors: every failure the app answers as JSON `{"error": {"message", "type"}}`.

`ApiError(type, message, status=...)` carries a short machine type, one readable sentence and
the status, in the order of the sidecar's `ApiError(reason, message)`; raise it anywhere in a
request. `install` registers handlers so that Flask's own errors (404, 405, 413, ...) and
unexpected exceptions (500) use the same envelope instead of an HTML page or a stack trace.
"""

from __future__ import annotations

from flask import Flask, Response, current_app, has_request_context, jsonify, request
from werkzeug.exceptions import HTTPException, SecurityError

# Flask's own HTTP errors, rephrased for people. Anything else keeps a generic sentence.
_HTTP_ERRORS: dict[int, tuple[str, str]] = {
    400: ("The request is not valid.", "invalid_request"),
    404: ("There is nothing at this address.", "not_found"),
    405: ("This address does not accept that method.", "method_not_allowed"),
    413: ("The conversation is too long to send.", "payload_too_large"),
    415: ("Send the conversation as JSON.", "unsupported_media_type"),
}


class ApiError(Exception):
    """A failure to report to the client as the JSON error envelope."""

    def __init__(
        self, type: str, message: str, *, status: int, retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.retry_after = retry_after


def envelope(message: str, type: str) -> dict[str, dict[str, str]]:
    return {"error": {"message": message, "type": type}}


def error_response(
    status: int, message: str, type: str, headers: dict[str, str] | None = None
) -> Response:
    response = jsonify(envelope(message, type))
    response.status_code = status
    response.headers.update(headers or {})
    response.headers["Cache-Control"] = "no-store"
    return response


def type_of(response: Response) -> str:
    """The `type` of an error envelope response, for the request log ("error" if none)."""
    body = response.get_json(silent=True) if response.is_json else None
    error = body.get("error") if isinstance(body, dict) else None
    type = error.get("type") if isinstance(error, dict) else None
    return type if isinstance(type, str) else "error"


def _api_error(error: ApiError) -> Response:
    headers = {} if error.retry_after is None else {"Retry-After": str(error.retry_after)}
    return error_response(error.status, error.message, error.type, headers)


def _http_error(error: HTTPException) -> Response:
    if isinstance(
        error, SecurityError
    ):  # a Host Werkzeug cannot read (guards/host.py refuses first)
        return error_response(400, "This host name is not served here.", "invalid_host")
    status = error.code or 500
    message, type = _HTTP_ERRORS.get(status, ("The request could not be handled.", "http_error"))
    if status == 413 and has_request_context() and request.mimetype == "multipart/form-data":
        message, type = _form_too_large()
    # Keep headers such as Allow (405) or Retry-After, but not the HTML content type.
    headers = {k: v for k, v in error.get_headers() if k.lower() != "content-type"}
    return error_response(status, message, type, headers)


def _form_too_large() -> tuple[str, str]:
    """Werkzeug refuses a form too large and a form of too many parts with the same 413; an
    upload is no conversation (issue 58: both were "The conversation is too long to send.").
    A declared length within the limit means the parts were too many."""
    limit, length = request.max_content_length, request.content_length
    if limit is not None and length is not None and length <= limit:
        parts = request.max_form_parts
        cap = f"; at most {parts} are read" if parts else ""
        return f"The upload has too many parts{cap}. Send fewer files at a time.", "too_many_parts"
    most = f"at most {limit / 1024 / 1024:.0f} MB" if limit else "less"
    return f"The upload is too large: send {most} at a time, files together.", "payload_too_large"


def _unexpected(error: Exception) -> Response:
    if isinstance(error, HTTPException):  # e.g. raised from a handler outside a request route
        return _http_error(error)
    current_app.logger.exception("unhandled error")
    return error_response(500, "Something went wrong in the chat app.", "internal_error")


def install(app: Flask) -> None:
    app.register_error_handler(ApiError, _api_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected)
