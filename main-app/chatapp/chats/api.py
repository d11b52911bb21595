"""The chats API: one user's chats kept on the server.

- `GET /api/me` → `{"auth_mode", "server_chats", "user": {"name"} | null}`: whether this
  server keeps chats (a signed-in mode) and who is signed in; never a 401, so the page can ask.
- `GET /api/chats` (`?q=` full-text search over titles and messages, `?limit=`, at most 500)
  → `{"chats": [{"id", "title", "created_at", "updated_at"}]}`, newest first.
- `POST /api/chats` `{"title"?, "messages"?, "created_at"?, "updated_at"?}` → `201` with the
  chat as `GET` shows it. With `messages`, the chat is imported (the page's own chats, on first
  sign-in): checked as `POST /chat` checks a conversation (`chatapp.chats.convert`), its text
  up to `MAX_IMPORT_BYTES` (not one request's `MAX_REQUEST_BYTES`), else `413`.
- `GET /api/chats/<id>` → `{"id", "title", "created_at", "updated_at", "messages": [...]}`.
- `PATCH /api/chats/<id>` `{"title"}` renames it → the chat's summary.
- `DELETE /api/chats/<id>` → `204`.
- `DELETE /api/chats/<id>/messages?from=N&length=M` → `204`: the chat goes back to before its
  message `N` (0-based, as `GET` lists them), which must be one of the person's messages (else
  `400`); the next `POST /chat` with its `chat_id` continues from there (the page's edit and
  regenerate). `M` is how many messages the client saw the chat hold: if it holds another
  number now (another tab went on, or a reply stopped a moment ago is still being stored),
  nothing is cut and the answer is `409 conflict`; read the chat again.

Another user's chat, or one that does not exist, is `404 not_found` on every route: nobody
learns that an id exists. Each answer is `Cache-Control: no-store`. Each request logs one
`chatapp.request` line `api` (method, route pattern, status, error type, duration): never a
chat id, a title, a search or a message.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from flask import Blueprint, Response, current_app, g, jsonify, request
from werkzeug.exceptions import RequestEntityTooLarge

from chatapp import errors
from chatapp.accounts import current_user
from chatapp.chats import convert
from chatapp.errors import ApiError
from chatapp.relay import images
from chatapp.relay.chat import json_body
from chatapp.store import chats, current_store
from chatapp.store.models import Chat

bp = Blueprint("chats", __name__, url_prefix="/api")
request_log = logging.getLogger("chatapp.request")


@bp.before_request
def _started() -> None:
    g.api_started = time.monotonic()


@bp.after_request
def _log_line(response: Response) -> Response:
    started = g.get("api_started")
    fields: dict[str, Any] = {
        "method": request.method,
        "route": request.url_rule.rule if request.url_rule else None,
        "status": response.status_code,
    }
    if response.status_code >= 400:
        fields["error"] = errors.type_of(response)
    if started is not None:
        fields["duration_ms"] = round((time.monotonic() - started) * 1000, 1)
    request_log.info("api", extra={"fields": fields})
    return response


def no_such_chat() -> ApiError:
    return ApiError("not_found", "There is no such chat.", status=404)


def _answer(body: Any, status: int = 200) -> Response:
    response = jsonify(body)
    response.status_code = status
    response.headers["Cache-Control"] = "no-store"
    return response


def _object_body(limit: int | None = None) -> dict[str, Any]:
    if request.mimetype != "application/json":
        raise ApiError(
            "unsupported_media_type", "Send JSON (Content-Type: application/json).", status=415
        )
    body = json_body(limit or current_app.config["MAX_CONTENT_LENGTH"])
    if not isinstance(body, dict):
        raise convert.invalid("The request must be a JSON object.")
    return body


def _import_text_bytes(body: dict[str, Any]) -> int:
    """An import's bytes less the data: URLs of its messages' `images`."""
    size = len(request.get_data(cache=True))
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        urls = message.get("images") if isinstance(message, dict) else None
        for url in urls if isinstance(urls, list) else ():
            if isinstance(url, str):
                size -= len(url.encode("utf-8", "surrogatepass"))
    return size


@bp.get("/me")
def me() -> Response:
    mode = current_app.config["AUTH_MODE"]
    user = None
    if mode != "none":
        try:
            user = {"name": current_user().name}
        except ApiError:
            user = None
    return _answer({"auth_mode": mode, "server_chats": mode != "none", "user": user})


@bp.get("/chats")
def list_chats() -> Response:
    user = current_user()
    query = request.args.get("q")
    try:
        limit = min(int(request.args.get("limit", chats.LIST_LIMIT)), chats.LIST_LIMIT)
    except ValueError:
        raise convert.invalid("limit must be a whole number.") from None
    if limit < 1:
        raise convert.invalid("limit must be at least 1.")
    with current_store().session() as session:
        found = chats.list_chats(session, user.id, query, limit=limit)
        return _answer({"chats": [convert.summary(chat) for chat in found]})


def _full(chat: Chat) -> dict[str, Any]:
    return {
        **convert.summary(chat),
        "messages": [convert.message_json(m) for m in chat.messages],
    }


@bp.post("/chats")
def create_chat() -> Response:
    user = current_user()
    # An import may carry images: the room /chat gives them (relay/images.py); its text, the body
    # less the images' data: URLs, is a whole chat's, up to MAX_IMPORT_BYTES.
    config = current_app.config
    limit = images.body_limit(config, config["MAX_IMPORT_BYTES"])
    request.max_content_length = limit
    body = _object_body(limit)
    if _import_text_bytes(body) > config["MAX_IMPORT_BYTES"]:
        raise RequestEntityTooLarge()
    title = convert.title(body.get("title"))
    messages = convert.imported_messages(body.get("messages"), current_app.config)
    created = convert.moment(body.get("created_at"), "created_at")
    updated = convert.moment(body.get("updated_at"), "updated_at")
    if not title and messages:
        first = next((m for m in messages if m.role == "user"), None)
        title = convert.title_from(first.content) if first else ""
    with current_store().session(write=True) as session:
        chat = chats.create_chat(session, user.id, title, created_at=created, updated_at=updated)
        if messages:
            chats.append_messages(session, user.id, chat.id, messages)
            chat.updated_at = updated or max(m.created_at for m in messages)
        session.flush()
        chat_id = chat.id
    with current_store().session() as session:
        stored = chats.get_chat(session, user.id, chat_id, messages=True)
        assert stored is not None  # just made, in a committed transaction
        response = _answer(_full(stored), 201)
    response.headers["Location"] = f"/api/chats/{chat_id}"
    return response


@bp.get("/chats/<chat_id>")
def get_chat(chat_id: str) -> Response:
    user = current_user()
    with current_store().session() as session:
        found = chats.open_chat(session, user.id, chat_id)
    if found is None:
        raise no_such_chat()
    chat, rows = found
    return _answer({**convert.summary(chat), "messages": [convert.message_json(r) for r in rows]})


@bp.patch("/chats/<chat_id>")
def rename_chat(chat_id: str) -> Response:
    user = current_user()
    body = _object_body()
    if "title" not in body:
        raise convert.invalid('Send the new title: {"title": "..."}.')
    title = convert.title(body["title"])
    with current_store().session(write=True) as session:
        chat = chats.rename_chat(session, user.id, chat_id, title)
        if chat is None:
            raise no_such_chat()
        return _answer(convert.summary(chat))


def _whole_arg(name: str) -> int:
    raw = request.args.get(name, "")
    if not raw.isdigit() or len(raw) > 9:
        raise convert.invalid(f"Say {name}=N, a whole number (0 or more).")
    return int(raw)


@bp.delete("/chats/<chat_id>/messages")
def cut_chat(chat_id: str) -> Response:
    user = current_user()
    start, seen = _whole_arg("from"), _whole_arg("length")
    if start > seen:
        raise convert.invalid(
            "from must be at most length: a chat of length N has messages 0 to N-1."
        )
    with current_store().session(write=True) as session:
        outcome = chats.cut_messages(session, user.id, chat_id, start, seen)
    if outcome == "missing":
        raise no_such_chat()
    if outcome == "stale":
        raise ApiError(
            "conflict",
            "The chat has changed since you read it (it holds another number of messages); "
            "read it again.",
            status=409,
        )
    if outcome == "not_a_question":
        raise convert.invalid("Cut a chat at one of your own messages, not at a reply.")
    response = Response(status=204)
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.delete("/chats/<chat_id>")
def delete_chat(chat_id: str) -> Response:
    user = current_user()
    with current_store().session(write=True) as session:
        if not chats.delete_chat(session, user.id, chat_id):
            raise no_such_chat()
    response = Response(status=204)
    response.headers["Cache-Control"] = "no-store"
    return response
