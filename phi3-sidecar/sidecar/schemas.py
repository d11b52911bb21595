"""The /predict request body, validated strictly (no type coercion, no unknown fields).

The original sample's body, {"input_text": "..."}, is still valid as it was. The message rules
and the option types are shared with /v1/chat/completions (openai_schemas.py).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from sidecar.ipc import Role

# C0 controls except tab, newline and carriage return; DEL and C1 controls; lone surrogates
# (possible through JSON \ud800 escapes, and not encodable as UTF-8).
_FORBIDDEN = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")

MAX_TEXT_CHARS = 1_000_000  # the body limit is the real bound; this only caps a single field


def _clean_text(value: str) -> str:
    if _FORBIDDEN.search(value):
        raise ValueError("text contains control characters or invalid code points")
    return value


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("text is empty")
    return value


Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS), AfterValidator(_clean_text)]
NonBlankText = Annotated[Text, AfterValidator(_not_blank)]

# The generation options, shared with /v1/chat/completions (openai_schemas.py).
NewTokens = Annotated[int, Field(ge=1, le=131072)]
Temperature = Annotated[float, Field(ge=0.0, le=2.0, description="0 or absent: greedy")]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
TopK = Annotated[int, Field(ge=1, le=1_000_000)]
Seed = Annotated[int, Field(ge=0, le=2**31 - 1)]
MAX_MESSAGES = 1000


def check_roles(roles: list[Role]) -> None:
    """The conversation rules: system only first, the last turn from the user."""
    if roles[-1] != "user":
        raise ValueError("the last message must have role 'user'")
    if "system" in roles[1:]:
        raise ValueError("only the first message may have role 'system'")


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: Text

    @model_validator(mode="after")
    def _content_needed(self) -> Self:
        if self.role != "assistant":
            _not_blank(self.content)
        return self


class PredictRequest(BaseModel):
    """Either input_text (one user turn) or messages (a conversation ending with a user turn)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    input_text: NonBlankText | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=MAX_MESSAGES)
    system: NonBlankText | None = None
    max_new_tokens: NewTokens | None = None
    min_new_tokens: int | None = Field(None, ge=0, le=131072, description="EOS is held back")
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    seed: Seed | None = None

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
        if self.messages is not None:
            roles = [m.role for m in self.messages]
            check_roles(roles)
            if self.system is not None and roles[0] == "system":
                raise ValueError("give the system message either in system or in messages")
        return self

    def conversation(self) -> tuple[tuple[Role, str], ...]:
        turns: list[tuple[Role, str]] = [("system", self.system)] if self.system else []
        if self.messages is not None:
            turns += [(m.role, m.content) for m in self.messages]
        else:
            assert self.input_text is not None
            turns.append(("user", self.input_text))
        return tuple(turns)
