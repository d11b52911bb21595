"""What both APIs' request bodies share: the message rules and the generation options.

Validated strictly (no type coercion, no unknown fields), for /predict (predict_api.py) and
/v1/chat/completions (openai_schemas.py) alike. The chat app checks the same rules for system
and user turns before it calls the sidecar, and makes such characters visible in assistant
turns instead, so what it sends is always accepted here (main-app/chatapp/wire.py; contract
tests keep the rules equal).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Self

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from sidecar.ipc import MIN_TEMPERATURE, Role

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

# The generation options, shared with /v1/chat/completions (openai_schemas.py).
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
