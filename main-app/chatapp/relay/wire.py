"""The browser wire format: what the page sends to `POST /chat` and what it gets back.

Request
-------
`POST /chat` with `Content-Type: application/json` and the whole conversation so far::

    {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}

The last message is the user's new turn. A user message's `content` may instead be a list of
OpenAI's content parts, to carry images: `{"type": "text", "text": "..."}` and
`{"type": "image_url", "image_url": {"url": "data:image/png;base64,...", "detail"?: "auto"}}`
(a PNG, JPEG, WEBP or GIF file as a `data:` URL; never a web address: the app fetches
nothing). A request holds at most `MAX_IMAGES` images, each at most `MAX_IMAGE_BYTES`, and
its text (the body less its image URLs) at most `MAX_REQUEST_BYTES` (`chatapp.relay.images`). A
user message with an image may have no text. Parts go on in their order (the page puts the
images first, Phi-3-vision's own convention); a message without images goes on as one string
(text parts joined a part per line, as the sidecar reads them).

Only the first message may be a system message; system and user messages must not be blank,
nor contain control characters other than tab, newline and carriage return (nor lone
surrogates). In assistant messages, the replies the page
sends back, such characters are made visible instead (`visible`, below), as the text of every
reply already is: a chat that holds one from before (stored by an older app) goes on.
Optional: `"max_new_tokens"` (a positive integer), `"min_new_tokens"` (a whole number, at most
`max_new_tokens`: the end of the reply is held off until then; benchmarks use it to pin the
length) and `"temperature"` (0 to 2; 0, absent or below 1e-5 means greedy, and is sent as 0),
passed on to the model service; both token counts are at most the app's
`MAX_NEW_TOKENS_LIMIT`. The page keeps the history and sends all of it each time; the app
keeps nothing between requests.

Optional `"conversation_id"`: 1 to 64 characters of `A-Z a-z 0-9 _ -`, the same for every
request of one chat and new for a new chat (the page makes a random one per chat). It names the
conversation's scope in the model service's conversation cache; it is not part of the prompt.
Only requests with the same id reuse each other's cached tokens, and the `done` line's
`cached_tokens` is an exact oracle for whoever shares a scope: it tells whether a prompt begins
with what another request of that scope sent. So keep an id secret to its conversation (the
page's are random). A request without one gets a fresh random scope of its own, never the
model service's shared unscoped pool: it works the same, with nothing to reuse.

Optional `"model"`: the model to answer, an id `GET /api/models` lists (1 to 256 characters,
no spaces or control characters); absent, the model service's default (our sidecar's first
pinned model; with UPSTREAM_API=openai, `UPSTREAM_MODEL` or the first one listed). It goes on
as `/predict`'s `model`, or as the OpenAI request's `model`. A name the model service does not
serve is `model_not_found` (404).

Errors before the reply starts
------------------------------
A 4xx or 5xx status with the body `{"error": {"message": "...", "type": "..."}}`, where
`message` is one sentence for the person using the page. (A chat the model service keeps in its
queue for longer than `QUEUED_STREAM_AFTER` (3 s) gets its `200` stream at once, with pings while it
waits; a refusal that comes after that is the stream's last line, an `error` with the same
type: chatapp/relay/pending.py.) The types:

- `loading` (503 + `Retry-After`): the model is still loading; try again after that many seconds.
- `busy` (503 + `Retry-After`): the model service has as many replies queued as it takes (or,
  another OpenAI-compatible server, answered 429).
- `upstream_unavailable` (503): the model service is not reachable.
- `model_failed` (503): the model service could not load its model (no point retrying).
- `context_overflow` (413): the newest message does not fit in the model's context.
- `payload_too_large` (413), `invalid_request` (400), `unsupported_media_type` (415): the
  request itself is wrong (too big, malformed, not JSON).
- `invalid_image` (400): an image part is not a `data:` URL of a PNG, JPEG, WEBP or GIF file
  (a web address, another type, bad base64, bytes that are not the type it names), or is in
  a system or assistant message; too large an image, or too many, is `payload_too_large`. The
  model service's own refusal of an image (it decodes them; a model that reads text only
  refuses any) is `invalid_request` with its sentence.
- `model_not_found` (404): the request's `model` is not one the model service serves (it
  was taken out since the page listed it); `GET /api/models` lists those it serves.
- `upstream_timeout` (504): the model service did not start answering in time.
- `restarting` (503 + `Retry-After`): the model service is replacing a model worker that died or
  stopped answering; try again after that many seconds.
- `upstream_unauthorized` (502): the model service refused the app's key (`UPSTREAM_API_KEY`).
- `invalid_host` (400): the request's Host is not one of `ALLOWED_HOSTS`.
- `upstream_error` (502): the model service failed, or is misconfigured for the app (its
  `ALLOWED_HOSTS` does not name the host in `SIDECAR_URL`; the message says which).
- `request_timeout` (408): the request's body did not arrive within `REQUEST_BODY_TIMEOUT`.
- `internal_error` (500), `not_found` (404), `method_not_allowed` (405).

The reply stream
----------------
`200` with `Content-Type: application/x-ndjson; charset=utf-8`: one JSON object per line, each line
ending in a newline (`\\n`; newlines inside text are escaped, so split on `\\n` only). In order:

- `{"sources": [{"n", "name", "page", "document_id"}, ...]}`: a grounded turn's (`"documents":
  true`) first line, written as soon as its passages are chosen and before the model service is
  asked: the passages the reply is given, numbered as the model reads them (`[n]`), each its
  document's name, page (`null` for a file without pages) and id. An empty list when nothing
  relevant was found. A grounded turn's stream starts at once with it, so a refusal of the model
  service (busy, loading, too long) comes as the stream's `error` line, with `retry_after`
  (seconds) where waiting heals it.
- `{"progress": {"read": n, "total": m, "seconds_left": s}}`: while the model reads a prompt
  of 256 tokens or more (after what its caches held), about once a second until the first
  delta: prompt tokens read (an estimate between the model service's reports, never
  decreasing), of `total`, and the seconds left at the rate measured (`null` until one is).
  From our sidecar only (`/predict`'s events, or its `/v1` stream's `progress` member).
- `{"loading": {"model": id, "seconds": s, "seconds_left": n}}`: the model asked for is not
  loaded, and the model service is loading it (our sidecar with several models, issue 56): its
  id, the seconds it has been loading, and about how many are left by its last load (`null`
  for a first load). About once a second until it is ready, before any `progress` or delta.
- `{"delta": "..."}`: the next piece of the reply, as the model writes it; the reply is the
  concatenation of the deltas. A delta never ends inside a character, and holds no control
  character but tab, newline and carriage return: the others are shown as their Unicode
  control pictures (ESC as U+241B, DEL as U+2421), a C1 control or a lone surrogate as
  U+FFFD (`visible`). Show it as text, never as HTML.
- `{"ping": true}`: a heartbeat, written about once a second while the model service is silent
  (while the chat waits in its queue, or during a long prompt's prefill), so that a browser that
  went away is noticed. Ignore it.
- Exactly one last line, either
  - `{"done": true, "tokens": n, "ttft_ms": t, "tokens_per_s": r}`: the reply is complete.
    `tokens` is the number of tokens the model generated, as the model service counts them
    (the sidecar's `generated_tokens`, an OpenAI server's `usage.completion_tokens`); from a
    server that gives no count, the pieces of text relayed (fewer than the tokens when a piece
    carries several). `ttft_ms` is the time from the request reaching this app to the first
    piece; `tokens_per_s` is the tokens after the first piece per second from the first piece
    to the last. Either is `null` when it cannot be measured. Present when the model service
    reports them:
    `finish_reason`: `"stop"` (the model ended its reply) or `"length"` (the reply reached
    `max_new_tokens` or the end of the model's context: it is cut short, and the page says so);
    `prompt_tokens` (the prompt's size in tokens), `cached_tokens` (how many of those the
    model service took from its conversation cache instead of reading them again; at most
    `prompt_tokens`) and `dropped_messages` (how many of the oldest messages were left out so
    that the conversation fits the model's context); from our sidecar, on a grounded turn,
    `passage_cached_tokens` (of `prompt_tokens`, those its passage store held: passages read
    before, documents/warming.py; absent when none). `model`: the model the request named
    (absent: the model service's default answered). A reply the person stops has no `done`
    line: the page knows it cancelled it.
  - or `{"error": {"message": "...", "type": "..."}}`: the reply broke off after it started;
    the deltas before it are the part received. Types: `upstream_disconnected` (the model
    service stopped mid-reply), `upstream_timeout` (it went silent for longer than
    `SIDECAR_READ_TIMEOUT`) and `reply_time_limit` (the chat reached `RELAY_TIME_LIMIT`, which
    ends it before App Service's front end would cut it off at 230 s).

A stream that ends without a `done` line (the connection dropped) is cut off, exactly like one
that ends with an `error` line.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from chatapp.errors import ApiError
from chatapp.relay import images

MIMETYPE = "application/x-ndjson"
# With the charset said: clients that guess otherwise (the requests library) decode it right.
CONTENT_TYPE = f"{MIMETYPE}; charset=utf-8"
ROLES = ("system", "user", "assistant")
# What the model service refuses in message text (its web/generation/messages.py;
# tests/test_contracts.py keeps them equal): C0 controls except tab, newline and carriage
# return; DEL and C1 controls; lone surrogates (possible through JSON \\ud800 escapes). The app
# refuses them in system and user turns too, and makes them visible in assistant turns, so
# that what it sends on never holds one.
FORBIDDEN_CHARS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
_SURROGATE_PAIR = re.compile(r"[\ud800-\udbff][\udc00-\udfff]")
CONVERSATION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
# A model's name: what the model service lists, so anything printable without spaces (our
# sidecar's ids, Ollama's `llama3.2:1b`, `hf.co/owner/repo:Q4_K_M`), never a control character.
MODEL_NAME = re.compile(r"[^\s\x00-\x1f\x7f-\x9f\ud800-\udfff]{1,256}")
MODEL_RULE = "model must be 1 to 256 characters without spaces or control characters."
# A temperature below this is greedy: sent as 0, so no model service divides by it (the
# sidecar's ipc.MIN_TEMPERATURE; tests/test_contracts.py keeps them equal).
MIN_TEMPERATURE = 1e-5


def _pictured(match: re.Match[str]) -> str:
    code = ord(match[0])
    if code < 0x20:
        return chr(0x2400 + code)  # the Control Pictures block: ESC is U+241B
    return "\u2421" if code == 0x7F else "\ufffd"  # DEL; C1 controls and lone surrogates


def visible(text: str) -> str:
    """`text` with nothing the message rules refuse: each C0 control but tab, newline and
    carriage return becomes its control picture (U+2400 + its code; ESC is U+241B), DEL
    U+2421, a C1 control or a lone surrogate U+FFFD. A surrogate pair (two JSON escapes read
    apart) becomes its character. Model output gets this (chatapp.relay.upstream, for every reply)
    rather than a refusal, so a model or an upstream that writes ESC never ends a chat."""
    if not FORBIDDEN_CHARS.search(text):
        return text
    text = _SURROGATE_PAIR.sub(
        lambda pair: pair[0].encode("utf-16-le", "surrogatepass").decode("utf-16-le"), text
    )
    return FORBIDDEN_CHARS.sub(_pictured, text)


def valid_model(value: Any) -> bool:
    """Whether `value` can name a model (MODEL_NAME)."""
    return isinstance(value, str) and MODEL_NAME.fullmatch(value) is not None


def _invalid(message: str) -> ApiError:
    return ApiError("invalid_request", message, status=400)


def _content(
    content: Any, number: int, role: str, image_limits: tuple[int, int], seen: int
) -> tuple[str | list[dict[str, Any]], int]:
    """A message's content, checked: a string, or (with images) its list of parts; and the
    number of images in it. `image_limits` is (MAX_IMAGES, MAX_IMAGE_BYTES); `seen` the
    images of the messages before."""
    if isinstance(content, str):
        return content, 0
    if not isinstance(content, list) or not content:
        raise _invalid(f"Message {number} must have a text content.")
    parts: list[dict[str, Any]] = []
    found = 0
    max_images, max_bytes = image_limits
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            found += 1
            where = f"Image {found} of message {number}"
            if role != "user":
                raise images.invalid(f"{where}: only your own messages may hold images.")
            if max_images == 0:
                raise images.invalid("This chat app does not take images.")
            if seen + found > max_images:
                raise ApiError(
                    "payload_too_large",
                    f"The conversation has more than {max_images} images; start a new chat.",
                    status=413,
                )
            parts.append(images.check_image(part, where, max_bytes))
        else:
            raise _invalid(
                f"Message {number} has a content part that is neither text nor an image_url."
            )
    if not found:  # text parts alone: one string, one part per line (as the sidecar reads them)
        return "\n".join(part["text"] for part in parts), 0
    return parts, found


def _text_of(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(part["text"] for part in content if part["type"] == "text")


def parse_chat_request(
    body: Any,
    max_messages: int,
    max_new_tokens_limit: int | None = None,
    *,
    max_images: int = 0,
    max_image_bytes: int = 0,
) -> dict[str, Any]:
    """Check a decoded `POST /chat` body; returns the request in /predict's terms (a
    `conversation_id` becomes its `cache_scope`), which upstream_openai.py maps to OpenAI's.
    `max_images` and `max_image_bytes` bound its images (none by default)."""
    if not isinstance(body, dict):
        raise _invalid("The request must be a JSON object with a list of messages.")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("The request must contain a non-empty list of messages.")
    if len(messages) > max_messages:
        raise ApiError(
            "payload_too_large",
            f"The conversation has more than {max_messages} messages; start a new chat.",
            status=413,
        )
    clean = []
    seen = 0
    for number, message in enumerate(messages, start=1):
        if not isinstance(message, dict):
            raise _invalid(f"Message {number} must be an object with a role and a content.")
        role, raw = message.get("role"), message.get("content")
        if role not in ROLES:
            raise _invalid(f"Message {number} has no valid role (system, user or assistant).")
        if role == "system" and number > 1:
            raise _invalid("Only the first message may be a system message.")
        content, found = _content(raw, number, role, (max_images, max_image_bytes), seen)
        seen += found
        text = _text_of(content)
        if role != "assistant" and not text.strip() and not found:
            raise _invalid(f"Message {number} is empty.")
        if role == "assistant":
            # A reply the page sends back: made visible as the app shows replies, not refused,
            # since nobody can edit it (the model service still refuses them in any turn).
            content = visible(text)
        elif FORBIDDEN_CHARS.search(text):
            raise _invalid(f"Message {number} contains control characters; remove them.")
        clean.append({"role": role, "content": content})
    if clean[-1]["role"] != "user":
        raise _invalid("The last message must be the user's.")
    payload: dict[str, Any] = {"messages": clean}
    for name, least in (("max_new_tokens", 1), ("min_new_tokens", 0)):
        value = body.get(name)
        if value is not None:
            if type(value) is not int or value < least:
                raise _invalid(f"{name} must be a whole number of at least {least}.")
            if max_new_tokens_limit is not None and value > max_new_tokens_limit:
                raise _invalid(f"{name} must be at most {max_new_tokens_limit}.")
            payload[name] = value
    if "max_new_tokens" in payload and payload.get("min_new_tokens", 0) > payload["max_new_tokens"]:
        raise _invalid("min_new_tokens must not exceed max_new_tokens.")
    temperature = body.get("temperature")
    if temperature is not None:
        if type(temperature) not in (int, float) or not 0 <= temperature <= 2:
            raise _invalid("temperature must be a number from 0 to 2.")
        payload["temperature"] = float(temperature) if temperature >= MIN_TEMPERATURE else 0.0
    conversation_id = body.get("conversation_id")
    if conversation_id is not None:
        if not isinstance(conversation_id, str) or not CONVERSATION_ID.fullmatch(conversation_id):
            raise _invalid("conversation_id must be 1 to 64 letters, digits, '-' or '_'.")
        payload["cache_scope"] = conversation_id
    else:  # never the unscoped pool, where cached_tokens would tell what others sent
        payload["cache_scope"] = "once-" + secrets.token_hex(16)
    model = body.get("model")
    if model is not None:
        if not valid_model(model):
            raise _invalid(MODEL_RULE)
        payload["model"] = model
    return payload


def _line(obj: dict[str, Any]) -> bytes:
    # json.dumps escapes control characters such as newlines inside strings, so each object
    # stays on one line; NEL, U+2028 and U+2029 are escaped too, for readers (such as Python's
    # str.splitlines) that also end lines there.
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    for char in "\x85\u2028\u2029":
        text = text.replace(char, f"\\u{ord(char):04x}")
    return (text + "\n").encode("utf-8")


def delta(text: str) -> bytes:
    return _line({"delta": text})


def sources(listed: list[dict[str, Any]]) -> bytes:
    return _line({"sources": listed})


def progress(read: int, total: int, seconds_left: float | None) -> bytes:
    return _line({"progress": {"read": read, "total": total, "seconds_left": seconds_left}})


def loading(model: str, seconds: float, seconds_left: float | None) -> bytes:
    return _line({"loading": {"model": model, "seconds": seconds, "seconds_left": seconds_left}})


PING = _line({"ping": True})


def done(
    tokens: int,
    ttft_ms: float | None,
    tokens_per_s: float | None,
    *,
    finish_reason: str | None = None,
    prompt_tokens: int | None = None,
    cached_tokens: int | None = None,
    dropped_messages: int | None = None,
    passage_cached_tokens: int | None = None,
    model: str | None = None,
    **grounded: Any,
) -> bytes:
    """The last line; a grounded turn adds `citations`, `unknown_citations` and `grounding`
    (chatapp/documents/search/grounding.py)."""
    obj: dict[str, Any] = {"done": True}
    if finish_reason is not None:
        obj["finish_reason"] = finish_reason
    obj.update(tokens=tokens, ttft_ms=ttft_ms, tokens_per_s=tokens_per_s)
    if prompt_tokens is not None:
        obj["prompt_tokens"] = prompt_tokens
    if cached_tokens is not None:
        obj["cached_tokens"] = cached_tokens
    if dropped_messages is not None:
        obj["dropped_messages"] = dropped_messages
    if passage_cached_tokens:
        obj["passage_cached_tokens"] = passage_cached_tokens
    if model is not None:
        obj["model"] = model
    obj.update(grounded)
    return _line(obj)


def error(message: str, type: str, retry_after: int | None = None) -> bytes:
    body: dict[str, Any] = {"message": message, "type": type}
    if retry_after is not None:  # a refusal that waiting heals (loading, busy, restarting)
        body["retry_after"] = retry_after
    return _line({"error": body})
