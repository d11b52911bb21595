"""What a structured /v1/chat/completions request is held to, settled in the web process before
admission, so that a schema no reply can be held to is a 400 invalid_schema naming its field
(streamed or not: nothing has started) instead of a failure in the middle of the reply: the
schema rules (structured/schema_rules.py), its validator (a valid JSON Schema), and the grammar
compiled by llguidance (schema_rules.probe). The result is the check of the finished reply
(structured/reply_check.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from sidecar.web.chat_completions.schemas import ChatCompletionRequest
from sidecar.web.chat_completions.tools import JsonSchemaFormat
from sidecar.web.errors import ApiError
from sidecar.web.observability.record import RequestRecord
from sidecar.web.structured.reply_check import ReplyCheck, validator
from sidecar.web.structured.schema_rules import SchemaRefused, check, probe

SCHEMA_FIELD = "response_format.json_schema.schema"
T = TypeVar("T")
A = TypeVar("A")


async def settle(body: ChatCompletionRequest, record: RequestRecord) -> ReplyCheck | None:
    """`admit`, off the event loop; the log line says what the reply is held to."""
    if body.grammar is None:
        return None
    held_to = body.response_format.type if body.response_format is not None else None
    record.structured = "tools" if body.tools else held_to
    return await asyncio.to_thread(admit, body)


def admit(body: ChatCompletionRequest) -> ReplyCheck | None:
    """The check of the reply of a request held to a grammar (None: free text); ApiError
    invalid_guidance for a schema no reply can be held to. Compiles the grammar (milliseconds;
    a large schema tens of them): call it off the event loop."""
    grammar = body.grammar
    if grammar is None:
        return None
    fields = {}
    response_format = body.response_format
    if isinstance(response_format, JsonSchemaFormat) and response_format.json_schema.json_schema:
        fields[SCHEMA_FIELD] = response_format.json_schema.json_schema
    tool_field = {}
    for index, tool in enumerate(body.tools or ()):
        tool_field[tool.function.name] = f"tools.{index}.function.parameters"
        if tool.function.parameters is not None:
            fields[tool_field[tool.function.name]] = tool.function.parameters
    for field, schema in fields.items():
        _refused_as(field, check, schema)
    answer = None
    if grammar.answer is not None:
        answer = _refused_as(SCHEMA_FIELD, validator, grammar.answer)
    arguments = {
        name: _refused_as(tool_field[name], validator, schema)
        for name, schema in grammar.arguments.items()
    }
    _refused_as("tools" if body.tools else "response_format", probe, grammar.guidance)
    return ReplyCheck(answer, arguments, grammar.max_calls)


def _refused_as(field: str, step: Callable[[A], T], argument: A) -> T:
    try:
        return step(argument)
    except SchemaRefused as refused:
        raise ApiError("invalid_guidance", f"{field}: {refused}", param=field) from None
