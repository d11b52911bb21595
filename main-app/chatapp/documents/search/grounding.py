"""Grounded turns: `POST /chat` with `"documents": true` answers from the caller's library.

The newest user turn is searched (`Searcher`, the owner's passages only), the passages that fit
`DOCUMENT_CONTEXT_TOKENS` are numbered [1]..[N] and written into that turn, before the
question: never into the system prompt, which stays the same for every turn, so the model
service's conversation cache keeps the conversation's prefix. The `done` line carries the
block the turn was sent with (`grounding`); the page keeps it on that message and sends it
back (`"grounding"` on the user message) so that a follow-up's prompt begins with exactly the
tokens of the one before and is read from the cache (`cached_tokens`). When nothing relevant
is found the turn says so to the model, which is told to say so too.

The reply's `[n]` are checked against the N passages (`citations.py`): the `done` line lists
the cited passages (`citations`: n, document_id, name, page, text) and apart those that name
none (`unknown_citations`), never linked to a passage.

The budget is counted in the encoder's tokens (each passage's `tokens`) times the chat model's
tokens per encoder token (`ChatTokenRatio`): the chat model's tokenizer is not the app's to
read. It starts at `CHAT_TOKENS_PER_ENCODER_TOKEN` (Phi-3's SentencePiece made up to 1.2 of
MiniLM's WordPiece tokens of English prose) and learns the model actually behind the app from
each grounded turn's usage: the model service's `prompt_tokens` for the prompt against the
app's own count of the same text. Measured: the generated test model's byte-level BPE makes
1.6 per MiniLM token of the Python FAQ, so a fixed 1.25 gave 1,974 chat tokens of passages for
a budget of 1,200. The default 1,200 leaves a 4,096-token model room for the conversation and
a reply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from chatapp.documents.reading.tokens import TokenCounter
from chatapp.documents.search.citations import check
from chatapp.documents.search.retrieval import Passage, Searcher
from chatapp.errors import ApiError
from chatapp.relay import images
from chatapp.relay.wire import FORBIDDEN_CHARS

CHAT_TOKENS_PER_ENCODER_TOKEN = 1.25
# A grounded prompt shorter than this (in the encoder's tokens) teaches the ratio nothing: the
# chat template's own tokens would weigh too much in it
MIN_LEARNING_TOKENS = 100
# What a tokenizer pair plausibly gives (without EMBED_TOKENIZER the app counts bytes: about
# 0.25 chat tokens each); a reading outside is clipped
RATIO_BOUNDS = (0.1, 4.0)
MAX_GROUNDING_CHARS = 60_000
INSTRUCTION = (
    "Answer the question below from these passages, and cite each passage you use as [n] "
    "with its number. If they do not answer it, say that the documents do not cover it."
)
NOTHING_FOUND = (
    "No passage of my documents matches the question below. Say that the documents do not "
    "cover it; answer from what you know only if you can, and say that you did."
)


class ChatTokenRatio:
    """The chat model's tokens per encoder token, learned from grounded turns (one per app
    process: each gunicorn worker learns from its own turns)."""

    def __init__(self, start: float = CHAT_TOKENS_PER_ENCODER_TOKEN) -> None:
        self.value = start
        self.readings = 0

    def observe(self, chat_tokens: int, encoder_tokens: int) -> None:
        """A prompt of `encoder_tokens` (the app's count of its text) was `chat_tokens` to
        the model service."""
        if encoder_tokens < MIN_LEARNING_TOKENS or chat_tokens <= 0:
            return
        low, high = RATIO_BOUNDS
        reading = min(max(chat_tokens / encoder_tokens, low), high)
        # The first reading replaces the assumption; later ones are averaged in
        self.value = reading if not self.readings else (self.value + reading) / 2
        self.readings += 1


@dataclass(frozen=True)
class Grounding:
    passages: list[Passage]
    block: str  # what the turn was sent with, before the question

    def sources(self) -> list[dict[str, Any]]:
        """The passages as the stream's first line lists them (wire.sources), before any reply."""
        return [
            {"n": n, "name": p.name, "page": p.page, "document_id": p.document_id}
            for n, p in enumerate(self.passages, start=1)
        ]

    def done_fields(self, reply: str) -> dict[str, Any]:
        checked = check(reply, len(self.passages))
        cited = [
            {"n": n, "document_id": p.document_id, "name": p.name, "page": p.page, "text": p.text}
            for n in checked.cited
            for p in [self.passages[n - 1]]
        ]
        return {"citations": cited, "unknown_citations": checked.unknown, "grounding": self.block}


def ground(
    searcher: Searcher,
    owner_id: int,
    question: str,
    *,
    k: int,
    budget: int,
    min_score: float,
    ratio: float = CHAT_TOKENS_PER_ENCODER_TOKEN,
) -> Grounding:
    """Search the owner's library for `question`; the passages that fit `budget` chat tokens
    (`ratio`: chat tokens per encoder token)."""
    found = searcher.search(owner_id, question, k)
    # Held to the question's cosine where the method has one (dense, hybrid)
    found = [p for p in found if p.similarity is None or p.similarity >= min_score]
    kept: list[Passage] = []
    used = 0
    for passage in found:
        cost = math.ceil(passage.tokens * ratio) + 12  # its label line
        if used + cost > budget:
            break
        kept.append(passage)
        used += cost
    if not kept:
        return Grounding([], NOTHING_FOUND)
    return Grounding(kept, block_of(kept))


def block_of(passages: list[Passage]) -> str:
    """The block a turn is sent with: the passages numbered [1]..[N], then the instruction.
    What stands before a passage depends only on the passages before it (the passage store
    reuses a prompt's first tokens: documents/warming.py)."""
    lines = ["Passages from my documents:", ""]
    for n, passage in enumerate(passages, start=1):
        where = ", ".join(
            part
            for part in (
                passage.name,
                f"page {passage.page}" if passage.page else "",
                passage.heading,
            )
            if part
        )
        lines += [f"[{n}] {where}", passage.text, ""]
    lines.append(INSTRUCTION)
    return "\n".join(lines)


def with_block(content: str | list[dict[str, Any]], block: str) -> str | list[dict[str, Any]]:
    """A user turn's content with the block before its question."""
    if isinstance(content, str):
        return f"{block}\n\nQuestion: {content}"
    return [{"type": "text", "text": block + "\n\nQuestion:"}, *content]


def restore_earlier(body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
    """Put back the block each earlier user turn was sent with (its `grounding`), as sent."""
    raw = body.get("messages")
    earlier = zip((raw or [])[:-1], messages[:-1], strict=False)  # the newest turn is searched
    for number, (sent, clean) in enumerate(earlier, start=1):
        block = sent.get("grounding") if isinstance(sent, dict) else None
        if block is None or clean["role"] != "user":
            continue
        if (
            not isinstance(block, str)
            or len(block) > MAX_GROUNDING_CHARS
            or FORBIDDEN_CHARS.search(block)
        ):
            raise ApiError(
                "invalid_request",
                f"Message {number}'s grounding must be the text the app sent in its done line.",
                status=400,
            )
        clean["content"] = with_block(clean["content"], block)


def learn_from(
    ratio: ChatTokenRatio,
    counter: TokenCounter,
    messages: list[dict[str, Any]],
    prompt_tokens: int | None,
    dropped_messages: int | None,
) -> None:
    """After a grounded turn: its prompt's tokens to the model service against the app's count
    of its messages' text. Nothing is learned from a prompt with images (their tokens are not
    text's) or one the service shortened (`dropped_messages`)."""
    if prompt_tokens is None or dropped_messages or images.count(messages):
        return
    text = "\n".join(question_of(message["content"]) for message in messages)
    ratio.observe(prompt_tokens, counter.count(text))


def question_of(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(part["text"] for part in content if part.get("type") == "text")
