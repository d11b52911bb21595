"""Stored chats as JSON, and messages from a client checked before they are stored.

A message as the API shows it: `{"role", "content", "created_at"}` plus, when present,
`"images"` (the user's images as `data:` URLs, in order), `"finish"` (how a reply ended:
`stop`, `length`, or the error that cut it off), and on a grounded reply `"citations"` (the
passages it cites: n, document_id, name, page, text) and `"sources"` (every passage it was
given, cited or not: n, name, page, document_id; `[]` when nothing matched); on a reply,
`"model"`, the id of the model it was asked of (absent: the model service's default). Times are
ISO-8601 UTC.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from chatapp.errors import ApiError
from chatapp.relay import images, wire
from chatapp.store.chats import AnyRow, NewMessage
from chatapp.store.models import FINISH_CHARS, TITLE_CHARS, Chat, Message

# The most messages one stored chat holds; past it a chat must be continued in a new one.
MAX_STORED_MESSAGES = 2000


def invalid(message: str) -> ApiError:
    return ApiError("invalid_request", message, status=400)


def timestamp(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def summary(chat: Chat | AnyRow) -> dict[str, Any]:
    return {
        "id": chat.id,
        "title": chat.title,
        "created_at": timestamp(chat.created_at),
        "updated_at": timestamp(chat.updated_at),
    }


def message_json(message: Message | AnyRow) -> dict[str, Any]:
    out: dict[str, Any] = {
        "role": message.role,
        "content": message.content,
        "created_at": timestamp(message.created_at),
    }
    if message.images:
        out["images"] = list(message.images)
    if message.finish is not None:
        out["finish"] = message.finish
    if message.citations is not None:
        out["citations"] = message.citations
    if message.sources is not None:
        out["sources"] = message.sources
    if message.model is not None:
        out["model"] = message.model
    return out


def wire_message(message: Message | AnyRow) -> dict[str, Any]:
    """A stored message as the model service takes it (images first, then the text)."""
    if not message.images:
        return {"role": message.role, "content": message.content}
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": url}} for url in message.images
    ]
    if message.content:
        parts.append({"type": "text", "text": message.content})
    return {"role": message.role, "content": parts}


def title(raw: Any) -> str:
    if raw is None:
        return ""
    if not isinstance(raw, str):
        raise invalid("title must be a string.")
    if wire.FORBIDDEN_CHARS.search(raw):
        raise invalid("title must not contain control characters.")
    return " ".join(raw.split())[:TITLE_CHARS]


def title_from(text: str) -> str:
    """A new chat's title from its first message: its first words, on one line."""
    words = " ".join(text.split())
    return words if len(words) <= 60 else words[:59].rstrip() + "…"


def moment(raw: Any, name: str) -> dt.datetime | None:
    """A client's time: ISO-8601, or milliseconds since 1970 (the page's Date.now())."""
    if raw is None:
        return None
    try:
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            value = dt.datetime.fromtimestamp(raw / 1000, dt.UTC)
        elif isinstance(raw, str):
            value = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
        else:
            raise ValueError(raw)
    except (ValueError, OverflowError, OSError):
        raise invalid(f"{name} must be an ISO-8601 time or milliseconds since 1970.") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return min(value, dt.datetime.now(dt.UTC))


def imported_messages(raw: Any, config: Mapping[str, Any]) -> list[NewMessage]:
    """A client's messages to store (a chat imported from the browser), checked as `POST /chat`
    checks a conversation: roles, text, images (at most MAX_IMAGES in all, each at most
    MAX_IMAGE_BYTES, only in the person's turns). The last may be a reply."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise invalid("messages must be a list.")
    if len(raw) > MAX_STORED_MESSAGES:
        raise ApiError(
            "payload_too_large",
            f"A chat holds at most {MAX_STORED_MESSAGES} messages.",
            status=413,
        )
    out: list[NewMessage] = []
    seen_images = 0
    for number, message in enumerate(raw, start=1):
        if not isinstance(message, dict) or message.get("role") not in wire.ROLES:
            raise invalid(f"Message {number} must have a role (system, user or assistant).")
        role, content = message["role"], message.get("content", "")
        if not isinstance(content, str):
            raise invalid(f"Message {number} must have a text content.")
        if role == "assistant":
            content = wire.visible(content)
        elif wire.FORBIDDEN_CHARS.search(content):
            raise invalid(f"Message {number} contains control characters; remove them.")
        urls = _images(message.get("images"), number, role, config, seen_images)
        seen_images += len(urls)
        finish = message.get("finish")
        if finish is not None and (not isinstance(finish, str) or len(finish) > FINISH_CHARS):
            raise invalid(f"Message {number}: finish must be a short string.")
        model = message.get("model")
        if model is not None and not wire.valid_model(model):
            raise invalid(f"Message {number}: {wire.MODEL_RULE}")
        out.append(
            NewMessage(
                role=role,
                content=content,
                images=urls or None,
                finish=finish if role == "assistant" else None,
                model=model if role == "assistant" else None,
                created_at=moment(message.get("created_at"), f"Message {number}'s created_at")
                or dt.datetime.now(dt.UTC),
            )
        )
    return out


def _images(raw: Any, number: int, role: str, config: Mapping[str, Any], seen: int) -> list[str]:
    if raw is None or raw == []:
        return []
    if role != "user":
        raise images.invalid(f"Message {number}: only your own messages may hold images.")
    if not isinstance(raw, list):
        raise invalid(f"Message {number}: images must be a list of data: URLs.")
    if seen + len(raw) > config["MAX_IMAGES"]:
        raise ApiError(
            "payload_too_large",
            f"A chat sent at once holds at most {config['MAX_IMAGES']} images.",
            status=413,
        )
    urls = []
    for index, url in enumerate(raw, start=1):
        part = images.check_image(
            {"type": "image_url", "image_url": {"url": url}},
            f"Image {index} of message {number}",
            config["MAX_IMAGE_BYTES"],
        )
        urls.append(part["image_url"]["url"])
    return urls
