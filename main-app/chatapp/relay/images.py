"""Images in a chat: the `image_url` content parts `POST /chat` takes, checked before they go on.

An image is a `data:` URL (`data:image/png;base64,...`) of a PNG, JPEG, WEBP or GIF file, as
in OpenAI's content parts; the app fetches no address (nor does our sidecar), so an `http(s)`
URL is refused with a sentence that says so. Each image's file is at most `MAX_IMAGE_BYTES`
(after base64), a request holds at most `MAX_IMAGES` (the sidecar's own limits, the same
defaults; 0 turns images off in the app), and its first bytes must be the format its URL
names. Whether the file decodes is the model service's to say (the sidecar decodes and
re-encodes every image with Pillow before the model sees it): the app holds no image library.

The body limit: a request's text keeps `MAX_REQUEST_BYTES`, whatever images it carries. The
app reads up to `body_limit` (that, plus room for `MAX_IMAGES` images in base64) and then
counts the body's bytes less its image URLs against `MAX_REQUEST_BYTES` (`text_bytes`), so a
request without images is refused 413 as before, and one with images may be larger only by
its images.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator, Mapping
from typing import Any

from chatapp.errors import ApiError

# MIME type -> how such a file begins (WEBP: "RIFF", four bytes of size, "WEBP").
FORMATS: dict[str, tuple[bytes, ...]] = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),
}
DETAILS = ("auto", "low", "high")  # OpenAI's; passed on, our sidecar ignores it
_DATA_URL = re.compile(r"data:([a-z0-9.+/-]+);base64,(.*)", re.I | re.S)
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
# JSON around each image part in a body: {"type":"image_url","image_url":{"url":"..."}} and
# a detail, with room to spare.
PART_OVERHEAD = 128


def body_limit(config: Mapping[str, Any], text: int | None = None) -> int:
    """The most bytes `POST /chat` reads: the text's bound (`text`, else MAX_REQUEST_BYTES)
    plus `MAX_IMAGES` images' worth."""
    per_image = 4 * -(-config["MAX_IMAGE_BYTES"] // 3) + len("data:image/jpeg;base64,")
    text = config["MAX_CONTENT_LENGTH"] if text is None else text
    return text + config["MAX_IMAGES"] * (per_image + PART_OVERHEAD)


def image_urls(body: Any) -> Iterator[str]:
    """The `image_url.url` strings of a decoded body, looked for leniently (before the body is
    checked): what `text_bytes` leaves out of the count."""
    messages = body.get("messages") if isinstance(body, dict) else None
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else ():
            image = part.get("image_url") if isinstance(part, dict) else None
            url = image.get("url") if isinstance(image, dict) else None
            if isinstance(url, str):
                yield url


def text_bytes(size: int, body: Any) -> int:
    """A body's bytes less its image URLs (ASCII when they are data URLs: one byte each)."""
    return size - sum(len(url.encode("utf-8", "surrogatepass")) for url in image_urls(body))


def count(messages: list[dict[str, Any]]) -> int:
    """The images in checked messages (chatapp.relay.wire.parse_chat_request's)."""
    return sum(
        part["type"] == "image_url"
        for message in messages
        if isinstance(message["content"], list)
        for part in message["content"]
    )


def invalid(message: str) -> ApiError:
    return ApiError("invalid_image", message, status=400)


def check_image(part: dict[str, Any], where: str, max_bytes: int) -> dict[str, Any]:
    """An `image_url` part, checked; returns it as it goes on (`url`, and `detail` if given).
    `where` names the image in the messages ("Image 1 of message 3")."""
    image = part.get("image_url")
    if isinstance(image, str):  # an older form some clients send: the URL alone
        image = {"url": image}
    if not isinstance(image, dict) or not isinstance(image.get("url"), str):
        raise invalid(f"{where} must have an image_url with a url.")
    url: str = image["url"]
    if re.match(r"\s*(https?|ftp|file):", url, re.I):
        raise invalid(
            f"{where} is a web address; attach the image itself (a data: URL): the chat app "
            "fetches no address."
        )
    match = _DATA_URL.fullmatch(url)
    if match is None:
        raise invalid(f"{where} must be a data: URL (data:image/png;base64,...).")
    mime, encoded = match[1].lower(), re.sub(r"\s+", "", match[2])
    if mime not in FORMATS:
        raise invalid(f"{where} must be a PNG, JPEG, WEBP or GIF image, not {mime[:40]}.")
    # The decoded size, from the length alone: a huge string is refused before it is decoded.
    size = len(encoded) * 3 // 4 - encoded[-2:].count("=")
    if size > max_bytes:
        raise ApiError(
            "payload_too_large",
            f"{where} is larger than the {_size(max_bytes)} allowed for one image; "
            "make it smaller.",
            status=413,
        )
    if len(encoded) % 4 or not _BASE64.fullmatch(encoded):
        raise invalid(f"{where} is not valid base64.")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise invalid(f"{where} is not valid base64.") from None
    if not data:
        raise invalid(f"{where} is empty.")
    if not data.startswith(FORMATS[mime]) or (mime == "image/webp" and data[8:12] != b"WEBP"):
        raise invalid(f"{where} is not the {mime} file its data: URL says it is.")
    clean: dict[str, Any] = {"url": f"data:{mime};base64,{encoded}"}
    detail = image.get("detail")
    if detail is not None:
        if detail not in DETAILS:
            raise invalid(f"{where}: detail must be one of {', '.join(DETAILS)}.")
        clean["detail"] = detail
    return {"type": "image_url", "image_url": clean}


def _size(count: int) -> str:
    """A byte count as people read it: 5 MiB, 512 KiB, 300 bytes."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count} bytes"
