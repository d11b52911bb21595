"""The POST /v1/responses request body (the wire format is described in responses/api.py).

Validated as strictly as Chat Completions' (no coercion; unknown fields refused, naming them;
fields without an implementation accepted only where they change nothing). What the request
asks of the model is then said as a Chat Completions request (`as_chat`), which the rest of
the pipeline already knows: the conversation rules, the tool protocol and its grammar, the
structured-output checks (structured/settle.py) are the same code, not a copy. An error that only
that request finds names its field as the Responses API spells it (`param_of`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from sidecar.web.chat_completions.schemas import (
    LABELS,
    ChatCompletionRequest,
    ModelName,
    TopLogprobs,
    unimplemented,
)
from sidecar.web.chat_completions.tools import (
    Description,
    JsonObjectFormat,
    Name,
    Schema,
    TextFormat,
)
from sidecar.web.errors import ApiError
from sidecar.web.generation.messages import (
    MAX_MESSAGES,
    MAX_TEXT_CHARS,
    AudioPart,
    CacheScope,
    NewTokens,
    Seed,
    StopSequences,
    Temperature,
    Text,
    TopK,
    TopP,
)
from sidecar.web.generation.pipeline import _first_error as first_error
from sidecar.web.images.decoding import ImageRef

LOGPROBS_INCLUDE = "message.output_text.logprobs"
# OpenAI fields without an implementation here: accepted only at the value (or null).
NO_EFFECT: dict[str, tuple[object, str]] = {
    "background": (False, "background responses are not supported"),
    "truncation": ("auto", "only 'auto': older turns are dropped to fit the context"),
    "reasoning": (None, "reasoning options are not supported"),
    "max_tool_calls": (None, "only function tools are supported: nothing to bound"),
    "conversation": (None, "conversations are not supported; use previous_response_id"),
    "prompt": (None, "prompt templates are not supported"),
    "service_tier": ("auto", "only 'auto'"),
}
CallId = Annotated[str, Field(min_length=1, max_length=256)]
ItemId = Annotated[str, Field(min_length=1, max_length=256)]
Status = Literal["in_progress", "completed", "incomplete"]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class InputText(_Strict):
    type: Literal["input_text"]
    text: Text


class OutputText(_Strict):
    """An earlier reply's text, sent back as it came (its annotations and log probabilities
    are read and not used)."""

    type: Literal["output_text"]
    text: Text
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class Refusal(_Strict):
    type: Literal["refusal"]
    refusal: Text


class InputImage(_Strict):
    """An image, as a data: URL (checked as Chat Completions' image_url parts: images/decoding.py).
    By `file_id`: refused, no files are stored here."""

    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["auto", "low", "high"] | None = None  # OpenAI's; the processor decides

    @model_validator(mode="after")
    def _by_url(self) -> Self:
        if self.file_id is not None:
            raise ValueError(
                "file_id: no files are stored here; send the image as image_url, a data: URL"
            )
        if self.image_url is None:
            raise ValueError("image_url: required (a data: URL)")
        return self


def _part_kind(value: object) -> object:
    """Text, image and audio parts (file parts need files, which are not stored here)."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("input_text", "output_text", "refusal", "input_image", "input_audio"):
        raise ValueError(
            "only text, image and audio parts (input_text, output_text, input_image, "
            "input_audio) are supported"
        )
    return value


# input_audio is Chat Completions' part, spelled the same ({"type": "input_audio",
# "input_audio": {"data", "format"}}): one home for it (messages.AudioPart), transcribed as
# chat's are (web/audio/parts.py) once the request is said as Chat Completions'.
Part = Annotated[
    Annotated[
        InputText | OutputText | Refusal | InputImage | AudioPart, Field(discriminator="type")
    ],
    BeforeValidator(_part_kind),
]


def _or_text(schema: dict[str, Any]) -> None:
    """The field's JSON Schema (openapi.py): a string is accepted too (the validator makes it
    a list, so that the type is one list and an error names the item)."""
    listed = dict(schema)
    schema.clear()
    schema["anyOf"] = [{"type": "string", "maxLength": MAX_TEXT_CHARS}, listed]


def _parts(kind: str) -> Any:
    """Content given as a string: one text part of `kind`."""

    def listed(value: object) -> object:
        return [{"type": kind, "text": value}] if isinstance(value, str) else value

    return BeforeValidator(listed)


class Message(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Annotated[
        list[Part],
        Field(min_length=1, max_length=MAX_MESSAGES, json_schema_extra=_or_text),
        _parts("input_text"),
    ]
    id: ItemId | None = None
    status: Status | None = None
    phase: Literal["commentary", "final_answer"] | None = None

    def text(self) -> str:
        return "\n".join(_text(p) for p in self.content if not isinstance(p, _NOT_TEXT))

    def chat_content(self) -> str | list[dict[str, Any]]:
        """The content as Chat Completions takes it: the text, or with images or audio its
        parts."""
        if not any(isinstance(p, _NOT_TEXT) for p in self.content):
            return self.text()
        return [_chat_part(p) for p in self.content]


_NOT_TEXT = (InputImage, AudioPart)


def _chat_part(part: InputText | OutputText | Refusal | InputImage | AudioPart) -> dict[str, Any]:
    if isinstance(part, InputImage):
        return {"type": "image_url", "image_url": _image_url(part)}
    if isinstance(part, AudioPart):
        return part.model_dump()
    return {"type": "text", "text": _text(part)}


def _text(part: InputText | OutputText | Refusal) -> str:
    return part.refusal if isinstance(part, Refusal) else part.text


def _image_url(part: InputImage) -> dict[str, Any]:
    url: dict[str, Any] = {"url": part.image_url}
    return url if part.detail is None else url | {"detail": part.detail}


class FunctionCall(_Strict):
    """A call an earlier reply made (its output item, sent back)."""

    type: Literal["function_call"]
    call_id: CallId
    name: Name
    arguments: Annotated[str, Field(max_length=1_000_000)]
    id: ItemId | None = None
    status: Status | None = None


class FunctionCallOutput(_Strict):
    """A call's result."""

    type: Literal["function_call_output"]
    call_id: CallId
    output: Annotated[
        list[InputText],
        Field(min_length=1, max_length=MAX_MESSAGES, json_schema_extra=_or_text),
        _parts("input_text"),
    ]
    id: ItemId | None = None
    status: Status | None = None

    def text(self) -> str:
        return "\n".join(part.text for part in self.output)


def _item_kind(value: object) -> object:
    """An item without a type is a message (OpenAI's "easy" input message)."""
    if isinstance(value, dict) and "type" not in value:
        return {"type": "message", **value}
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("message", "function_call", "function_call_output"):
        raise ValueError("only message, function_call and function_call_output items are supported")
    return value


Item = Annotated[
    Annotated[Message | FunctionCall | FunctionCallOutput, Field(discriminator="type")],
    BeforeValidator(_item_kind),
]


def _one_message(value: object) -> object:
    return [{"role": "user", "content": value}] if isinstance(value, str) else value


class FunctionTool(_Strict):
    type: Literal["function"]
    name: Name
    description: Description | None = None
    parameters: Schema | None = None  # checked as Chat Completions' (chat_completions/tools.py)
    strict: bool | None = None


def _tool_kind(value: object) -> object:
    if isinstance(value, dict) and value.get("type") != "function":
        raise ValueError("only function tools are supported")
    return value


class NamedFunction(_Strict):
    type: Literal["function"]
    name: Name


class JsonSchemaText(_Strict):
    """Responses' spelling of a JSON Schema format: its fields beside `type`."""

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=False)

    type: Literal["json_schema"]
    name: Name
    description: Description | None = None
    json_schema: Schema | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextOptions(_Strict):
    format: (
        Annotated[TextFormat | JsonObjectFormat | JsonSchemaText, Field(discriminator="type")]
        | None
    ) = None


class ResponsesStreamOptions(_Strict):
    include_obfuscation: bool = False  # no padding is sent


class ResponsesRequest(_Strict):
    model: ModelName | None = None
    # a string is one user message
    input: Annotated[
        list[Item],
        Field(min_length=1, max_length=MAX_MESSAGES, json_schema_extra=_or_text),
        BeforeValidator(_one_message),
    ]
    instructions: Text | None = None
    max_output_tokens: NewTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None  # not OpenAI's; as /v1/chat/completions
    seed: Seed | None = None  # not OpenAI's; as /v1/chat/completions
    stop: StopSequences | None = None  # not OpenAI's; as /v1/chat/completions
    stream: bool = False
    stream_options: ResponsesStreamOptions | None = None
    store: bool = True
    previous_response_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    text: TextOptions | None = None
    tools: (
        Annotated[list[Annotated[FunctionTool, BeforeValidator(_tool_kind)]], Field(max_length=128)]
        | None
    ) = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    include: (
        Annotated[list[Literal["message.output_text.logprobs"]], Field(max_length=8)] | None
    ) = None
    top_logprobs: TopLogprobs | None = None
    prompt_cache_key: CacheScope | None = None
    user: CacheScope | None = None
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = None

    @model_validator(mode="before")
    @classmethod
    def _unimplemented(cls, data: Any) -> Any:
        # store and metadata are fields here (the response is stored, its metadata echoed)
        return unimplemented(data, NO_EFFECT, LABELS)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed when stream is true")
        if self.metadata is not None and len(self.metadata) > 16:
            raise ValueError("metadata: at most 16 keys")
        if any(len(key) > 64 for key in self.metadata or ()):
            raise ValueError("metadata: keys of at most 64 characters")
        return self

    def image_refs(self) -> list[ImageRef]:
        """The input's images (their URLs bound the body: pipeline.read_body); where each
        stands is the Chat Completions request's to say (`as_chat`)."""
        return [
            ImageRef(part.image_url, f"input.{i}.content.{j}.image_url")
            for i, item in enumerate(self.input)
            if isinstance(item, Message)
            for j, part in enumerate(item.content)
            if isinstance(part, InputImage) and part.image_url is not None
        ]

    def audio_chars(self) -> int:
        """The characters of the input_audio parts' base64 (read_body's allowance for them)."""
        return sum(
            len(part.input_audio.data)
            for item in self.input
            if isinstance(item, Message)
            for part in item.content
            if isinstance(part, AudioPart)
        )

    @property
    def logprobs_count(self) -> int | None:
        """ipc.Generate.logprobs: asked for by `include` (or a `top_logprobs` above 0)."""
        if LOGPROBS_INCLUDE in (self.include or ()) or self.top_logprobs:
            return self.top_logprobs or 0
        return None

    def conversation(self) -> list[dict[str, Any]]:
        """The input as Chat Completions messages (without `instructions`): what a later
        request continues from."""
        out: list[dict[str, Any]] = []
        for item in self.input:
            last = out[-1] if out else None
            if isinstance(item, Message):
                out.append({"role": item.role, "content": item.chat_content()})
            elif isinstance(item, FunctionCallOutput):
                out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
            else:  # calls join the assistant turn they follow, or make one
                call = {
                    "id": item.call_id,
                    "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments},
                }
                if last is not None and last["role"] == "assistant":
                    last.setdefault("tool_calls", []).append(call)
                else:
                    out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        return out

    def as_chat(self, earlier: list[dict[str, Any]]) -> tuple[ChatCompletionRequest, list[Any]]:
        """This request as Chat Completions', continuing the `earlier` conversation (a stored
        response's), and the conversation it holds (without instructions); ApiError 400, with
        the field as Responses names it (param_of), for what only that request checks."""
        conversation = [*earlier, *self.conversation()]
        # The instructions and any system messages the conversation opens with: one system
        # turn (templates know one); a system message later on is refused as Chat's is.
        system = [self.instructions] if self.instructions else []
        rest = list(conversation)
        while rest and rest[0]["role"] in ("system", "developer") and _plain(rest[0]):
            system.append(rest.pop(0)["content"])
        messages = [{"role": "system", "content": "\n\n".join(system)}] if system else []
        chat: dict[str, Any] = {"messages": messages + rest, "stream": False}
        fields = {
            "model": self.model,
            "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "stop": self.stop,
            "prompt_cache_key": self.prompt_cache_key,
            "user": self.user,
            "parallel_tool_calls": self.parallel_tool_calls,
            "response_format": self._response_format(),
            "tools": [self._tool(t) for t in self.tools] if self.tools else None,
            "tool_choice": self._tool_choice(),
        }
        chat |= {name: value for name, value in fields.items() if value is not None}
        count = self.logprobs_count
        if count is not None:
            chat |= {"logprobs": True, "top_logprobs": count}
        try:
            return ChatCompletionRequest.model_validate(chat), conversation
        except ValidationError as exc:
            param, message = first_error(exc)
            raise refusal_of(ApiError("invalid_field", message, param=param)) from None

    def _response_format(self) -> dict[str, Any] | None:
        given = self.text.format if self.text is not None else None
        if not isinstance(given, JsonSchemaText):
            return None if given is None else given.model_dump()
        spec = given.model_dump(by_alias=True, exclude_none=True, exclude={"type"})
        return {"type": "json_schema", "json_schema": spec}

    @staticmethod
    def _tool(tool: FunctionTool) -> dict[str, Any]:
        function = tool.model_dump(exclude_none=True, exclude={"type"})
        return {"type": "function", "function": function}

    def _tool_choice(self) -> Any:
        choice = self.tool_choice
        if isinstance(choice, NamedFunction):
            return {"type": "function", "function": {"name": choice.name}}
        return choice


def _plain(message: dict[str, Any]) -> bool:
    """A message whose content is text (one with images is left for Chat's rules to refuse)."""
    return isinstance(message.get("content"), str)


# How a Chat Completions field is spelled in a Responses request (longest first). A message's
# index is not the input item's (instructions, earlier turns): the whole input is named.
_PREFIXES = (
    ("response_format.json_schema.schema", "text.format.schema"),
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("max_completion_tokens", "max_output_tokens"),
    ("tool_choice.function", "tool_choice"),
    ("logprobs", "include"),
)
_TOOL = re.compile(r"^tools\.(\d+)\.function(?=\.|$)")


def param_of(chat_param: str) -> str:
    """A Chat Completions field path as the Responses API names it."""
    if chat_param == "messages" or chat_param.startswith("messages."):
        return "input"
    if _TOOL.match(chat_param):
        return _TOOL.sub(r"tools.\1", chat_param)
    for chat, ours in _PREFIXES:
        if chat_param == chat or chat_param.startswith(chat + "."):
            return ours + chat_param[len(chat) :]
    return chat_param


def refusal_of(error: ApiError) -> ApiError:
    """A Chat Completions refusal (a field, a schema) as the Responses API names its field;
    one that names none is about the conversation: `input`."""
    return _renamed(error, param_of(error.param) if error.param is not None else "input")


# The tag pydantic puts in an error's path after a list index or a format (which kind of item,
# part or format failed): not a field a client can find in its request.
_TAGS = frozenset(
    {"message", "function_call", "function_call_output", "input_text", "output_text"}
    | {"refusal", "input_image", "input_audio", "text", "json_object", "json_schema"}
)


def untagged(error: ApiError) -> ApiError:
    """A refusal of the body whose field path holds no pydantic tags."""
    if error.param is None:
        return error
    parts = error.param.split(".")
    kept = [
        part
        for i, part in enumerate(parts)
        if not (part in _TAGS and i and (parts[i - 1].isdigit() or parts[i - 1] == "format"))
    ]
    return _renamed(error, ".".join(kept))


def _renamed(error: ApiError, param: str) -> ApiError:
    message = error.message
    if error.param is not None and message.startswith(error.param + ":"):
        message = param + message[len(error.param) :]
    elif error.param is None:
        message = f"{param}: {message}"
    return ApiError(error.reason, message, param=param, headers=error.headers, extra=error.extra)
