"""`POST /chat` with `"chat_id"`: continue a chat the server keeps.

The request's `messages` hold only the new user message (after an optional system message, the
page's setting, which is sent each turn and not stored). The prompt is the chat's stored turns
and then that message, so a client can no longer write the assistant's earlier turns. The
newest stored turns that fit go on (`fit`: the bounds a browser's conversation has, the oldest
left out first, as the page does); the model service may leave out more to fit its context.

The user's message and the reply are stored together when the reply ends (`StoredTurn.end`):
a complete reply with its finish (`stop`, `length`), one cut off with the error that cut it
(`upstream_timeout`, `upstream_disconnected`, `reply_time_limit`, a refusal's type) or
`client_gone` (the person stopped it, or left). A chat refused before any text came stores
nothing: the page says so and the person may send it again.

A grounded turn (`"documents": true`, chatapp/documents/search/grounding.py) is stored with the
block of passages it was sent with (`messages.grounding`) and its reply with the passages it cites
(`citations`, checked against that block, as the done line's) and every passage it was given
(`sources`, the stream's first line; `[]` when nothing matched), so a chat opened again lists
them as the page did when the reply came. Every reply keeps the model it was asked of (the
request's `model`; none for the model service's default), so a chat opened again shows it and
goes on with it. Later turns put each stored
block back before its question, from the database: the prompt begins as before (the model
service's cache reads it) and no client can write an earlier turn's passages. The new turn's
own passages go before its question before `fit` chooses the stored turns (`start`'s
`ground`), so they are counted: else a chat whose turns just fit beside the bare question
went over MAX_REQUEST_BYTES with them, and the model service refused it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chatapp.accounts import CurrentUser
from chatapp.chats import convert
from chatapp.documents.search.grounding import with_block
from chatapp.errors import ApiError
from chatapp.relay import wire
from chatapp.store import Store, chats
from chatapp.store.chats import AnyRow, NewMessage

log = logging.getLogger(__name__)
# JSON's share of a message beyond its text, counted against MAX_REQUEST_BYTES.
MESSAGE_OVERHEAD = 40


def scope(subject: str, conversation: str) -> str:
    """The model service's cache scope for one user's conversation: the user's subject, hashed
    (it never leaves the app), then the conversation, so no two users ever share a scope."""
    user = hashlib.sha256(subject.encode("utf-8")).hexdigest()[:32]
    return f"user-{user}:{conversation}"


def _size(message: Mapping[str, Any]) -> tuple[int, int]:
    """(text bytes, images) of a message as it goes on."""
    content = message["content"]
    if isinstance(content, str):
        return len(content.encode("utf-8")) + MESSAGE_OVERHEAD, 0
    text = sum(len(p["text"].encode("utf-8")) for p in content if p["type"] == "text")
    return text + MESSAGE_OVERHEAD * len(content), sum(p["type"] == "image_url" for p in content)


def fit(
    stored: Sequence[AnyRow], head: list[dict[str, Any]], config: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The newest stored turns that fit with `head` (the system message, if any, and the new
    user message) in MAX_MESSAGES, MAX_REQUEST_BYTES of text and MAX_IMAGES images."""
    return _newest_that_fit(
        (_as_sent(m) for m in reversed(stored) if m.role != "system"), head, config
    )


def _as_sent(message: AnyRow) -> dict[str, Any]:
    turn = convert.wire_message(message)
    if message.grounding is not None:  # a grounded turn, as it was sent
        turn["content"] = with_block(turn["content"], message.grounding)
    return turn


def fit_conversation(
    messages: list[dict[str, Any]], config: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """A conversation the client sent whole, after its newest turn grew (a grounded turn's
    passages): its system message and newest turn, and the newest earlier turns that still fit
    by `fit`'s rules; the oldest are left out first, as the page leaves them out itself."""
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    head = [*system, messages[-1]]
    earlier = messages[len(system) : -1]
    return [*system, *_newest_that_fit(reversed(earlier), head, config), messages[-1]]


def _newest_that_fit(
    newest_first: Iterable[dict[str, Any]], head: list[dict[str, Any]], config: Mapping[str, Any]
) -> list[dict[str, Any]]:
    messages_left = config["MAX_MESSAGES"] - len(head)
    bytes_left = config["MAX_CONTENT_LENGTH"] - sum(_size(m)[0] for m in head) - 200
    images_left = config["MAX_IMAGES"] - sum(_size(m)[1] for m in head)
    kept: list[dict[str, Any]] = []
    for turn in newest_first:
        size, pictures = _size(turn)
        if messages_left < 1 or size > bytes_left or pictures > images_left:
            break
        kept.append(turn)
        messages_left, bytes_left, images_left = (
            messages_left - 1,
            bytes_left - size,
            images_left - pictures,
        )
    kept.reverse()
    return kept


@dataclass
class StoredTurn:
    """The new user message of a stored chat, stored with its reply when the reply ends."""

    store: Store
    owner_id: int
    chat_id: str
    user_message: NewMessage
    title: str | None  # the chat's first message names it
    # The sources the reply cites (a grounded answer: the documents feature sets them before
    # the reply ends); stored with the reply.
    citations: list[dict[str, Any]] | None = None
    # A grounded turn's: the reply's citations, read from its text when it ends (`ground`).
    cite: Callable[[str], list[dict[str, Any]]] | None = None
    # A grounded turn's: the passages it was given (`ground`); None for a turn not grounded.
    sources: list[dict[str, Any]] | None = None
    # The model the reply is asked of (the request's `model`); None: the default.
    model: str | None = None

    def ground(
        self,
        block: str,
        sources: list[dict[str, Any]],
        cite: Callable[[str], list[dict[str, Any]]],
    ) -> None:
        """This turn was sent with `block` before its question, listing `sources` (`Grounding.
        sources()`: n, name, page, document_id); `cite` finds the passages a reply cites
        (chatapp/documents/search/grounding.py)."""
        self.user_message.grounding = block
        self.sources = sources
        self.cite = cite

    def end(self, reply: str, finish: str, started: bool) -> None:
        """Store the turn (`started`: whether any reply came, or it ended normally)."""
        if not started:
            return
        if self.cite is not None:
            self.citations = self.cite(reply)
        try:
            with self.store.session(write=True) as session:
                answer = NewMessage(
                    "assistant",
                    reply,
                    finish=finish,
                    citations=self.citations,
                    sources=self.sources,
                    model=self.model,
                )
                turn = [self.user_message, answer]
                if chats.append_messages(session, self.owner_id, self.chat_id, turn) is None:
                    return  # deleted while the reply streamed: nothing to keep it in
                if self.title:
                    chat = chats.get_chat(session, self.owner_id, self.chat_id)
                    if chat is not None and not chat.title:
                        chat.title = self.title
        except Exception:
            log.exception("could not store a chat's turn")


def start(
    store: Store,
    user: CurrentUser,
    chat_id: Any,
    payload: dict[str, Any],
    config: Mapping[str, Any],
    ground: Callable[[dict[str, Any]], object] | None = None,
) -> StoredTurn:
    """Put the stored chat's turns before the request's new message in `payload` (checked by
    chatapp.relay.wire), and its cache scope; raises 404 for a chat that is not the user's. `ground`
    (a grounded turn) puts the passages into the new message, once the chat is known to be
    the user's and before the stored turns are fitted around it."""
    if not isinstance(chat_id, str) or not wire.CONVERSATION_ID.fullmatch(chat_id):
        raise ApiError("not_found", "There is no such chat.", status=404)
    head = payload["messages"]
    if len(head) > 2 or (len(head) == 2 and head[0]["role"] != "system"):
        raise convert.invalid(
            "With a chat_id, send only the new message (after a system message, if any): "
            "the chat's earlier turns are kept on the server."
        )
    with store.session() as session:
        found = chats.open_chat(session, user.id, chat_id)
    if found is None:
        raise ApiError("not_found", "There is no such chat.", status=404)
    chat, stored = found
    title = None if chat.title else convert.title_from(_text(head[-1]["content"]))
    if len(stored) + 2 > convert.MAX_STORED_MESSAGES:
        raise ApiError(
            "payload_too_large",
            "This chat is as long as a chat gets; start a new chat.",
            status=413,
        )
    system = head[:-1]
    new = head[-1]
    content = new["content"]  # the question as asked: what is stored
    if ground is not None:
        ground(new)
    payload["messages"] = system + fit(stored, head, config) + head[-1:]
    payload["cache_scope"] = scope(user.subject, f"chat-{chat_id}")
    urls = (
        [p["image_url"]["url"] for p in content if p["type"] == "image_url"]
        if isinstance(content, list)
        else []
    )
    return StoredTurn(
        store,
        user.id,
        chat_id,
        NewMessage("user", _text(content), images=urls or None),
        title or None,
        model=payload.get("model"),
    )


def _text(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(p["text"] for p in content if p["type"] == "text")
