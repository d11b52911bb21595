"""What both APIs' request bodies share: the message rules, content parts (text and images)
and the generation options.

Validated strictly (no type coercion, no unknown fields), for /predict (predict/api.py) and
/v1/chat/completions (chat_completions/schemas.py) alike. The chat app checks the same rules for
system and user turns before it calls the sidecar, and makes such characters visible in assistant
turns instead, so what it sends is always accepted here (main-app/chatapp/relay/wire.py; contract
tests keep the rules equal).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    model_validator,
)

from sidecar.ipc import MIN_TEMPERATURE, Role
from sidecar.web.images.decoding import ImageRef

# C0 controls except tab, newline and carriage return; DEL and C1 controls; lone surrogates
# (possible through JSON \ud800 escapes, and not encodable as UTF-8).
FORBIDDEN_CHARS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")

MAX_TEXT_CHARS = 1_000_000  # the body limit is the real bound; this only caps a single field


def _clean_text(value: str) -> str:
    if FORBIDDEN_CHARS.search(value):
        raise ValueError("text contains control characters or invalid code points")
    return value


def not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("text is empty")
    return value


Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS), AfterValidator(_clean_text)]
NonBlankText = Annotated[Text, AfterValidator(not_blank)]

# The generation options, shared with /v1/chat/completions (chat_completions/schemas.py).
NewTokens = Annotated[int, Field(ge=1, le=131072)]
# Below ipc.MIN_TEMPERATURE (1e-5) a temperature is greedy, as 0 is: accepted, not refused.
Temperature = Annotated[
    float, Field(ge=0.0, le=2.0, description=f"0, absent or below {MIN_TEMPERATURE:g}: greedy")
]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
TopK = Annotated[int, Field(ge=1, le=1_000_000)]
Seed = Annotated[int, Field(ge=0, le=2**31 - 1)]
MAX_MESSAGES = 1000
MAX_STOP = 4  # stop sequences, as OpenAI


def _stop_list(value: object) -> object:
    """A stop sequence may be given as one string (OpenAI's shorthand)."""
    return [value] if isinstance(value, str) else value


def _stop_or_list(schema: dict[str, Any]) -> None:
    """The JSON Schema (openapi.py) says what is accepted: one string, or a list."""
    listed = dict(schema)
    schema.clear()
    schema["anyOf"] = [listed["items"], listed]


# Strings that end the reply where they would begin; the reply never shows any of them.
StopSequences = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=256)]],
    BeforeValidator(_stop_list),
    Field(max_length=MAX_STOP, json_schema_extra=_stop_or_list),
]
# Who may reuse a conversation's cached tokens: an opaque label, compared exactly.
CacheScope = Annotated[str, Field(min_length=1, max_length=256)]
# A grounded request's passages (issue 54; model/kv/passages.py): texts that stand verbatim in
# its messages, whose K/V the passage store keeps and reuses wherever they stand
MAX_PASSAGES = 32
MAX_PASSAGE_CHARS = 32_768
Passages = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=MAX_PASSAGE_CHARS)]],
    Field(max_length=MAX_PASSAGES),
]


def check_passages(passages: list[str] | None, texts: list[str]) -> None:
    """Each passage must stand, verbatim, in one of the messages' texts."""
    for index, passage in enumerate(passages or ()):
        if not any(passage in text for text in texts):
            raise ValueError(f"passages[{index}] does not stand verbatim in any message")


def check_roles(roles: list[Role]) -> None:
    """The conversation rules: system only first, the last turn from the user."""
    if roles[-1] != "user":
        raise ValueError("the last message must have role 'user'")
    if "system" in roles[1:]:
        raise ValueError("only the first message may have role 'system'")


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    role: Role
    content: Text

    @model_validator(mode="after")
    def _content_needed(self) -> Self:
        if self.role != "assistant":
            not_blank(self.content)
        return self


# Content parts (OpenAI's): a message's content is a string, or a list of text and image_url
# parts. Its text is the text parts', one per line; each image stands where the next text
# part begins (or at the end), and the model worker puts the model's own image tag there
# (ipc.Generate.image_slots). Text is never read as a tag, whatever it says.
MAX_PARTS = 256


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: Text


class ImageUrl(_Strict):
    # a data: URL (web/images/decoding.py checks it: the sidecar fetches nothing); bounded by the
    # body
    url: str
    detail: Literal["auto", "low", "high"] | None = None  # OpenAI's; the processor decides


class ImagePart(_Strict):
    type: Literal["image_url"]
    image_url: ImageUrl


class InputAudio(_Strict):
    data: Annotated[str, Field(min_length=1)]  # base64; bounded by the body (SPEECH_MAX_BYTES)
    format: Annotated[str, Field(max_length=16)]  # OpenAI's wav | mp3; the bytes tell the rest


class AudioPart(_Strict):
    """OpenAI's input_audio part (/v1/chat/completions only): for a model that reads no audio,
    transcribed before admission (web/audio/parts.py) and read by the model as the user's
    text, where the part stands."""

    type: Literal["input_audio"]
    input_audio: InputAudio
    _transcript: str = PrivateAttr(default="")

    @property
    def text(self) -> str:
        return self._transcript


# The tags pydantic puts in an error's path after a part's index (`content.0.text.text`):
# left out of the field a refusal names (pipeline._first_error).
PART_TAGS = frozenset({"text", "image_url", "input_audio"})


def _part_kind(value: object) -> object:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "input_audio":
        raise ValueError(
            "input_audio parts are not supported: no model served here reads audio "
            "(send text and image_url parts)"
        )
    if kind not in ("text", "image_url"):
        raise ValueError("only content parts of type 'text' and 'image_url' are supported")
    return value


def _part_or_audio(value: object) -> object:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("text", "image_url", "input_audio"):
        raise ValueError(
            "only content parts of type 'text', 'image_url' and 'input_audio' are supported"
        )
    return value


def _or_text(schema: dict[str, Any]) -> None:
    """The field's JSON Schema (openapi.py): a string, or the list of parts."""
    listed = dict(schema)
    schema.clear()
    schema["anyOf"] = [{"type": "string", "maxLength": MAX_TEXT_CHARS}, listed]


def _as_parts(value: object) -> object:
    return [{"type": "text", "text": value}] if isinstance(value, str) else value


Part = Annotated[
    Annotated[TextPart | ImagePart, Field(discriminator="type")], BeforeValidator(_part_kind)
]
# A message's content: a string (one text part) or a list of parts.
Parts = Annotated[
    list[Part], Field(max_length=MAX_PARTS, json_schema_extra=_or_text), BeforeValidator(_as_parts)
]


# /v1/chat/completions' parts: also input_audio.
ChatPart = Annotated[
    Annotated[TextPart | ImagePart | AudioPart, Field(discriminator="type")],
    BeforeValidator(_part_or_audio),
]
ChatParts = Annotated[
    list[ChatPart],
    Field(max_length=MAX_PARTS, json_schema_extra=_or_text),
    BeforeValidator(_as_parts),
]


def text_of(parts: list[TextPart | ImagePart] | list[TextPart | ImagePart | AudioPart]) -> str:
    """The text of a message's parts, one text (or transcribed audio) part per line."""
    return "\n".join(p.text for p in parts if isinstance(p, TextPart | AudioPart))


def images_of(
    parts: list[TextPart | ImagePart] | list[TextPart | ImagePart | AudioPart],
    message: int,
    field: str,
) -> list[ImageRef]:
    """Where each image part of message `message` stands in its text (`text_of`): the offset
    at which the next text part begins, or the end; `field` names the content for errors."""
    refs: list[ImageRef] = []
    offset = 0  # where the next text part begins
    texts = 0
    for index, part in enumerate(parts):
        if isinstance(part, TextPart | AudioPart):
            offset += (1 if texts else 0) + len(part.text)
            texts += 1
            continue
        after = any(isinstance(p, TextPart | AudioPart) for p in parts[index + 1 :])
        at = offset + (1 if texts and after else 0)
        refs.append(ImageRef(part.image_url.url, f"{field}.{index}.image_url.url", message, at))
    return refs


def check_image_roles(
    role: str, parts: list[TextPart | ImagePart] | list[TextPart | ImagePart | AudioPart] | None
) -> None:
    """Images and audio come in user messages only (as in OpenAI's API): a system prompt or an
    earlier reply with an image means nothing a template can say."""
    if role != "user" and any(isinstance(p, ImagePart) for p in parts or ()):
        raise ValueError("content: only a user message may hold image_url parts")
    if role != "user" and any(isinstance(p, AudioPart) for p in parts or ()):
        raise ValueError("content: only a user message may hold input_audio parts")
