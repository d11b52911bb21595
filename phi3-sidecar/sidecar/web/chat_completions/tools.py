"""The structured-output fields of a /v1/chat/completions body (chat_completions/api.py describes
them): `response_format`, `tools`, `tool_choice` and the tool calls of assistant messages. Validated
as strictly as the rest of the body (chat_completions/schemas.py): no coercion, no unknown fields.
What the model is then held to is built by structured/guidance.py; how tools and calls are written
into the prompt and read back from the reply, by chat_completions/tool_protocol.py.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

# OpenAI's rule for function and schema names.
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
Description = Annotated[str, Field(max_length=4096)]
MAX_TOOLS = 128  # OpenAI's limit


def _schema(value: dict[str, Any]) -> dict[str, Any]:
    """A JSON Schema as a client may send it: valid Unicode throughout (a lone surrogate, which
    JSON's \\u escapes can write, reaches neither the tokenizer nor the grammar engine), and
    without llguidance's own `x-guidance` options (structured/guidance.py sets them: a client's
    could switch off keywords, `lenient`, or make the reply not JSON, its separators)."""
    if "x-guidance" in value:
        raise ValueError("x-guidance is not accepted: the sidecar sets the grammar's options")
    stack: list[object] = [value]
    while stack:  # not recursive: a deeply nested schema is refused later, with its own message
        item = stack.pop()
        strings = [item] if isinstance(item, str) else []
        if isinstance(item, dict):
            strings = [key for key in item if isinstance(key, str)]
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        for text in strings:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("strings in a schema must be valid Unicode") from None
    return value


def _object_schema(value: dict[str, Any]) -> dict[str, Any]:
    """A function's arguments are a JSON object (as OpenAI requires): a schema of another type
    would let the model write arguments that are no call at all."""
    if value.get("type", "object") != "object":
        raise ValueError('a function\'s parameters must be a JSON Schema of "type": "object"')
    return value


Schema = Annotated[dict[str, Any], AfterValidator(_schema)]


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
    json_schema: Schema | None = Field(default=None, alias="schema")
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
    # A JSON Schema of the arguments object (no `type`: "object" is implied); absent: the
    # function takes no arguments.
    parameters: Annotated[Schema, AfterValidator(_object_schema)] | None = None
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
