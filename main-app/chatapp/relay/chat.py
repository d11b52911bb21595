"""`POST /chat`: the route that forwards a conversation to the model service and streams the
reply back.

The body is checked against the browser's wire format (`wire.py`; its images, `images.py`); a
stored chat's prompt is built from its turns (`chatapp.chats.turns`) and a turn with
`"documents": true` is grounded in the person's library (`chatapp.documents.search.grounding`).
The reply is started through the upstream (`upstream.py`: our sidecar's NDJSON events, or an
OpenAI-compatible server's server-sent events); one the model service keeps queued past
`QUEUED_STREAM_AFTER` is streamed with heartbeats while it waits (`pending.py`). The response
body is `stream.Relay`.

Each chat logs one line (`chatapp.observability.logs.ChatRecord`): a refused one when its error
answer goes out (`_tag_and_log_refusal`), a streamed one when the server closes the stream
(`Relay.close`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from flask import Blueprint, Response, current_app, g, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from chatapp import errors
from chatapp.accounts import CurrentUser, current_user
from chatapp.chats import turns
from chatapp.chats.turns import StoredTurn
from chatapp.documents.search.grounding import Grounding
from chatapp.errors import ApiError
from chatapp.guards.body_deadline import LATE
from chatapp.guards.uploads import FULL
from chatapp.observability.logs import ChatRecord, request_id
from chatapp.observability.telemetry import Telemetry
from chatapp.relay import images, wire
from chatapp.relay.pending import PendingReply
from chatapp.relay.stream import Relay
from chatapp.relay.upstream import DEFAULT_RETRY_AFTER, ReplyStream, Upstream
from chatapp.store import current_store

bp = Blueprint("relay", __name__)


def _upstream() -> Upstream:
    upstream: Upstream = current_app.extensions["upstream"]
    return upstream


def _telemetry() -> Telemetry:
    telemetry: Telemetry = current_app.extensions["telemetry"]
    return telemetry


@bp.before_request
def _open_record() -> None:
    # Only a POST is a chat: Flask answers OPTIONS /chat itself, through these hooks too, and
    # must leave no chat line and no metric (it once counted -1 open stream each).
    if request.method != "POST":
        return
    rid = request_id(request.headers.get("X-Request-Id"))
    g.chat = ChatRecord(rid, observer=_telemetry().chat_observer(rid))  # telemetry: the end
    # Room for images; the text keeps MAX_REQUEST_BYTES (chat() counts it, images.py).
    request.max_content_length = images.body_limit(current_app.config)


@bp.after_request
def _tag_and_log_refusal(response: Response) -> Response:
    """Every answer to /chat carries the request id. An error answer (ApiError, Flask's own
    413 and the like) ends the chat: its line is logged here; a stream logs it when it ends."""
    record: ChatRecord | None = g.get("chat")
    if record is None:  # not a chat (OPTIONS)
        return response
    response.headers["X-Request-Id"] = record.request_id
    if not response.is_streamed:
        record.finish(response.status_code, errors.type_of(response))
    return response


def json_body(text_limit: int) -> Any:
    """The request's JSON; every way it can be wrong is a 400 in the envelope, never a 500.
    A body whose text (less its image URLs) is over `text_limit` bytes is a 413."""
    if request.environ.get(FULL):  # guards/uploads.py: as many chats with images as it takes
        seconds = DEFAULT_RETRY_AFTER
        raise ApiError(
            "busy",
            f"The chat app is relaying as many chats with images as it takes; trying again "
            f"in {seconds} s.",
            status=503,
            retry_after=seconds,
        )
    late = request.environ.get(LATE)
    if late is not None:  # guards/body_deadline.py: the body stalled
        message = f"The request did not arrive within {late:g} seconds."
        raise ApiError("request_timeout", message, status=408)
    try:
        raw = request.get_data(cache=True)
    except HTTPException:
        raise  # 413 over MAX_REQUEST_BYTES, and the like: Flask's own answer
    except Exception:  # the server could not read it: a garbage chunk size, a cut-off body
        raise ApiError(
            "invalid_request", "The request body could not be read.", status=400
        ) from None
    try:
        body = json.loads(raw)
    except RecursionError:
        raise ApiError(
            "invalid_request", "The request's JSON is nested too deeply.", status=400
        ) from None
    except ValueError:  # not JSON, or not UTF-8
        raise ApiError(
            "invalid_request", "The request body is not valid JSON.", status=400
        ) from None
    if images.text_bytes(len(raw), body) > text_limit:
        raise RequestEntityTooLarge()  # Flask's own 413, as for a body over the whole bound
    return body


def _turn_and_grounding(
    body: Any, payload: dict[str, Any], user: CurrentUser | None
) -> tuple[StoredTurn | None, Grounding | None]:
    """With a `chat_id`, the stored chat's turns go first (chatapp/chats/turns.py), chosen with
    a grounded question's passages already before it. A signed-in user's conversation gets a
    cache scope of its own, whatever id the page sent."""
    chat_id = body.get("chat_id") if isinstance(body, dict) else None
    if chat_id is None:
        if user is not None:
            payload["cache_scope"] = turns.scope(user.subject, payload["cache_scope"])
        grounding = _ground(body, payload["messages"], stored=False)
        if grounding is not None:  # the passages must fit in the bound the page kept
            payload["messages"] = turns.fit_conversation(payload["messages"], current_app.config)
        _mark_passages(payload, grounding)
        return None, grounding
    found: list[Grounding | None] = [None]

    def ground_new(message: dict[str, Any]) -> None:
        found[0] = _ground(body, [message], stored=True)

    turn = turns.start(
        current_store(), user or current_user(), chat_id, payload, current_app.config, ground_new
    )
    grounding = found[0]
    if grounding is not None:
        turn.ground(
            grounding.block,
            grounding.sources(),
            lambda reply: list(grounding.done_fields(reply)["citations"]),
        )
    _mark_passages(payload, grounding)
    return turn, grounding


def _mark_passages(payload: dict[str, Any], grounding: Grounding | None) -> None:
    """Tell our sidecar which texts of the turn are passages, and whose (its passage store
    reads each once and reuses it wherever a later question puts it: issue 54, /predict's
    `passages`); an OpenAI-compatible server is not sent them (upstream_openai.py)."""
    from chatapp.documents.owner import current_owner_id
    from chatapp.documents.warming import library_scope

    if grounding is None or not grounding.passages:
        return
    payload["passages"] = [passage.text for passage in grounding.passages]
    payload["passage_scope"] = library_scope(current_owner_id())


def _ground(
    body: dict[str, Any], messages: list[dict[str, Any]], *, stored: bool
) -> Grounding | None:
    """`"documents": true`: the newest turn answered from the caller's library; earlier turns
    keep the passages they were sent with (chatapp/documents/search/grounding.py). A stored chat's
    earlier turns come from the server (`stored`), never from the request's `grounding`."""
    from chatapp.documents.embedder import EmbeddingsFailed
    from chatapp.documents.owner import current_owner_id
    from chatapp.documents.search import grounding

    if not stored:
        grounding.restore_earlier(body, messages)
    if body.get("documents") is not True:
        return None
    config = current_app.config
    documents = current_app.extensions["documents"]
    searcher = documents.searcher
    last = messages[-1]
    began = time.monotonic()
    try:
        found = grounding.ground(
            searcher,
            current_owner_id(),
            grounding.question_of(last["content"]),
            k=config["DOCUMENT_PASSAGES"],
            budget=config["DOCUMENT_CONTEXT_TOKENS"],
            min_score=config["DOCUMENT_MIN_SCORE"],
            ratio=documents.chat_tokens.value,
        )
    except EmbeddingsFailed as failed:
        raise ApiError("embeddings_failed", str(failed), status=502) from None
    last["content"] = grounding.with_block(last["content"], found.block)
    record: ChatRecord | None = g.get("chat")
    if record is not None:
        record.grounding_ms = round((time.monotonic() - began) * 1000, 1)
        record.passages = len(found.passages)
    return found


def _learning(sent: list[dict[str, Any]]) -> Callable[[int | None, int | None], None]:
    """What a grounded turn's usage teaches the passages' budget (grounding.learn_from)."""
    from chatapp.documents.search import grounding

    documents = current_app.extensions["documents"]

    def learn(prompt_tokens: int | None, dropped_messages: int | None) -> None:
        grounding.learn_from(
            documents.chat_tokens, documents.searcher.sizing, sent, prompt_tokens, dropped_messages
        )

    return learn


@bp.post("/chat")
def chat() -> Response:
    record: ChatRecord = g.chat
    if request.mimetype != "application/json":
        raise ApiError(
            "unsupported_media_type",
            "Send the conversation as JSON (Content-Type: application/json).",
            status=415,
        )
    config = current_app.config
    # Who is asking, before the body is read: a 401 under a sign-in mode without a user.
    user = current_user() if config["AUTH_MODE"] != "none" else None
    body = json_body(config["MAX_CONTENT_LENGTH"])
    payload = wire.parse_chat_request(
        body,
        config["MAX_MESSAGES"],
        config["MAX_NEW_TOKENS_LIMIT"],
        max_images=config["MAX_IMAGES"],
        max_image_bytes=config["MAX_IMAGE_BYTES"],
    )
    turn, grounding = _turn_and_grounding(body, payload, user)
    record.model = payload.get("model")  # the done line and the log line name it
    if record.model is not None:  # it may load for this chat: the page's list is asked again
        current_app.extensions["model_list"].expire()
    record.messages = len(payload["messages"])
    record.images = images.count(payload["messages"]) or None
    default = config["MAX_NEW_TOKENS"]
    if "max_new_tokens" not in payload and default:
        # The app's default never undercuts a minimum the request asked for.
        payload["max_new_tokens"] = max(default, payload.get("min_new_tokens", 0))
    # The sidecar answers at once, unless it queues the chat: then the stream starts anyway,
    # with heartbeats while it waits (pending.py). A grounded turn's stream starts at once,
    # its sources first (issue 54): a refusal then comes as its error line.
    pending = PendingReply(_upstream(), payload, record.request_id)
    reply: ReplyStream | PendingReply = pending
    wait = 0.0 if grounding is not None else config["QUEUED_STREAM_AFTER"]
    if wait and pending.wait(wait):
        try:
            reply = pending.result()
        except ApiError as error:  # telemetry: the hop to the model service failed first
            _telemetry().upstream_error(error.type)
            raise
    body_iter = Relay(
        reply,
        record,
        config["HEARTBEAT_INTERVAL"],
        config["SIDECAR_READ_TIMEOUT"],
        config["RELAY_TIME_LIMIT"],
        on_end=None if turn is None else turn.end,
        grounding=grounding,
        on_usage=None if grounding is None else _learning(payload["messages"]),
    )
    _telemetry().stream_opened()  # telemetry: until the record's end with status 200
    return Response(
        body_iter,
        content_type=wire.CONTENT_TYPE,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
