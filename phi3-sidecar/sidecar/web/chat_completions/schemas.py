"""The /v1/chat/completions request body (the wire format is described in chat_completions/api.py).

Validated as strictly as /predict's (schemas.py: the same message rules, the same option
ranges, no type coercion). Fields that OpenAI clients often send but that this service does not
implement are accepted only when absent, null or at the value where they change nothing; any
other value is refused naming the field (400 invalid_value, OpenAI's status), never silently
ignored. The one exception is documented apart: llama.cpp's server fields, which apps written
for App Service's built-in model sidecar extension send (chat_completions/llamacpp_fields.py: mapped
where this sidecar has their meaning, a listed set accepted and ignored).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from sidecar import ipc
from sidecar.ipc import Role
from sidecar.web.chat_completions import llamacpp_fields, tool_protocol
from sidecar.web.chat_completions.llamacpp_fields import PredictLimit, RepeatPenalty
from sidecar.web.chat_completions.tools import (
    MAX_TOOLS,
    NamedToolChoice,
    ResponseFormat,
    TextFormat,
    ToolCall,
    ToolChoice,
    ToolSpec,
)
from sidecar.web.generation.messages import (
    MAX_MESSAGES,
    AudioPart,
    CacheScope,
    ChatMessage,
    ChatParts,
    ImagePart,
    NewTokens,
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
from sidecar.web.images.decoding import ImageRef
from sidecar.web.structured import guidance

# OpenAI fields without an implementation here: accepted only at the value (or null).
NO_EFFECT: dict[str, tuple[object, str]] = {
    "n": (1, "only one choice (n=1) is supported"),
    "presence_penalty": (0, "penalties are not supported (only 0)"),
    "frequency_penalty": (0, "penalties are not supported (only 0)"),
    "logit_bias": ({}, "logit_bias is not supported"),
}
# Accepted with any string: it labels the request for OpenAI's own abuse monitoring, which
# means nothing here. (`prompt_cache_key` and `user` scope the conversation cache: fields.)
LABELS = ("safety_identifier",)
# Accepted with any value of their type, changing nothing: completions are never stored,
# metadata is OpenAI's bookkeeping.
IGNORED: dict[str, type] = {"store": bool, "metadata": dict}


def _no_effect(value: object, neutral: object) -> bool:
    if isinstance(value, bool) or isinstance(neutral, bool):
        return value is neutral
    if isinstance(neutral, int):
        return isinstance(value, int | float) and value == neutral
    return type(value) is type(neutral) and value == neutral


def unimplemented(
    data: Any,
    no_effect: dict[str, tuple[object, str]],
    labels: tuple[str, ...] = (),
    ignored: dict[str, type] | None = None,
) -> Any:
    """The body without the fields a route accepts only where they change nothing
    (`no_effect`: absent, null or the value), accepts as labels (strings) or accepts and
    ignores (`ignored`: any value of the type); ValueError naming a field at another value."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    for name, (neutral, reason) in no_effect.items():
        value = data.pop(name, None)
        if value is not None and not _no_effect(value, neutral):
            raise ValueError(f"{name}: {reason}")
    for name in labels:
        value = data.pop(name, None)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{name}: must be a string")
    for name, kind in (ignored or {}).items():
        value = data.pop(name, None)
        if value is not None and not isinstance(value, kind):
            raise ValueError(f"{name}: must be a {kind.__name__}")
        if isinstance(value, dict) and not _metadata(value):
            raise ValueError(f"{name}: at most 16 string keys and string values")
    return data


def scope_of(prompt_cache_key: str | None, user: str | None) -> str | None:
    """The conversation cache's scope of an OpenAI request (ipc.Generate.cache_scope)."""
    if prompt_cache_key is not None:
        return "key:" + prompt_cache_key
    return None if user is None else "user:" + user


def _metadata(value: dict[Any, Any]) -> bool:
    """OpenAI's limits: 16 pairs, keys up to 64 and values up to 512 characters."""
    return len(value) <= 16 and all(
        isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
        for k, v in value.items()
    )


class OpenAIMessage(ChatMessage):
    """A /predict message whose content may also be a list of text and image_url parts
    (generation/messages.py; images in user messages only), whose role may be `developer` (OpenAI's
    newer name for the system message), and which may have a `name` (a participant's name: accepted,
    not shown to the model). An assistant message may carry the `tool_calls` it made (its
    content then may be null), and a `tool` message answers one of them (`tool_call_id`):
    chat_completions/tool_protocol.py writes both into the prompt."""

    role: Literal["system", "developer", "user", "assistant", "tool"]  # type: ignore[assignment]
    content: ChatParts | None = None  # type: ignore[assignment]
    name: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    tool_calls: Annotated[list[ToolCall], Field(min_length=1, max_length=MAX_TOOLS)] | None = None
    tool_call_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None

    @model_validator(mode="after")
    def _content_needed(self) -> Self:
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only an assistant message has tool_calls")
        if (self.tool_call_id is not None) != (self.role == "tool"):
            raise ValueError("a tool message, and only a tool message, has a tool_call_id")
        if self.content is None and self.tool_calls is None:
            raise ValueError("content is required (null only with tool_calls)")
        check_image_roles(self.role, self.content)
        text = self.text
        # audio is checked once transcribed (web/audio/parts.py)
        shown = self.has_images or any(isinstance(p, AudioPart) for p in self.content or ())
        if self.role not in ("assistant", "tool") and text is not None and not shown:
            not_blank(text)
        return self

    @property
    def text(self) -> str | None:
        """The content's text (its text parts, one per line); None: no content."""
        return None if self.content is None else text_of(self.content)

    @property
    def has_images(self) -> bool:
        return any(isinstance(part, ImagePart) for part in self.content or ())

    @property
    def plain_role(self) -> Role:
        """The role in the prompt: a tool's result is read as the user's turn."""
        if self.role == "developer":
            return "system"
        return "user" if self.role == "tool" else self.role

    def turn(self) -> tool_protocol.Turn:
        return tool_protocol.Turn(self.role, self.text, self.tool_calls or (), self.tool_call_id)


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    include_usage: bool = False
    include_obfuscation: bool = False  # OpenAI's padding against length side channels: none here


# Each token's most likely alternatives (OpenAI's bound), with logprobs.
TopLogprobs = Annotated[int, Field(ge=0, le=ipc.MAX_TOP_LOGPROBS)]


def logprobs_count(logprobs: bool | None, top_logprobs: int | None) -> int | None:
    """ipc.Generate.logprobs of OpenAI's pair of fields (None: no log probabilities)."""
    if top_logprobs and not logprobs:
        raise ValueError("top_logprobs: only with logprobs true")
    return (top_logprobs or 0) if logprobs else None


# The model asked for: echoed in every reply object and stream chunk, so bounded (a 60 KB name
# made a 2.2 MB stream) and valid Unicode (a lone surrogate cannot be encoded: 500, or an empty
# streamed 200); pydantic checks both once the string has constraints.
ModelName = Annotated[str, Field(max_length=256)]


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    model: ModelName | None = None
    messages: list[OpenAIMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: NewTokens | None = None
    max_completion_tokens: NewTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None  # not OpenAI's; as in /predict (and vLLM)
    seed: Seed | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: StopSequences | None = None
    # Scope the conversation cache (model/kv/prompt_cache.py): only requests with the same key
    # (else the same user) reuse each other's cached tokens; neither: the unscoped pool.
    prompt_cache_key: CacheScope | None = None
    user: CacheScope | None = None
    # Structured output (chat_completions/tools.py, structured/guidance.py): held to by a grammar,
    # not asked for.
    response_format: ResponseFormat | None = None
    tools: Annotated[list[ToolSpec], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    _grammar: guidance.Grammar | None = PrivateAttr(default=None)
    # Each generated token's log probability (model/logprobs.py says of which distribution)
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    # llama.cpp server fields, sent by apps written for App Service's built-in model sidecar
    # extension; what each means here (and the ones accepted and ignored):
    # chat_completions/llamacpp_fields.py.
    n_predict: PredictLimit | None = None
    cache_prompt: bool = True
    repeat_penalty: RepeatPenalty | None = None
    # Not OpenAI's (as in /predict): a grounded request's passages, texts that stand verbatim in
    # its messages, and whose passage store they are in (model/kv/passages.py)
    passages: Passages | None = None
    passage_scope: CacheScope | None = None

    @model_validator(mode="before")
    @classmethod
    def _llamacpp(cls, data: Any) -> Any:
        return llamacpp_fields.accept(data) if isinstance(data, dict) else data

    @model_validator(mode="before")
    @classmethod
    def _unimplemented(cls, data: Any) -> Any:
        return unimplemented(data, NO_EFFECT, LABELS, IGNORED)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        check_roles([m.plain_role for m in self.messages])
        if None not in (self.max_tokens, self.max_completion_tokens) and (
            self.max_tokens != self.max_completion_tokens
        ):
            raise ValueError("max_tokens and max_completion_tokens differ; give one of them")
        llamacpp_fields.reply_limit(self.n_predict, self.max_tokens, self.max_completion_tokens)
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed when stream is true")
        self._check_tools()
        check_passages(self.passages, [text for _, text in self._placed()[0]])
        if logprobs_count(self.logprobs, self.top_logprobs) is not None and self.calls_tools:
            raise ValueError("logprobs: not available with tools (a call's tokens are no content)")
        return self

    def _check_tools(self) -> None:
        names = [t.function.name for t in self.tools or ()]
        if len(set(names)) != len(names):
            raise ValueError("tools: two tools have the same name")
        choice = self.tool_choice
        if choice not in (None, "none") and not names:
            raise ValueError("tool_choice: only allowed when tools are given")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"tool_choice: no tool named {choice.function.name!r} in tools")
        response_format = self.response_format
        if isinstance(response_format, TextFormat):
            response_format = None
        parallel = self.parallel_tool_calls is not False
        try:
            self._grammar = guidance.held_to(
                response_format, self.tools or (), self.tool_choice, parallel
            )
        except RecursionError:
            field = "tools" if self.tools else "response_format"
            raise ValueError(f"{field}: the schema is nested too deeply") from None
        if self.stop and self._grammar is not None:
            raise ValueError(
                "stop: stop sequences cannot be combined with response_format or tools "
                "(they would cut the structure)"
            )
        called = set()
        for message in self.messages:
            called |= {c.id for c in message.tool_calls or ()}
            if message.tool_call_id is not None and message.tool_call_id not in called:
                raise ValueError("messages: a tool message answers no earlier tool call")

    @property
    def max_new_tokens(self) -> int | None:
        return llamacpp_fields.reply_limit(
            self.n_predict, self.max_tokens, self.max_completion_tokens
        )

    def generate(
        self, request_id: str, default_max_new_tokens: int, images: tuple[bytes, ...] = ()
    ) -> ipc.Generate:
        """The worker's request for this body; `images`: image_refs()' images, checked
        (images/decoding.py)."""
        conversation, where = self._placed()
        slots = tuple((ref.message, ref.offset) for ref in self._image_refs(where))
        return ipc.Generate(
            request_id,
            conversation,
            self.max_new_tokens or default_max_new_tokens,
            images=images,
            image_slots=slots if images else (),
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            cache_scope=self.cache_scope,
            stop=tuple(self.stop or ()),
            guidance=self.guidance,
            use_cache=self.cache_prompt,
            repetition_penalty=self.repeat_penalty,
            logprobs=self.logprobs_count,
            passages=tuple(self.passages or ()),
            passage_scope=self.passage_scope,
        )

    @property
    def logprobs_count(self) -> int | None:
        """ipc.Generate.logprobs: None, none; else the alternatives listed per token."""
        return logprobs_count(self.logprobs, self.top_logprobs)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def conversation(self) -> tuple[tuple[Role, str], ...]:
        return self._placed()[0]

    def image_refs(self) -> list[ImageRef]:
        """The images of the messages, in order, each where it stands in the conversation."""
        return self._image_refs(self._placed()[1])

    def _placed(self) -> tuple[tuple[tuple[Role, str], ...], list[int | None]]:
        """The conversation the worker reads, and where each message went in it."""
        if self.tools or any(m.tool_calls or m.role == "tool" for m in self.messages):
            turns = [m.turn() for m in self.messages]
            return tool_protocol.placed(turns, self.tools or (), self.tool_choice or "auto")
        plain = tuple((m.plain_role, m.text or "") for m in self.messages)
        return plain, list(range(len(plain)))

    def audio_chars(self) -> int:
        """The characters of the input_audio parts' base64 (read_body's allowance for them)."""
        parts = (p for m in self.messages for p in m.content or ())
        return sum(len(p.input_audio.data) for p in parts if isinstance(p, AudioPart))

    def _image_refs(self, where: list[int | None]) -> list[ImageRef]:
        refs: list[ImageRef] = []
        for index, message in enumerate(self.messages):
            at = where[index]
            if message.has_images and message.content is not None and at is not None:
                refs += images_of(message.content, at, f"messages.{index}.content")
        return refs

    @property
    def calls_tools(self) -> bool:
        """Whether the reply may be a tool call (read by tool_protocol.ReplySplitter)."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def grammar(self) -> guidance.Grammar | None:
        """What the reply is held to (structured/guidance.py, built while validating); None:
        free text."""
        return self._grammar

    @property
    def guidance(self) -> ipc.Guidance | None:
        """The grammar the reply is held to, as the worker gets it; None: free text."""
        return None if self._grammar is None else self._grammar.guidance

    @property
    def cache_scope(self) -> str | None:
        return scope_of(self.prompt_cache_key, self.user)
