"""Tool calls and structured output on the real model: what random weights cannot show is
that the arguments mean something. Asked about the weather in Paris with a weather tool, the
model calls it for Paris; asked for a city as JSON, it names the right one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI

from scripts.run import services

pytestmark = pytest.mark.realmodel

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture
def client(smollm2_sidecar: services.Service) -> Iterator[OpenAI]:
    with OpenAI(base_url=smollm2_sidecar.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_weather_in_paris_is_a_call_for_paris(client: OpenAI, stream: bool) -> None:
    messages: Any = [{"role": "user", "content": "What is the weather like in Paris?"}]
    options: Any = {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False}
    if stream:
        with client.chat.completions.stream(
            model="any", messages=messages, max_tokens=60, **options
        ) as events:
            completion: Any = events.get_final_completion()
    else:
        completion = client.chat.completions.create(
            model="any", messages=messages, max_tokens=60, **options
        )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] == "Paris"


def test_the_capital_of_france_as_json(client: OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"capital": {"type": "string", "maxLength": 40}},
        "required": ["capital"],
        "additionalProperties": False,
    }
    completion = client.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
        max_tokens=40,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert json.loads(choice.message.content or "")["capital"] == "Paris"
