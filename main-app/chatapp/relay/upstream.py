"""The model service as the app sees it: one interface, whichever API it speaks.

`UPSTREAM_API` picks the module that speaks it (`create_app` builds it: this module knows
neither, they both build on it): `predict` (our sidecar's `POST /predict`, the
default: `upstream_predict.py`) or `openai` (`POST /v1/chat/completions` on any
OpenAI-compatible server: our sidecar's `/v1`, App Service's built-in model sidecars, Ollama,
llama.cpp's `llama-server`, Foundry Local: `upstream_openai.py`). Each module turns every failure
before the reply starts into an `ApiError` with one readable sentence, and the reply into the
same events: `Text` as it comes (before it, `Loading` while the model asked for loads and
`Progress` while a long prompt is read), then
`Done` (how it ended, the counts the server gave) or `Broken`. Whichever module read it, a
`Text` holds no control character but tab, newline and carriage return (`ReplyStream` makes the
others visible, `chatapp.relay.wire.visible`): the page stores the reply and sends it back in
the next turn, where the model service refuses them.

A `ReplyStream` reads the reply on a thread (whole HTTP chunks as they arrive, never byte by
byte) into a queue, so the relay can wait on it with a timeout and write heartbeats while the
server is silent. `ReplyStream.close` shuts the socket down at once, which is how the server
learns that nobody is listening any more and stops generating.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import requests

from chatapp.errors import ApiError
from chatapp.relay import wire

# The name its log lines have always carried, not the module's path.
log = logging.getLogger("chatapp.upstream")

NOT_REACHABLE = "The model service is not reachable; it may be starting or stopped."
DEFAULT_RETRY_AFTER = 5


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Done:
    """The reply finished: why (`stop` or `length`, when the server says) and its counts."""

    finish_reason: str | None = None
    generated_tokens: int | None = None  # the model's count, not the pieces relayed
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    dropped_messages: int | None = None
    # Of the prompt's tokens, those our sidecar's passage store held (documents/warming.py)
    passage_cached_tokens: int | None = None


@dataclass(frozen=True)
class Progress:
    """How far the model is in reading a long prompt (our sidecar's progress events): prompt
    tokens read (estimated between its worker's reports), of `total`; the seconds left at the
    rate measured (None: not known yet)."""

    read: int
    total: int
    seconds_left: float | None = None

    @staticmethod
    def of(value: object) -> Progress | None:
        """A server's `progress` member, if it is one."""
        if not isinstance(value, dict):
            return None
        read, total = int_or_none(value.get("read")), int_or_none(value.get("total"))
        if read is None or total is None or not 0 <= read <= total:
            return None
        left = value.get("seconds_left")
        seconds = float(left) if isinstance(left, int | float) and left >= 0 else None
        return Progress(read, total, seconds)


@dataclass(frozen=True)
class Loading:
    """The model asked for is being loaded (our sidecar with several models: its `loading`
    events, docs/api.md "Several models"): its id, the seconds it has been loading, and those
    left by its last load (None: its first, or not said)."""

    model: str
    seconds: float
    seconds_left: float | None = None

    @staticmethod
    def of(value: object) -> Loading | None:
        """A server's `loading` member, if it is one."""
        if not isinstance(value, dict):
            return None
        model, seconds, left = value.get("model"), value.get("seconds"), value.get("seconds_left")
        if not isinstance(model, str) or not isinstance(seconds, int | float) or seconds < 0:
            return None
        if isinstance(seconds, bool) or not wire.valid_model(model):
            return None
        if isinstance(left, int | float) and not isinstance(left, bool) and left >= 0:
            return Loading(model, float(seconds), float(left))
        return Loading(model, float(seconds))


@dataclass(frozen=True)
class Refused:
    """The model service refused the chat after the relay's stream had started: it waited in
    the sidecar's queue past QUEUED_STREAM_AFTER (chatapp/relay/pending.py), or the server's own
    stream had started before the refusal (our sidecar's STREAM_START_AFTER_S on /v1)."""

    error: ApiError


@dataclass(frozen=True)
class Broken:
    """The reply broke off: the connection dropped, the server stayed silent too long, or it
    said it failed (`message`, one sentence of its own)."""

    timed_out: bool
    message: str | None = None


Event = Text | Progress | Loading | Done | Broken | Refused


@dataclass(frozen=True)
class ChatModel:
    """One chat model a model service lists, as the page may see it (upstream_models.py)."""

    id: str
    default: bool = False  # the one that answers a chat that names none
    state: str | None = None  # loaded, loading, available, failed; None: not said
    load_s: float | None = None  # its last load's seconds: a cold one's expected wait
    input_modalities: tuple[str, ...] | None = None  # None: not said
    aliases: tuple[str, ...] = ()

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "default": self.default,
            "state": self.state,
            "load_s": self.load_s,
            "input_modalities": (
                None if self.input_modalities is None else list(self.input_modalities)
            ),
            "aliases": list(self.aliases),
        }


@dataclass(frozen=True)
class Recording:
    """Speech to transcribe, held in memory only (chatapp/speech/): the file's bytes, a name
    and its media type as the browser gave them."""

    data: bytes
    filename: str
    content_type: str


class ReplyStream:
    """A reply being streamed; iterate with `next(timeout)`, always `close`."""

    def __init__(
        self, response: requests.Response, events: Callable[[requests.Response], Iterator[Event]]
    ) -> None:
        self._response = response
        self._queue: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._closed = threading.Event()
        self._reader = threading.Thread(
            target=self._read, args=(events,), name="upstream-reply", daemon=True
        )
        self._reader.start()

    def _read(self, events: Callable[[requests.Response], Iterator[Event]]) -> None:
        event: Event
        try:
            for event in _visible(events(self._response)):
                self._queue.put(event)
                if not isinstance(event, Text | Progress | Loading):
                    return
            event = Broken(timed_out=False)  # the stream ended without saying how
        except requests.Timeout:
            event = Broken(timed_out=True)
        except requests.ConnectionError as exc:
            # requests wraps urllib3's read timeout in a plain ConnectionError.
            event = Broken(timed_out="timed out" in str(exc).lower())
        except Exception:  # anything else while reading is a broken reply too
            event = Broken(timed_out=False)
        self._queue.put(event)

    def next(self, timeout: float) -> Event | None:
        """The next event; None if nothing arrived within `timeout` seconds."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        """Drop the connection now (idempotent)."""
        if self._closed.is_set():
            return
        self._closed.set()
        # shutdown() wakes the reader thread blocked in recv() and sends FIN to the server
        # right away; close() alone would wait for that recv() to return.
        connection = getattr(self._response.raw, "connection", None)
        sock = getattr(connection, "sock", None)
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            self._response.close()


def _visible(events: Iterator[Event]) -> Iterator[Event]:
    """`events` with each `Text` made visible (`wire.visible`). A piece that ends in the first
    half of a surrogate pair (a server that escapes the pair and splits it between two chunks)
    keeps it for the next piece, so the pair becomes one character."""
    held = ""
    for event in events:
        if isinstance(event, Text):
            text = held + event.text
            held = text[-1] if "\ud800" <= text[-1:] <= "\udbff" else ""
            if text := text[: len(text) - len(held)]:
                yield Text(wire.visible(text))
            continue
        if held:
            yield Text(wire.visible(held))
            held = ""
        yield event
    if held:
        yield Text(wire.visible(held))


def lines(response: requests.Response) -> Iterator[bytes]:
    """A streamed body's lines as they arrive (without their line ends), the last one too."""
    pending = b""
    # chunk_size=None: each HTTP chunk as soon as it arrives, whatever its size.
    for chunk in response.iter_content(chunk_size=None):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            yield line.rstrip(b"\r")
    if pending:
        yield pending


class Upstream(Protocol):
    """What the relay and the health route need of a model service."""

    base_url: str

    def start(self, payload: dict[str, Any], request_id: str) -> ReplyStream:
        """Start a streamed reply to a /chat payload (wire.py); ApiError if none starts."""
        ...

    def readiness(self) -> dict[str, Any]:
        """`{"reachable", "ready", "detail"?: {"phase", "model", "speech"?, ...}}`; never
        raises."""
        ...

    def transcribe(self, recording: Recording, request_id: str) -> str:
        """The text spoken in a recording (upstream_speech.py); ApiError if none comes."""
        ...

    def models(self) -> list[ChatModel]:
        """The chat models it lists (upstream_models.py); ApiError if the list does not
        come."""
        ...


class Connection:
    """How the app reaches a model service: its base URL, timeouts and key."""

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
        # Sent as a bearer token: our sidecar's API_KEY, or an OpenAI-compatible server's key.
        self.auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def post_stream(
        self, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> requests.Response:
        """POST a JSON body for a streamed answer; a failure to connect or answer is an
        ApiError with one sentence (503 not reachable, 504 too slow, 502 otherwise)."""
        return self._post(
            path,
            {"Content-Type": "application/json", **headers},
            # UTF-8 as is, not \\u escapes: servers limit the body size in bytes.
            data=json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode(),
            stream=True,
        )

    def post_form(
        self,
        path: str,
        fields: dict[str, str],
        file: tuple[str, bytes, str],
        headers: dict[str, str],
    ) -> requests.Response:
        """POST a multipart form (`fields` and one `file`: name, bytes, type) for a JSON
        answer; failures as post_stream's."""
        return self._post(path, headers, data=fields, files={"file": file})

    def _post(self, path: str, headers: dict[str, str], **body: Any) -> requests.Response:
        try:
            return requests.post(
                self.base_url + path,
                timeout=(self.connect_timeout, self.read_timeout),
                headers={**headers, **self.auth},
                **body,
            )
        except requests.ConnectTimeout:
            raise ApiError("upstream_unavailable", NOT_REACHABLE, status=503) from None
        except requests.Timeout:
            log.warning("the model service did not answer within %s s", self.read_timeout)
            raise ApiError(
                "upstream_timeout", "The model service did not answer in time.", status=504
            ) from None
        except requests.ConnectionError:
            log.warning("the model service is not reachable at %s", self.base_url)
            raise ApiError("upstream_unavailable", NOT_REACHABLE, status=503) from None
        except requests.RequestException as exc:
            log.warning("the request to the model service failed: %s", type(exc).__name__)
            raise ApiError(
                "upstream_error", "The model service could not answer this message.", status=502
            ) from None

    def get_json(self, path: str) -> tuple[int, Any] | None:
        """A short GET for the health route: (status, body or None); None if unreachable."""
        try:
            # Short timeouts: a container health check waits on this answer.
            timeout = (min(self.connect_timeout, 1.0), 2.0)
            response = requests.get(self.base_url + path, timeout=timeout, headers=self.auth)
        except requests.RequestException:
            return None
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, None


def retry_after(response: requests.Response | None) -> int:
    """The answer's Retry-After; the default for none (a refusal that came in the stream)."""
    raw = response.headers.get("Retry-After", "") if response is not None else ""
    try:
        return max(1, int(raw))
    except ValueError:
        return DEFAULT_RETRY_AFTER


# The refusals both APIs end in (the page's wire format: wire.py): one sentence and one
# type each, whichever server said it and however.


def unauthorized() -> ApiError:
    return ApiError(
        "upstream_unauthorized",
        "The chat app may not use the model service: its key was refused "
        "(set UPSTREAM_API_KEY, or SIDECAR_API_KEY, to a key the model service accepts).",
        status=502,
    )


def host_refused() -> ApiError:
    """The model service's ALLOWED_HOSTS does not name the host in SIDECAR_URL: the operator's
    to fix, not the person's (it reached the page as a 400 that blamed the request)."""
    return ApiError(
        "upstream_error",
        "The model service refused the chat app's requests: the host name in SIDECAR_URL is "
        "not one of the model service's ALLOWED_HOSTS.",
        status=502,
    )


def not_ready(phase: str, response: requests.Response | None) -> ApiError:
    """The model is not loaded: it failed to (no point in retrying), it is restarting, or it is
    on its way (any other phase)."""
    if phase == "failed":
        return ApiError(
            "model_failed", "The model service could not load the model; see its log.", status=503
        )
    seconds = retry_after(response)
    if phase == "restarting":
        sentence, type = f"The model is restarting; trying again in {seconds} s.", "restarting"
    else:
        sentence, type = f"The model is still loading; trying again in {seconds} s.", "loading"
    return ApiError(type, sentence, status=503, retry_after=seconds)


def busy(response: requests.Response | None) -> ApiError:
    seconds = retry_after(response)
    return ApiError(
        "busy",
        f"The model is busy with other replies; trying again in {seconds} s.",
        status=503,
        retry_after=seconds,
    )


def model_not_found(model: str) -> ApiError:
    """The chat named a model the model service does not serve (taken out since the page
    listed it, or a client's typo): the person's to change, not the operator's."""
    return ApiError(
        "model_not_found",
        f"The model service has no model named {trimmed(model)[:100]!r}; choose another model.",
        status=404,
    )


def context_overflow() -> ApiError:
    return ApiError(
        "context_overflow",
        "Your message is too long for the model's context; shorten it or start a new chat.",
        status=413,
    )


def payload_too_large() -> ApiError:
    return ApiError(
        "payload_too_large", "The conversation is too long to send; start a new chat.", status=413
    )


def refused(message: str) -> ApiError:
    """A 4xx whose message says why (servers' validation messages name the field)."""
    return ApiError(
        "invalid_request",
        f"The model service refused the conversation ({trimmed(message)}).",
        status=400,
    )


def upstream_failed() -> ApiError:
    return ApiError(
        "upstream_error", "The model service could not answer this message.", status=502
    )


def trimmed(message: str) -> str:
    """A server's message as part of one of our sentences: 300 characters at most, no period."""
    return message.strip()[:300].rstrip(".")


def int_or_none(value: object) -> int | None:
    """A count from a server's JSON: an int (not a bool), else unknown."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None
