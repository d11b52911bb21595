"""POST /v1/completions: OpenAI's (legacy) Completions API: a plain prompt, no chat template.

What evaluation harnesses (lm-evaluation-harness's `local-completions`) and the Kubernetes
Gateway API Inference Extension's model-server protocol call beside Chat Completions. The same
pipeline as the other generation routes (generation/pipeline.py): admission, worker, statuses, log
line, metrics, cancellation; the prompt is read as it is (model/prompt/builder.py,
PromptBuilder.plain).

Request, application/json (unknown fields are refused with 400 invalid_value, naming them):
  prompt        a string (its text encoded as the model's tokenizer encodes it, BOS
                included; added-token strings in it are those tokens: the whole prompt is the
                caller's), or token ids (each below the model's vocabulary size); a list of one
                of either is the same. More than one prompt: 400 (one choice per request)
  model         as /v1/chat/completions: any string up to 256 characters, echoed
  max_tokens    the reply's length limit; absent: 16, OpenAI's default for this API
  temperature, top_p, seed, top_k, stop, stream, stream_options, prompt_cache_key, user
                as /v1/chat/completions (absent temperature: greedy)
  logprobs      0 to 20: each token's log probability and that many most likely alternatives
                (model/logprobs.py: which distribution); null: none
  echo          true: the reply's text starts with the prompt (a string prompt only; not with
                logprobs: the prompt's own log probabilities are not computed)
  Accepted only where they change nothing: n 1, best_of 1, presence_penalty 0,
  frequency_penalty 0, logit_bias {}, suffix null.

Reply, stream false: {"id": "cmpl-<request id>", "object": "text_completion", "created", "model",
  "choices": [{"text", "index": 0, "logprobs": null | {"tokens", "token_logprobs",
  "top_logprobs", "text_offset"}, "finish_reason": "stop" | "length"}], "usage": {...}}
  (usage as /v1/chat/completions'). Stream true: text/event-stream, `data: <json>` events of
  the same object with each piece of text (with echo, the first is the prompt), a last one
  with text "" and the finish_reason, with include_usage one with "choices": [] and the usage,
  then `data: [DONE]`. An error after the first byte ends the stream without [DONE].
Errors: as /v1/chat/completions (OpenAI's shape; errors.REFUSALS' /v1 columns); a prompt that
  does not fit the context is 400 context_length_exceeded (no turn can be dropped).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Self, cast

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from sidecar import ipc
from sidecar.web.chat_completions.api import Ids, _event, _finish_reason, _json, _usage
from sidecar.web.chat_completions.logprobs import Legacy
from sidecar.web.chat_completions.schemas import (
    ModelName,
    StreamOptions,
    TopLogprobs,
    scope_of,
    unimplemented,
)
from sidecar.web.deps import PipelineDep, RecordDep, SettingsDep
from sidecar.web.generation.messages import (
    FORBIDDEN_CHARS,
    MAX_TEXT_CHARS,
    CacheScope,
    NewTokens,
    Seed,
    StopSequences,
    Temperature,
    TopK,
    TopP,
)
from sidecar.web.generation.pipeline import read_body
from sidecar.web.generation.reply import ReplyFormat

router = APIRouter()

DEFAULT_MAX_TOKENS = 16  # OpenAI's, for this API
NO_EFFECT: dict[str, tuple[object, str]] = {
    "n": (1, "only one choice (n=1) is supported"),
    "best_of": (1, "only best_of=1 is supported"),
    "presence_penalty": (0, "penalties are not supported (only 0)"),
    "frequency_penalty": (0, "penalties are not supported (only 0)"),
    "logit_bias": ({}, "logit_bias is not supported"),
    "suffix": (None, "suffix (insertion) is not supported"),  # null only
}
MAX_TOKEN_ID = 2**31 - 1
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]


def _one_prompt(value: object) -> object:
    """The prompt as text or token ids, checked here so that a wrong one is named plainly.
    OpenAI's prompt may also be a list of prompts (strings or token lists): one is accepted."""
    if isinstance(value, list) and value and isinstance(value[0], str | list):
        if len(value) > 1:
            raise ValueError("one prompt per request (a list of several makes several choices)")
        value = value[0]
    if value == "":  # whitespace is a prompt; nothing is not
        raise ValueError("the prompt is empty")
    # the message rules (generation/messages.py), checked here to name them
    if isinstance(value, str):
        if len(value) > MAX_TEXT_CHARS or FORBIDDEN_CHARS.search(value):
            raise ValueError(
                "text contains control characters or invalid code points, or is too long"
            )
        return value
    if not isinstance(value, list) or not value:
        raise ValueError("a string, or a non-empty list of token ids")
    if not all(type(i) is int and 0 <= i <= MAX_TOKEN_ID for i in value):
        raise ValueError("token ids are whole numbers from 0")
    return value


class CompletionRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    model: ModelName | None = None
    # What the document says (openapi.py): a string, token ids, or a list of one of either
    prompt: Annotated[
        Annotated[str, Field(min_length=1, max_length=MAX_TEXT_CHARS)]
        | Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[list[str], Field(min_length=1, max_length=1)]
        | Annotated[
            list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1, max_length=1)
        ],
        BeforeValidator(_one_prompt),
    ]
    max_tokens: NewTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None  # not OpenAI's; as /v1/chat/completions
    seed: Seed | None = None
    stop: StopSequences | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: TopLogprobs | None = None
    echo: bool = False
    prompt_cache_key: CacheScope | None = None
    user: CacheScope | None = None

    @model_validator(mode="before")
    @classmethod
    def _unimplemented(cls, data: Any) -> Any:
        return unimplemented(data, NO_EFFECT)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed when stream is true")
        if self.echo and not isinstance(self.prompt, str):
            raise ValueError("echo: only with a text prompt (token ids are not decoded here)")
        if self.echo and self.logprobs is not None:
            raise ValueError(
                "echo: not with logprobs (the prompt's own log probabilities are not computed)"
            )
        return self

    @property
    def plain_prompt(self) -> str | tuple[int, ...]:
        """ipc.Generate.prompt: the text, or the token ids (_one_prompt unwrapped a list)."""
        if isinstance(self.prompt, str):
            return self.prompt
        return tuple(cast(list[int], self.prompt))

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


@router.post("/v1/completions")
async def completions(
    request: Request, settings: SettingsDep, pipeline: PipelineDep, record: RecordDep
) -> Response:
    body = await read_body(request, settings.max_body_bytes, CompletionRequest)
    record.stream = body.stream
    prompt = body.plain_prompt
    generate = ipc.Generate(
        record.request_id,
        (),
        body.max_tokens or DEFAULT_MAX_TOKENS,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        seed=body.seed,
        cache_scope=scope_of(body.prompt_cache_key, body.user),
        stop=tuple(body.stop or ()),
        logprobs=body.logprobs,
        prompt=prompt,
    )
    entry = pipeline.resolve(body.model)  # 404 model_not_found with MODELS_FILE
    model = entry.id if pipeline.strict or body.model is None else body.model
    ids = Ids(f"cmpl-{record.request_id}", int(time.time()), model)
    echo = body.prompt if body.echo and isinstance(body.prompt, str) else ""
    keep = body.logprobs is not None
    reply_format: ReplyFormat
    if body.stream:
        reply_format = CompletionStream(ids, echo, keep, body.include_usage)
    else:
        reply_format = TextCompletion(ids, echo, keep)
    return await pipeline.run(request, record, generate, reply_format, entry)


class _Choice(ReplyFormat):
    """What both formats keep: the echoed prompt and the log probabilities not yet written."""

    def __init__(self, ids: Ids, echo: str, keep_logprobs: bool) -> None:
        self._ids = ids
        self._echo = echo
        self._legacy = Legacy(len(echo)) if keep_logprobs else None
        self._logprobs: list[ipc.TokenLogprob] = []

    def logprobs(self, entries: list[ipc.TokenLogprob]) -> None:
        self._logprobs += entries

    def _choice(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        written = None
        if self._legacy is not None:
            written, self._logprobs = self._legacy.chunk(self._logprobs), []
        return {"text": text, "index": 0, "logprobs": written, "finish_reason": finish_reason}


class TextCompletion(_Choice):
    """stream false: one text_completion object when the reply is complete."""

    media_type = "application/json"
    buffered = True

    def __init__(self, ids: Ids, echo: str, keep_logprobs: bool) -> None:
        super().__init__(ids, echo, keep_logprobs)
        self._text = [echo]

    def piece(self, text: str) -> bytes:
        self._text.append(text)
        return b""

    def tail(self, end: ipc.End, started: ipc.Started) -> bytes:
        choice = self._choice("".join(self._text), _finish_reason(end))
        usage = _usage(end, started)
        return _json(self._ids.object("text_completion", choices=[choice], usage=usage))


class CompletionStream(_Choice):
    """stream true: server-sent events, one text_completion object each, then [DONE]."""

    media_type = "text/event-stream"

    def __init__(self, ids: Ids, echo: str, keep_logprobs: bool, include_usage: bool) -> None:
        super().__init__(ids, echo, keep_logprobs)
        self._include_usage = include_usage

    def _chunk(self, text: str, finish_reason: str | None = None) -> bytes:
        usage = {"usage": None} if self._include_usage else {}
        choice = self._choice(text, finish_reason)
        return _event(self._ids.object("text_completion", choices=[choice], **usage))

    def head(self) -> bytes:
        return self._chunk(self._echo) if self._echo else b""

    def piece(self, text: str) -> bytes:
        return self._chunk(text) if text else b""

    def tail(self, end: ipc.End, started: ipc.Started) -> bytes:
        events = self._chunk("", _finish_reason(end))
        if self._include_usage:
            usage = _usage(end, started)
            events += _event(self._ids.object("text_completion", choices=[], usage=usage))
        return events + b"data: [DONE]\n\n"
