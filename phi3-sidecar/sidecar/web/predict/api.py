"""POST /predict: the original sample's contract, {"input_text": ...} -> streamed text/plain.

Request, application/json, validated strictly (no type coercion; unknown fields are refused):
  input_text    one user message (the sample's body, still valid as it was), or
  messages      [{"role": "system" | "user" | "assistant", "content": "..."}], the whole
                conversation (system only first, the last one from the user;
                generation/messages.py); content may also be a list of parts, {"type": "text",
                "text": "..."} and {"type": "image_url", "image_url": {"url":
                "data:image/png;base64,..."}} (images in user messages only), as
                /v1/chat/completions takes them
  images        with input_text: data URLs of images, placed before the text (Phi-3-vision's
                own order); checked as images/decoding.py says, read only by a vision model
  system        a system message for input_text
  max_new_tokens, min_new_tokens   reply length bounds (EOS is held back until the minimum)
  temperature (0-2; 0 or absent: greedy), top_p, top_k, seed    sampling
  cache_scope   who may reuse this conversation's cached tokens (1-256 characters; the chat
                app sends one per browser conversation); absent: the shared unscoped pool
  stop          up to 4 strings that end the reply where they would begin (never shown)
  passages      a grounded request's passages (up to 32 texts of up to 32,768 characters, each
                standing verbatim in a message): the passage store reads each once and reuses
                its K/V wherever a later prompt holds it (docs/documents.md)
  model         with MODELS_FILE: the model to answer (an id or alias, /v1/models; absent:
                the default; another name: 404 model_not_found); without it: any name, unused
  passage_scope whose passage store they are in (1-256 characters; the chat app sends one per
                library owner); absent: the shared pool (within the API key's owner)

Reply: 200 text/plain; charset=utf-8, streamed: each chunk is the text of one or more new
tokens, sent as soon as it is decoded, never ending inside a character; nothing around it.
With `Accept: application/x-ndjson` instead: one JSON object per line, {"text": "..."} as the
text comes (before the first, while a prompt of 256 tokens or more to read is read:
{"progress": {"read", "total", "seconds_left"}} lines, generation/progress.py and docs/api.md),
then {"done": true, "finish_reason": "stop" | "length", "generated_tokens",
"prompt_tokens", "image_tokens", "cached_tokens", "passage_cached_tokens",
"dropped_messages"} (with MODELS_FILE also "model": the id of the model that answered)
("length" also when the reply reached REPLY_TIME_LIMIT_S: the log line's
outcome says time_limit); or, if the generation fails after the first byte, {"error":
{"message", "type": "generation_failed"}} as the last line.
Headers: X-Request-Id, X-Prompt-Tokens, X-Cached-Tokens (of those, how many the conversation
cache already held, so were not read again), X-Passage-Cached-Tokens (of those, how many came
from the passage store), X-Image-Tokens (of the prompt tokens, those that
stand for images), X-Dropped-Messages (the oldest turns left out so the conversation fits the
context). An error after the first byte ends the stream without its
final chunk, so the client sees an incomplete response rather than a normal end.

Everything that can be refused is refused before the response starts, with the status and
type of errors.REFUSALS (the same pipeline as /v1/chat/completions: generation/pipeline.py).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Self

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sidecar import ipc
from sidecar.ipc import Role
from sidecar.web.deps import ImagesDep, PipelineDep, RecordDep, SettingsDep
from sidecar.web.errors import ApiError
from sidecar.web.generation.messages import (
    MAX_MESSAGES,
    MAX_PARTS,
    CacheScope,
    ChatMessage,
    ImagePart,
    NewTokens,
    NonBlankText,
    Parts,
    Passages,
    Seed,
    StopSequences,
    Temperature,
    TopK,
    TopP,
    check_image_roles,
    check_passages,
    check_roles,
    images_of,
    not_blank,
    text_of,
)
from sidecar.web.generation.pipeline import read_body
from sidecar.web.generation.progress import ProgressEvent
from sidecar.web.generation.reply import ReplyFormat
from sidecar.web.images.decoding import ImageRef, body_allowance

router = APIRouter()


class PredictMessage(ChatMessage):
    """A message whose content is a string or a list of text and image_url parts."""

    content: Parts  # type: ignore[assignment]

    @model_validator(mode="after")
    def _content_needed(self) -> Self:
        check_image_roles(self.role, self.content)
        if self.role != "assistant" and not self.has_images:
            not_blank(self.text)
        return self

    @property
    def text(self) -> str:
        return text_of(self.content)

    @property
    def has_images(self) -> bool:
        return any(isinstance(part, ImagePart) for part in self.content)


class PredictRequest(BaseModel):
    """Either input_text (one user turn) or messages (a conversation ending with a user turn)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    input_text: NonBlankText | None = None
    messages: list[PredictMessage] | None = Field(None, min_length=1, max_length=MAX_MESSAGES)
    # with input_text: its images, before its text (data URLs; images/decoding.py)
    images: Annotated[list[str], Field(max_length=MAX_PARTS)] | None = None
    system: NonBlankText | None = None
    max_new_tokens: NewTokens | None = None
    min_new_tokens: int | None = Field(None, ge=0, le=131072, description="EOS is held back")
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    seed: Seed | None = None
    cache_scope: CacheScope | None = None
    stop: StopSequences | None = None
    passages: Passages | None = None
    passage_scope: CacheScope | None = None
    model: Annotated[str, Field(min_length=1, max_length=256)] | None = None

    @model_validator(mode="after")
    def _one_conversation(self) -> Self:
        if (
            self.min_new_tokens is not None
            and self.max_new_tokens is not None
            and self.min_new_tokens > self.max_new_tokens
        ):
            raise ValueError("min_new_tokens must not exceed max_new_tokens")
        if (self.input_text is None) == (self.messages is None):
            raise ValueError("give either input_text or messages")
        if self.images is not None and self.input_text is None:
            raise ValueError(
                "images: only with input_text (in messages, give image_url content parts)"
            )
        if self.messages is not None:
            roles = [m.role for m in self.messages]
            check_roles(roles)
            if self.system is not None and roles[0] == "system":
                raise ValueError("give the system message either in system or in messages")
        check_passages(self.passages, [text for _, text in self.conversation()])
        return self

    def conversation(self) -> tuple[tuple[Role, str], ...]:
        turns: list[tuple[Role, str]] = [("system", self.system)] if self.system else []
        if self.messages is not None:
            turns += [(m.role, m.text) for m in self.messages]
        else:
            assert self.input_text is not None
            turns.append(("user", self.input_text))
        return tuple(turns)

    def image_refs(self) -> list[ImageRef]:
        """The images, in order, each where it stands in `conversation()`."""
        first = 1 if self.system else 0  # the system turn comes first
        if self.messages is None:
            urls = self.images or []
            return [ImageRef(url, f"images.{i}", first, 0) for i, url in enumerate(urls)]
        refs: list[ImageRef] = []
        for index, message in enumerate(self.messages):
            if message.has_images:
                refs += images_of(message.content, first + index, f"messages.{index}.content")
        return refs


class PlainText(ReplyFormat):
    """text/plain: each piece of text as it comes, nothing around it."""

    media_type = "text/plain"

    def piece(self, text: str) -> bytes:
        return text.encode()


class Events(ReplyFormat):
    """application/x-ndjson, for clients that ask for it (Accept): the text as events, and
    how the reply ended (what text/plain cannot say). The chat app reads this."""

    media_type = "application/x-ndjson"
    shows_progress = True

    def piece(self, text: str) -> bytes:
        return _line({"text": text})

    def progress(self, event: ProgressEvent) -> bytes:
        return _line({"progress": event.as_json()})

    def loading(self, event: dict[str, Any]) -> bytes:
        return _line({"loading": event})

    def refused(self, error: ApiError) -> bytes:
        # Only after a stream started early for a model that loads (web/models/): what the
        # refusal's JSON body would say (`phase` for not_ready: "failed" will not heal)
        return _line({"error": {"message": error.message, "type": error.kind, **error.extra}})

    def tail(self, end: ipc.End, started: ipc.Started) -> bytes:
        return _line(
            {
                "done": True,
                # time_limit (REPLY_TIME_LIMIT_S) is cut short by a limit too
                "finish_reason": "length" if end.finish in ("length", "time_limit") else "stop",
                "generated_tokens": end.generated_tokens,
                "prompt_tokens": started.prompt_tokens,
                "image_tokens": started.image_tokens,  # of prompt_tokens
                "cached_tokens": started.cached_tokens,
                "passage_cached_tokens": started.passage_cached_tokens,
                "dropped_messages": started.dropped_messages,
                # With MODELS_FILE, the model that answered (its id, whatever name was sent)
                **({"model": self.model_id} if self.model_id else {}),
            }
        )

    def failure(self) -> bytes:
        message = "the generation failed after the reply started; see the sidecar log"
        return _line({"error": {"message": message, "type": "generation_failed"}})


def _line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def wants_events(request: Request) -> bool:
    """Accept names application/x-ndjson (with a q above 0)."""
    for entry in request.headers.get("accept", "").split(","):
        media, *params = (part.strip().lower() for part in entry.split(";"))
        if media == Events.media_type and not any(p in ("q=0", "q=0.0") for p in params):
            return True
    return False


@router.post("/predict")
async def predict(
    request: Request,
    settings: SettingsDep,
    pipeline: PipelineDep,
    record: RecordDep,
    images: ImagesDep,
) -> Response:
    allowance = body_allowance(settings)  # images' data URLs, beyond MAX_BODY_BYTES
    body = await read_body(request, settings.max_body_bytes, PredictRequest, allowance)
    entry = pipeline.resolve(body.model)  # 404 model_not_found with MODELS_FILE
    refs = body.image_refs()
    checked = await images.prepare(refs, record)  # 400s naming the image
    max_new_tokens = body.max_new_tokens or settings.max_new_tokens
    generate = ipc.Generate(
        record.request_id,
        body.conversation(),
        max_new_tokens,
        images=checked,
        image_slots=tuple((ref.message, ref.offset) for ref in refs),
        min_new_tokens=min(body.min_new_tokens or 0, max_new_tokens),
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        seed=body.seed,
        cache_scope=None if body.cache_scope is None else "scope:" + body.cache_scope,
        stop=tuple(body.stop or ()),
        passages=tuple(body.passages or ()),
        passage_scope=body.passage_scope,
    )
    reply_format = Events() if wants_events(request) else PlainText()
    return await pipeline.run(request, record, generate, reply_format, entry)
