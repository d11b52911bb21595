"""Structured output and the tool protocol on every family (docs/api.md, "Tool calls"): each
family's tokenizer must build the grammar (llguidance reads its tokenizer.json), and each
template must render a call and its result as ordinary turns (Gemma's and Mistral's insist that
user and assistant alternate). Random weights: whatever the model writes is held to the grammar.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema_rs
import pytest
from openai import OpenAI

from scripts.run.services import Service

pytestmark = pytest.mark.families

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}
]
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no"]},
        "confidence": {"type": "integer", "minimum": 0, "maximum": 10},
    },
    "required": ["answer", "confidence"],
    "additionalProperties": False,
}


@pytest.fixture
def client(family_sidecar: Service) -> Iterator[OpenAI]:
    with OpenAI(base_url=family_sidecar.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def test_a_json_schema_reply_validates(client: OpenAI) -> None:
    completion = client.chat.completions.create(
        model="any",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Ok?"}],
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
        max_tokens=200,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema_rs.validate(SCHEMA, json.loads(choice.message.content or ""))


def test_a_tool_round_trip(client: OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.chat.completions.create(
        model="any",
        messages=messages,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=300,
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    assert len(choice.message.tool_calls) == 1
    call: Any = choice.message.tool_calls[0]  # a function call (this API has no custom tools)
    jsonschema_rs.validate(PARAMETERS, json.loads(call.function.arguments))
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "18 degrees"})
    second = client.chat.completions.create(
        model="any", messages=messages, tools=TOOLS, tool_choice="none", max_tokens=8
    )
    answer = second.choices[0]
    assert answer.finish_reason in ("stop", "length") and not answer.message.tool_calls
