"""The structured-output fields of a /v1/chat/completions body (openai_api.py describes them):
`response_format`, `tools`, `tool_choice` and the tool calls of assistant messages. Validated as
strictly as the rest of the body (openai_schemas.py): no coercion, no unknown fields. What the
model is then held to is built by guidance.py; how tools and calls are written into the
prompt and read back from the reply, by tool_protocol.py.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# OpenAI's rule for function and schema names.
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
Description = Annotated[str, Field(max_length=4096)]
MAX_TOOLS = 128  # OpenAI's limit


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class TextFormat(_Strict):
    type: Literal["text"]


class JsonObjectFormat(_Strict):
    type: Literal["json_object"]


class JsonSchemaSpec(_Strict):
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=False)

    name: Name
    description: Description | None = None
    # Absent: any JSON object (as json_object). The reply is held to it whatever `strict` says.
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class JsonSchemaFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")
]


class FunctionSpec(_Strict):
    name: Name
    description: Description | None = None
    # A JSON Schema of the arguments object; absent: the function takes no arguments.
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolSpec(_Strict):
    type: Literal["function"]
    function: FunctionSpec


class FunctionName(_Strict):
    name: Name


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(_Strict):
    name: Name
    arguments: Annotated[str, Field(max_length=1_000_000)]  # JSON text, as the model wrote it


class ToolCall(_Strict):
    """A call in an earlier assistant message, sent back with the tool's result."""

    id: Annotated[str, Field(min_length=1, max_length=256)]
    type: Literal["function"]
    function: CalledFunction
