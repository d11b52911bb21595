"""Structured output and tool calls on /v1/chat/completions, as a client sees them: the pinned
`openai` SDK against the real sidecar on the tiny model (random weights: whatever it writes is
held to the grammar, so every reply that is not cut off by the length limit must be valid).

Replies are validated with jsonschema_rs against the schema as the client sent it; patterns
are also checked as the client means them (the whole string), which the sidecar's anchoring
gives.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import jsonschema_rs
import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel, Field

from scripts.run import services
from scripts.run.services import Service
from tests.sidecar.support import request_line

CODE = "[A-Z]{2}[0-9]{3}"  # unanchored, as users write it; they mean the whole string
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "pattern": CODE},
        "count": {"type": "integer", "minimum": -3, "maximum": 40},
        "colour": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        "where": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "floor": {"type": "integer", "minimum": 0, "maximum": 9},
            },
            "required": ["city", "floor"],
            "additionalProperties": False,
        },
        "note": {"type": "string", "maxLength": 12},
    },
    "required": ["code", "count", "colour", "tags", "where"],
    "additionalProperties": False,
}
RESPONSE_FORMAT: Any = {
    "type": "json_schema",
    "json_schema": {"name": "record", "schema": SCHEMA, "strict": True},
}
WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather forecast for a city.",
            "parameters": WEATHER_PARAMETERS,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The local time in a time zone.",
            "parameters": {
                "type": "object",
                "properties": {
                    "zone": {"type": "string", "pattern": "^[A-Z][a-z]{2,9}/[A-Z][a-z]{2,9}$"}
                },
                "required": ["zone"],
            },
        },
    },
    {"type": "function", "function": {"name": "ping"}},  # no parameters: arguments {}
]
PARAMETERS = {
    "get_weather": WEATHER_PARAMETERS,
    "get_time": TOOLS[1]["function"]["parameters"],
    "ping": {"type": "object", "maxProperties": 0},
}
QUESTIONS = [
    "What is the weather in Paris this week?",
    "Give me a record for the blue box in the attic.",
    "Should I take an umbrella to London tomorrow?",
    "Describe the green room on the third floor.",
    "What time is it in Tokyo right now?",
    "List three tags for a red bicycle.",
]
MARKERS = ("<tool_call>", "{", "[")
ONE_CALL: dict[str, Any] = {"tool_choice": "required", "parallel_tool_calls": False}


@pytest.fixture
def client(sidecar_service: Service) -> Iterator[OpenAI]:
    with OpenAI(base_url=sidecar_service.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def ask(client: OpenAI, question: str, **extra: Any) -> Any:
    return client.chat.completions.create(
        model="any",
        messages=extra.pop("messages", [{"role": "user", "content": question}]),
        max_tokens=extra.pop("max_tokens", 300),
        **extra,
    )


def assert_record(text: str) -> None:
    record = json.loads(text)
    jsonschema_rs.validate(SCHEMA, record)
    assert re.fullmatch(CODE, record["code"]), record["code"]


def assert_call(call: Any) -> None:
    assert call.type == "function" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    jsonschema_rs.validate(PARAMETERS[call.function.name], arguments)


def test_sampled_json_schema_replies_all_validate(client: OpenAI) -> None:
    complete = 0
    for seed, question in enumerate(QUESTIONS * 3):
        completion = ask(
            client, question, response_format=RESPONSE_FORMAT, temperature=1.0, seed=seed
        )
        choice = completion.choices[0]
        if choice.finish_reason == "length":
            continue  # the one case a reply may stop mid-object: finish_reason says so
        assert choice.finish_reason == "stop"
        assert_record(choice.message.content)
        complete += 1
    assert complete >= len(QUESTIONS)  # the limit is the exception, not the rule


def test_a_streamed_json_schema_reply_validates(client: OpenAI) -> None:
    for question in QUESTIONS[:3]:
        stream = ask(client, question, response_format=RESPONSE_FORMAT, stream=True)
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[-1].choices[0].finish_reason == "stop"
        assert_record(text)
        # the same reply as without streaming (greedy)
        whole = ask(client, question, response_format=RESPONSE_FORMAT)
        assert whole.choices[0].message.content == text


def test_json_object_gives_objects(client: OpenAI) -> None:
    for question in QUESTIONS[:3]:
        choice = ask(client, question, response_format={"type": "json_object"}).choices[0]
        if choice.finish_reason != "length":
            assert isinstance(json.loads(choice.message.content), dict)


class Room(BaseModel):
    name: str = Field(max_length=16)
    floor: int = Field(ge=0, le=9)
    colours: list[Literal["red", "green", "blue"]] = Field(max_length=3)


class House(BaseModel):  # nested models: the SDK sends them as $defs and $ref
    rooms: list[Room] = Field(max_length=2)
    owner: str = Field(max_length=16)


def test_the_sdks_parse_helper_gets_a_model_instance(client: OpenAI) -> None:
    completion = client.chat.completions.parse(
        model="any",
        messages=[{"role": "user", "content": "Describe a small house."}],
        response_format=House,
        max_tokens=400,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, House)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_required_gives_valid_calls(client: OpenAI, stream: bool) -> None:
    complete = 0
    for question in QUESTIONS:
        if stream:
            with client.chat.completions.stream(
                model="any",
                messages=[{"role": "user", "content": question}],
                tools=TOOLS,
                tool_choice="required",
                parallel_tool_calls=False,
                max_tokens=300,
            ) as events:
                completion: Any = events.get_final_completion()
        else:
            completion = ask(client, question, tools=TOOLS, **ONE_CALL)
        choice = completion.choices[0]
        assert not choice.message.content
        if choice.finish_reason == "length":  # random weights may list calls until the limit
            continue
        assert choice.finish_reason == "tool_calls"
        assert len(choice.message.tool_calls) == 1
        assert_call(choice.message.tool_calls[0])
        complete += 1
    assert complete >= len(QUESTIONS) // 2


def test_parallel_calls_are_each_valid(client: OpenAI) -> None:
    """Up to eight calls in one reply (a random model lists calls as long as it may)."""
    complete = 0
    for question in QUESTIONS:
        completion = ask(client, question, tools=TOOLS, tool_choice="required", max_tokens=900)
        choice = completion.choices[0]
        if choice.finish_reason == "length":
            continue
        assert 1 <= len(choice.message.tool_calls) <= 8
        for call in choice.message.tool_calls:
            assert_call(call)
        assert len({call.id for call in choice.message.tool_calls}) == len(
            choice.message.tool_calls
        )
        complete += 1
    assert complete >= 1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_named_function_is_the_one_called(client: OpenAI, stream: bool) -> None:
    choice_of: Any = {"type": "function", "function": {"name": "get_time"}}
    for question in QUESTIONS[:3]:
        if stream:
            chunks = list(
                ask(
                    client,
                    question,
                    tools=TOOLS,
                    tool_choice=choice_of,
                    parallel_tool_calls=False,
                    stream=True,
                )
            )
            deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or ()]
            assert chunks[-1].choices[0].finish_reason == "tool_calls"
            names = [d.function.name for d in deltas]
            arguments = [json.loads(d.function.arguments) for d in deltas]
        else:
            completion = ask(
                client, question, tools=TOOLS, tool_choice=choice_of, parallel_tool_calls=False
            )
            calls = completion.choices[0].message.tool_calls
            names = [c.function.name for c in calls]
            arguments = [json.loads(c.function.arguments) for c in calls]
        assert names and set(names) == {"get_time"}
        for value in arguments:
            jsonschema_rs.validate(PARAMETERS["get_time"], value)


class Booking(BaseModel):
    room: Room
    nights: int = Field(ge=1, le=9)


def test_a_pydantic_function_tool_with_nested_models(client: OpenAI) -> None:
    """The SDK writes nested models as $defs and $ref; the call's arguments parse back."""
    tool = openai.pydantic_function_tool(Booking)
    completion = client.chat.completions.parse(
        model="any",
        messages=[{"role": "user", "content": "Book the blue room for two nights."}],
        tools=[tool],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=300,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    (call,) = choice.message.tool_calls
    assert isinstance(call.function.parsed_arguments, Booking)


@pytest.mark.parametrize("choice", ["auto", "none"])
def test_auto_and_none_never_write_a_call_as_text(client: OpenAI, choice: str) -> None:
    for seed, question in enumerate(QUESTIONS):
        completion = ask(
            client, question, tools=TOOLS, tool_choice=choice, temperature=1.0, seed=seed
        )
        message = completion.choices[0].message
        if message.tool_calls:  # auto may call: then the call is a real one
            assert choice == "auto" and completion.choices[0].finish_reason == "tool_calls"
            for call in message.tool_calls:
                assert_call(call)
            continue
        assert message.content and not message.content.lstrip().startswith(MARKERS)
        assert completion.choices[0].finish_reason in ("stop", "length")


def test_auto_with_a_json_schema_answers_json_or_calls(client: OpenAI) -> None:
    complete = 0
    for question in QUESTIONS[:3]:
        completion = ask(client, question, tools=TOOLS, response_format=RESPONSE_FORMAT)
        choice = completion.choices[0]
        if choice.finish_reason == "length":
            continue
        complete += 1
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            for call in choice.message.tool_calls:
                assert_call(call)
        else:
            assert choice.finish_reason == "stop"
            assert_record(choice.message.content)
    assert complete


def test_a_tool_round_trip_through_two_requests(client: OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = ask(client, "", messages=messages, tools=TOOLS, **ONE_CALL)
    calls = first.choices[0].message.tool_calls
    assert calls
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    for call in calls:
        result = {"tool_call_id": call.id, "content": json.dumps({"temperature_c": 18})}
        messages.append({"role": "tool", **result})
    second = ask(client, "", messages=messages, tools=TOOLS, tool_choice="none", max_tokens=30)
    choice = second.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.content
    assert not choice.message.tool_calls
    # the conversation is read as the model's turns: the result is part of the prompt
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_a_call_cut_off_by_the_length_limit_says_length(client: OpenAI) -> None:
    completion = ask(client, QUESTIONS[0], tools=TOOLS, **ONE_CALL, max_tokens=4)
    choice = completion.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content is None and not choice.message.tool_calls
    assert completion.usage.completion_tokens <= 4  # forced tokens never run past max_tokens


@pytest.fixture
def generator_client(generator_sidecar_service: Service) -> Iterator[OpenAI]:
    url = generator_sidecar_service.url + "/v1"
    with OpenAI(base_url=url, api_key="unused", max_retries=0) as client:
        yield client


def test_guided_and_unguided_generators_are_never_mixed(generator_client: OpenAI) -> None:
    """On the Generator path (a grammar lives in its generator): one cache scope per grammar
    sequence; cached_tokens shows which entry was lent. The question is long: a regenerated
    reply reuses whole prefill chunks only."""
    client = generator_client
    question = "Describe the blue room. " + " ".join(QUESTIONS * 4)
    conversation: list[Any] = [{"role": "user", "content": question}]

    def cached(scope: str, messages: list[Any], **extra: Any) -> tuple[int, str]:
        completion = ask(client, "", messages=messages, prompt_cache_key=scope, **extra)
        details = completion.usage.prompt_tokens_details
        return details.cached_tokens, completion.choices[0].message.content

    scope = "structured-cache-test"
    assert cached(scope, conversation, response_format=RESPONSE_FORMAT)[0] == 0
    again, text = cached(scope, conversation, response_format=RESPONSE_FORMAT)
    assert again > 0  # the same grammar: the guided generator is reused ...
    assert_record(text)  # ... and its grammar holds again
    # not lent to an unguided request, nor to another grammar
    assert cached(scope, conversation)[0] == 0
    assert cached(scope, conversation, response_format={"type": "json_object"})[0] == 0
    # and an unguided generator is not lent to a guided request
    plain_scope = "plain-cache-test"
    cached(plain_scope, conversation)
    assert cached(plain_scope, conversation)[0] > 0
    assert cached(plain_scope, conversation, response_format=RESPONSE_FORMAT)[0] == 0
    # the next turn of a guided conversation continues its generator, still valid
    turn = [*conversation, {"role": "assistant", "content": text}]
    turn.append({"role": "user", "content": "And the red one?"})
    following, reply = cached(scope, turn, response_format=RESPONSE_FORMAT)
    assert following > 0
    assert_record(reply)


def schema_format(schema: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"response_format": {"type": "json_schema", "json_schema": {"schema": schema, **spec}}}


def one_tool(**function: Any) -> dict[str, Any]:
    return {"tools": [{"type": "function", "function": function}]}


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


NAMED = {"name": "x"}
# name: (the request's extra fields, the `param` the refusal names)
BAD: dict[str, tuple[dict[str, Any], str]] = {
    "unknown-type": (schema_format({"type": "objectx"}, **NAMED), "response_format"),
    "bad-pattern": (
        schema_format({"type": "string", "pattern": "(("}, **NAMED),
        "response_format",
    ),
    "schema-without-name": (
        schema_format({"type": "object"}),
        "response_format.json_schema.json_schema.name",
    ),
    "unknown-format": ({"response_format": {"type": "xml"}}, "response_format"),
    "unknown-tool-in-tool-choice": (
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice",
    ),
    "tool-choice-without-tools": ({"tool_choice": "required"}, "tool_choice"),
    "duplicate-tools": ({"tools": [TOOLS[0], TOOLS[0]]}, "tools"),
    "bad-tool-name": (one_tool(name="bad name!"), "tools.0.function.name"),
    "bad-parameters": (one_tool(name="f", parameters={"type": "nope"}), "tools"),
    # parameters that are not an object: a call could then not be read back (it was dropped,
    # content null and finish "stop"); OpenAI refuses them too
    **{
        f"{kind}-parameters": (
            one_tool(name="f", parameters={"type": kind}),
            "tools.0.function.parameters",
        )
        for kind in ("array", "string", "integer")
    },
    # llguidance's own options: `lenient` drops keywords it cannot enforce (uniqueItems, not,
    # dependentRequired), the separators make replies that are not JSON
    "x-guidance-in-a-schema": (
        schema_format(
            {"type": "array", "uniqueItems": True, "x-guidance": {"lenient": True}}, **NAMED
        ),
        "response_format",
    ),
    "x-guidance-in-parameters": (
        one_tool(name="f", parameters={"type": "object", "x-guidance": {"key_separator": "="}}),
        "tools.0.function.parameters",
    ),
    "nested-too-deeply": (schema_format(nested(300), **NAMED), "response_format"),
    "tool-nested-too-deeply": (one_tool(name="f", parameters=nested(300)), "tools"),
    "stop-with-a-format": ({"response_format": {"type": "json_object"}, "stop": ["}"]}, "stop"),
}


@pytest.mark.parametrize(("extra", "param"), BAD.values(), ids=BAD.keys())
def test_bad_structured_requests_are_refused_naming_the_field(
    client: OpenAI, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        ask(client, "Hi", **extra)
    error = raised.value
    assert error.status_code == 400
    assert error.param is not None and error.param.startswith(param), error.body
    assert error.code in ("invalid_value", "invalid_schema")


def test_the_log_line_says_what_a_reply_was_held_to(
    client: OpenAI, sidecar_service: Service
) -> None:
    held_to = {"log-json": "json_object", "log-tools": "tools", "log-plain": None}
    ask(
        client,
        "Hi",
        response_format={"type": "json_object"},
        max_tokens=5,
        extra_headers={"X-Request-Id": "log-json"},
    )
    ask(client, "Hi", tools=TOOLS, max_tokens=5, extra_headers={"X-Request-Id": "log-tools"})
    ask(client, "Hi", max_tokens=5, extra_headers={"X-Request-Id": "log-plain"})
    # each line is written when its request is over, which may be just after the client read it
    for request_id, kind in held_to.items():
        assert request_line(sidecar_service, request_id).get("structured") == kind


def test_a_tool_message_must_answer_an_earlier_call(client: OpenAI) -> None:
    messages: list[Any] = [
        {"role": "user", "content": "Hi"},
        {"role": "tool", "tool_call_id": "call_unknown", "content": "18 degrees"},
    ]
    with pytest.raises(openai.BadRequestError) as raised:
        ask(client, "", messages=messages, tools=TOOLS)
    assert raised.value.param == "messages"


# Schemas no reply can be held to: refused before anything is sent, streamed or not (before,
# a 500, or a 200 with a role chunk and then a stream cut without [DONE]).
SELF = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
UNHOLDABLE: dict[str, tuple[dict[str, Any], str]] = {
    "ref-loop": (
        schema_format({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}, **NAMED),
        "response_format",
    ),
    "recursive-required": (schema_format(SELF, **NAMED), "response_format"),
    "900-optional-properties": (
        schema_format(
            {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(900)}},
            **NAMED,
        ),
        "response_format",
    ),
    "recursive-required-parameters": (
        one_tool(name="f", parameters=SELF) | {"tool_choice": "required"},
        "tools.0.function.parameters",
    ),
    "bounds-no-double-holds": (
        schema_format({"type": "integer", "minimum": 2**53 + 1, "maximum": 2**53 + 1}, **NAMED),
        "response_format",
    ),
    "not-json-schema": (
        schema_format({"type": "object", "required": "a"}, **NAMED),
        "response_format",
    ),
}


def chat(url: str, body: dict[str, Any] | bytes, **extra: Any) -> httpx.Response:
    if isinstance(body, dict):
        body = json.dumps({"model": "any", "max_tokens": 60, **body, **extra}).encode()
    headers = {"content-type": "application/json"}
    return httpx.post(url + "/v1/chat/completions", content=body, headers=headers, timeout=120)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(("extra", "param"), UNHOLDABLE.values(), ids=UNHOLDABLE.keys())
def test_a_schema_no_reply_can_be_held_to_is_refused_before_anything_is_sent(
    sidecar_service: Service, extra: dict[str, Any], param: str, stream: bool
) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    response = chat(sidecar_service.url, {"messages": messages, "stream": stream, **extra})
    assert response.status_code == 400, response.text[:300]
    assert response.headers["content-type"] == "application/json"  # no stream was started
    error = response.json()["error"]
    assert error["code"] == "invalid_schema" and error["param"].startswith(param), error


@pytest.mark.parametrize(
    ("field", "param"),
    [
        (
            '"tools":[{"type":"function","function":{"name":"f","parameters":'
            '{"type":"object","properties":{"\\ud800":{"type":"string"}}}}}]',
            "tools.0.function.parameters",
        ),
        (
            '"tools":[{"type":"function","function":{"name":"f","parameters":'
            '{"type":"object","description":"a\\udfffb"}}}]',
            "tools.0.function.parameters",
        ),
        (
            '"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":'
            '{"enum":["\\ud83d"]}}}',
            "response_format",
        ),
    ],
    ids=["tool-key", "tool-value", "response-format"],
)
def test_strings_in_a_schema_must_be_valid_unicode(
    sidecar_service: Service, field: str, param: str
) -> None:
    """A lone surrogate (JSON's \\u escapes can write one) reached the tokenizer, through the
    tools' paragraph of the prompt: a 500."""
    body = '{"model":"any","messages":[{"role":"user","content":"Hi"}],' + field + "}"
    response = chat(sidecar_service.url, body.encode())
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == "invalid_value" and error["param"].startswith(param), error
    assert "valid Unicode" in error["message"]


# The grammar forces {"k":1,"k":1}: an object open to keys matching ^k$, at least and at most
# two of them. Whatever the model does, the reply repeats a key (JSON parsers keep one: the
# object then has one property, which minProperties refuses), and ends normally.
REPEATS = schema_format(
    {
        "type": "object",
        "patternProperties": {"^k$": {"const": 1}},
        "additionalProperties": False,
        "minProperties": 2,
        "maxProperties": 2,
    },
    **NAMED,
)


@pytest.fixture(scope="module")
def checking_sidecar(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    """A sidecar of its own: the shared one never answers 500 (test_sidecar_errors.py)."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-reply-check.log"
    with services.sidecar(tiny_model_dir, log) as service:
        yield service


@pytest.fixture
def checking_client(checking_sidecar: Service) -> Iterator[OpenAI]:
    url = checking_sidecar.url + "/v1"
    with OpenAI(base_url=url, api_key="unused", max_retries=0) as client:
        yield client


def test_a_finished_reply_that_fails_its_check_is_an_error_not_a_stop(
    checking_client: OpenAI, checking_sidecar: Service
) -> None:
    with pytest.raises(openai.InternalServerError) as raised:
        ask(checking_client, "Hi", **REPEATS, extra_headers={"X-Request-Id": "check-whole"})
    assert raised.value.code == "invalid_reply"
    assert "repeats a key" in raised.value.message
    line = request_line(checking_sidecar, "check-whole")
    assert (line["outcome"], line["error_type"]) == ("error", "invalid_reply")
    assert '"k"' not in json.dumps(line)  # the reply is not logged (LOG_PROMPTS off)


def test_a_streamed_reply_that_fails_its_check_ends_with_an_error_event(
    checking_client: OpenAI, checking_sidecar: Service
) -> None:
    client = checking_client
    messages = [{"role": "user", "content": "Hi"}]
    response = chat(checking_sidecar.url, {"messages": messages, "stream": True, **REPEATS})
    assert response.status_code == 200
    events = [e.removeprefix("data: ") for e in response.text.split("\n\n") if e]
    assert "[DONE]" not in events
    *chunks, last = [json.loads(e) for e in events]
    assert last["error"]["code"] == "invalid_reply", last
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == '{"k":1,"k":1}'  # what the client has seen
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)  # never "stop"
    with pytest.raises(openai.APIError, match="repeats a key"):  # the SDK raises it
        for _ in ask(client, "Hi", stream=True, **REPEATS):
            pass
