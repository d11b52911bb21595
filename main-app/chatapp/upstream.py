"""The sidecar client: the only module that speaks HTTP to the model service.

`Sidecar.predict` opens a streaming `POST /predict` and turns every failure before the reply
starts into an `ApiError` with a readable sentence. The reply itself is read by a `ReplyStream`:
a reader thread pulls chunks as they arrive (whole HTTP chunks, never byte by byte) into a
queue, so the relay can wait on it with a timeout and write heartbeats while the sidecar is
silent. `ReplyStream.close` shuts the socket down at once, which is how the sidecar learns that
nobody is listening any more and stops generating.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import socket
import threading
from dataclasses import dataclass
from typing import Any

import requests

from chatapp.errors import ApiError

log = logging.getLogger(__name__)

NOT_REACHABLE = "The model service is not reachable; it may be starting or stopped."
DEFAULT_RETRY_AFTER = 5


@dataclass(frozen=True)
class End:
    """The reply finished normally (the sidecar sent the last chunk)."""


@dataclass(frozen=True)
class Broken:
    """The reply broke off: the connection dropped, or the sidecar stayed silent too long."""

    timed_out: bool


Event = bytes | End | Broken


class ReplyStream:
    """A reply being streamed from the sidecar; iterate with `next(timeout)`, always `close`."""

    def __init__(self, response: requests.Response) -> None:
        self._response = response
        self.prompt_tokens = _int_header(response, "X-Prompt-Tokens")
        self.cached_tokens = _int_header(response, "X-Cached-Tokens")
        self.dropped_messages = _int_header(response, "X-Dropped-Messages")
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read, name="sidecar-reply", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        event: Event
        try:
            # chunk_size=None: each HTTP chunk as soon as it arrives, whatever its size.
            for chunk in self._response.iter_content(chunk_size=None):
                if chunk:
                    self._events.put(chunk)
            event = End()
        except requests.Timeout:
            event = Broken(timed_out=True)
        except requests.ConnectionError as exc:
            # requests wraps urllib3's read timeout in a plain ConnectionError.
            event = Broken(timed_out="timed out" in str(exc).lower())
        except Exception:  # anything else while reading is a broken reply too
            event = Broken(timed_out=False)
        self._events.put(event)

    def next(self, timeout: float) -> Event | None:
        """The next chunk or final event; None if nothing arrived within `timeout` seconds."""
        try:
            return self._events.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        """Drop the connection to the sidecar now (idempotent)."""
        if self._closed.is_set():
            return
        self._closed.set()
        # shutdown() wakes the reader thread blocked in recv() and sends FIN to the sidecar
        # right away; close() alone would wait for that recv() to return.
        connection = getattr(self._response.raw, "connection", None)
        sock = getattr(connection, "sock", None)
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            self._response.close()


def _int_header(response: requests.Response, name: str) -> int | None:
    raw = response.headers.get(name, "")
    return int(raw) if raw.isdigit() else None


def _retry_after(response: requests.Response) -> int:
    raw = response.headers.get("Retry-After", "")
    try:
        return max(1, int(raw))
    except ValueError:
        return DEFAULT_RETRY_AFTER


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
        seconds = _retry_after(response)
        if type == "not_ready" and phase == "failed":
            return ApiError(
                503, "The model service could not load the model; see its log.", "model_failed"
            )
        if type == "not_ready" and phase == "restarting":
            return ApiError(
                503,
                f"The model is restarting; trying again in {seconds} s.",
                "restarting",
                retry_after=seconds,
            )
        if type == "not_ready":
            return ApiError(
                503,
                f"The model is still loading; trying again in {seconds} s.",
                "loading",
                retry_after=seconds,
            )
        return ApiError(
            503,
            f"The model is busy with other replies; trying again in {seconds} s.",
            "busy",
            retry_after=seconds,
        )
    if status == 401:  # the sidecar has an API_KEY, and ours is missing or wrong
        return ApiError(
            502,
            "The chat app may not use the model service: its key was refused "
            "(set SIDECAR_API_KEY to one of the sidecar's API_KEY values).",
            "upstream_unauthorized",
        )
    if status == 413 and type == "body_too_large":
        return ApiError(
            413, "The conversation is too long to send; start a new chat.", "payload_too_large"
        )
    if status == 413:
        return ApiError(
            413,
            "Your message is too long for the model's context; shorten it or start a new chat.",
            "context_overflow",
        )
    if 400 <= status < 500 and message:
        # The sidecar's validation messages name the field and never echo the input.
        detail = message.strip()[:300].rstrip(".")
        return ApiError(
            400, f"The model service refused the conversation ({detail}).", "invalid_request"
        )
    return ApiError(502, "The model service could not answer this message.", "upstream_error")


class Sidecar:
    """Client for one sidecar base URL."""

    def __init__(
        self,
        base_url: str,
        connect_timeout: float,
        read_timeout: float,
        api_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        # The sidecar's API_KEY, if it has one (phi3-sidecar/sidecar/web/access.py).
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def predict(self, payload: dict[str, Any], request_id: str) -> ReplyStream:
        """Start a streamed reply; raises ApiError if the sidecar does not start one.

        `request_id` goes along as `X-Request-Id`, so the sidecar's log line carries it too.
        """
        try:
            response = requests.post(
                self.base_url + "/predict",
                # UTF-8 as is, not \u escapes: the sidecar limits the body size in bytes.
                data=json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode(),
                stream=True,
                timeout=(self.connect_timeout, self.read_timeout),
                headers={
                    "Content-Type": "application/json",
                    "Accept": "text/plain",
                    "X-Request-Id": request_id,
                    **self._auth,
                },
            )
        except requests.ConnectTimeout:
            raise ApiError(503, NOT_REACHABLE, "upstream_unavailable") from None
        except requests.Timeout:
            log.warning("sidecar did not answer within %s s", self.read_timeout)
            raise ApiError(
                504, "The model service did not answer in time.", "upstream_timeout"
            ) from None
        except requests.ConnectionError:
            log.warning("sidecar not reachable at %s", self.base_url)
            raise ApiError(503, NOT_REACHABLE, "upstream_unavailable") from None
        except requests.RequestException as exc:
            log.warning("request to the sidecar failed: %s", type(exc).__name__)
            raise ApiError(
                502, "The model service could not answer this message.", "upstream_error"
            ) from None
        if response.status_code != 200:
            with response:
                error = _refusal(response)
            log.warning("sidecar answered %s; relayed as %s", response.status_code, error.type)
            raise error
        return ReplyStream(response)

    def readiness(self) -> dict[str, Any]:
        """The sidecar's /readyz answer for the app's health route; never raises."""
        try:
            # Short timeouts: a container health check waits on this answer.
            timeout = (min(self.connect_timeout, 1.0), 2.0)
            response = requests.get(self.base_url + "/readyz", timeout=timeout, headers=self._auth)
        except requests.RequestException:
            return {"reachable": False, "ready": False}
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        result: dict[str, Any] = {"reachable": True, "ready": response.status_code == 200}
        if isinstance(body, dict):
            result["detail"] = body
        return result
