"""POST /v1/responses (and GET/DELETE /v1/responses/{id}) as the pinned `openai` SDK uses them,
against the real sidecar on the tiny model: `responses.create`, `responses.stream` and
`responses.parse` (text, JSON Schema, tools and a tool round trip), `previous_response_id`
continuing the cached conversation, stored responses scoped to their API key and conversation
cache scope, the failure event, and the refusals, named as this API names its fields."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel, Field

from scripts.run import services
from scripts.run.services import Service
from tests.sidecar.support import request_line
from tests.support.engines import RAISE, SECRET

QUESTION = "Tell me about the weather in Paris today."
INSTRUCTIONS = "Be brief."
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Today's weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    }
]
ONE_CALL: dict[str, Any] = {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}


class City(BaseModel):
    name: str = Field(max_length=12)
    rank: int = Field(ge=0, le=9)


def sdk(service: Service, key: str = "unused") -> OpenAI:
    return OpenAI(base_url=service.url + "/v1", api_key=key, max_retries=0)


@pytest.fixture
def client(sidecar_service: Service) -> Iterator[OpenAI]:
    with sdk(sidecar_service) as client:
        yield client


def test_a_text_response_is_the_chat_reply(client: OpenAI) -> None:
    """The same conversation through either API: the same (greedy) reply, the same counts."""
    response = client.responses.create(
        model="any", instructions=INSTRUCTIONS, input=QUESTION, max_output_tokens=16
    )
    chat = client.chat.completions.create(
        model="any",
        messages=[
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": QUESTION},
        ],
        max_tokens=16,
    )
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.output_text == chat.choices[0].message.content
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant"
    usage, counted = response.usage, chat.usage
    assert usage is not None and counted is not None
    assert usage.input_tokens == counted.prompt_tokens
    assert usage.output_tokens == counted.completion_tokens
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens is not None
    limited = chat.choices[0].finish_reason == "length"
    assert response.status == ("incomplete" if limited else "completed")
    if limited:
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"


def test_the_stream_is_the_event_sequence_the_sdk_reads(client: OpenAI) -> None:
    whole = client.responses.create(model="any", input=QUESTION, max_output_tokens=16)
    with client.responses.stream(model="any", input=QUESTION, max_output_tokens=16) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    closing = ["response.output_text.done", "response.content_part.done"]
    closing += ["response.output_item.done", f"response.{whole.status}"]
    assert kinds[-4:] == closing
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1]
    assert final.type in ("response.completed", "response.incomplete")
    assert deltas == whole.output_text == final.response.output_text
    assert final.response.usage is not None
    assert final.response.usage.output_tokens == (whole.usage.output_tokens if whole.usage else 0)


def test_a_json_schema_reply_parses_streamed_or_not(client: OpenAI) -> None:
    parsed = client.responses.parse(
        model="any", input="Paris as JSON.", text_format=City, max_output_tokens=200
    )
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, City)
    with client.responses.stream(
        model="any", input="Paris as JSON.", text_format=City, max_output_tokens=200
    ) as stream:
        final = stream.get_final_response()
    assert final.output_parsed == parsed.output_parsed
    whole = client.responses.create(
        model="any",
        input="Paris as JSON.",
        text={"format": {"type": "json_object"}},
        max_output_tokens=40,
    )
    assert whole.text is not None and whole.text.format is not None
    assert whole.text.format.type == "json_object" and whole.output_text.startswith("{")
    if whole.status == "completed":  # the tiny model may run on in a string until the limit
        assert isinstance(json.loads(whole.output_text), dict)


def test_a_tool_call_and_its_result(client: OpenAI) -> None:
    """A call comes back as a function_call item; its result goes back as a
    function_call_output item, with the whole conversation or with previous_response_id,
    which give the same reply; streamed, the call's events and the same final output."""
    first = client.responses.create(model="any", input=QUESTION, max_output_tokens=300, **ONE_CALL)
    assert first.status == "completed"
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id.startswith("call_") and isinstance(json.loads(call.arguments), dict)
    result: Any = {"type": "function_call_output", "call_id": call.call_id, "output": '{"c": 18}'}
    stateless = client.responses.create(
        model="any",
        input=[{"role": "user", "content": QUESTION}, *first.output, result],
        tools=TOOLS,
        max_output_tokens=24,
        store=False,
    )
    stateful = client.responses.create(
        model="any",
        previous_response_id=first.id,
        input=[result],
        tools=TOOLS,
        max_output_tokens=24,
    )
    assert stateful.output_text == stateless.output_text
    assert all(item.type == "message" for item in stateful.output)
    with client.responses.stream(
        model="any", input=QUESTION, max_output_tokens=300, **ONE_CALL
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[2:6] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    (streamed,) = final.output
    assert streamed.type == "function_call" and streamed.arguments == call.arguments


def test_previous_response_id_continues_the_cached_conversation(client: OpenAI) -> None:
    """The follow-up's prompt starts with the previous prompt and reply, which the
    conversation cache holds: only the new turn's tokens are read."""
    key = "responses-follow-up"
    first = client.responses.create(
        model="any",
        instructions=INSTRUCTIONS,
        input=QUESTION,
        max_output_tokens=12,
        prompt_cache_key=key,
    )
    follow = client.responses.create(
        model="any",
        instructions=INSTRUCTIONS,
        previous_response_id=first.id,
        input="And in Rome?",
        max_output_tokens=12,
        prompt_cache_key=key,
    )
    assert first.usage is not None and follow.usage is not None
    assert follow.previous_response_id == first.id
    cached = follow.usage.input_tokens_details.cached_tokens
    assert cached >= first.usage.input_tokens  # the first prompt, and some of its reply
    assert follow.usage.input_tokens - cached < 30  # the new turn (and the reply's end)
    explicit = client.responses.create(
        model="any",
        instructions=INSTRUCTIONS,
        input=[
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And in Rome?"},
        ],
        max_output_tokens=12,
        store=False,
    )
    assert explicit.output_text == follow.output_text


def test_a_continuation_tokenizes_only_what_it_adds(
    client: OpenAI, sidecar_service: Service
) -> None:
    """Issue 46: each turn re-tokenized the whole stored conversation. The follow-up's log line
    counts the characters the tokenizer read: its new turn and the reply, not the long first
    input (model/prompt/memo.py), and its prompt is the one a fresh encode gives."""
    long_input = " ".join(f"Point {i}: the river runs north past the mill." for i in range(60))
    first = client.responses.create(
        model="any",
        input=long_input,
        max_output_tokens=8,
        prompt_cache_key="responses-tokens",
        extra_headers={"X-Request-Id": "tokens-first"},
    )
    follow = client.responses.create(
        model="any",
        previous_response_id=first.id,
        input="And then?",
        max_output_tokens=8,
        prompt_cache_key="responses-tokens",
        extra_headers={"X-Request-Id": "tokens-follow"},
    )
    one = request_line(sidecar_service, "tokens-first")
    two = request_line(sidecar_service, "tokens-follow")
    assert one["tokenized_chars"] >= len(long_input)
    assert two["tokenized_chars"] < len(first.output_text) + 200 < len(long_input)
    explicit = client.responses.create(
        model="any",
        input=[
            {"role": "user", "content": long_input},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And then?"},
        ],
        max_output_tokens=8,
        store=False,
    )
    assert follow.usage is not None and explicit.usage is not None
    assert follow.usage.input_tokens == explicit.usage.input_tokens
    assert follow.output_text == explicit.output_text


def test_logprobs_are_included_when_asked(client: OpenAI) -> None:
    response = client.responses.create(
        model="any",
        input=QUESTION,
        max_output_tokens=8,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
    )
    chat = client.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=8,
        logprobs=True,
        top_logprobs=2,
    )
    (message,) = response.output
    assert message.type == "message" and message.content[0].type == "output_text"
    got = [(lp.token, lp.logprob) for lp in message.content[0].logprobs or ()]
    assert chat.choices[0].logprobs is not None
    expected = [(lp.token, lp.logprob) for lp in chat.choices[0].logprobs.content or ()]
    assert got == expected and got
    plain = client.responses.create(model="any", input=QUESTION, max_output_tokens=8)
    assert plain.model_dump()["output"][0]["content"][0]["logprobs"] == []


@pytest.fixture(scope="module")
def keyed_service(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    log = tmp_path_factory.mktemp("logs") / "sidecar-keys.log"
    with services.sidecar(tiny_model_dir, log, API_KEY="key-a,key-b") as service:
        yield service


def test_stored_responses_belong_to_their_key_and_scope(keyed_service: Service) -> None:
    with sdk(keyed_service, "key-a") as a, sdk(keyed_service, "key-b") as b:
        mine = a.responses.create(model="any", input=QUESTION, max_output_tokens=4, user="alice")
        assert a.responses.retrieve(mine.id).output_text == mine.output_text
        with pytest.raises(openai.NotFoundError) as raised:
            b.responses.retrieve(mine.id)
        assert raised.value.code == "response_not_found"
        with pytest.raises(openai.NotFoundError):
            b.responses.delete(mine.id)
        for other, user in ((b, "alice"), (a, "bob"), (a, None)):
            extra: Any = {"user": user} if user else {}
            with pytest.raises(openai.NotFoundError) as raised:
                other.responses.create(
                    model="any", input="more", previous_response_id=mine.id, extra_body=extra
                )
            assert raised.value.param == "previous_response_id"
        follow = a.responses.create(
            model="any",
            input="more",
            previous_response_id=mine.id,
            user="alice",
            max_output_tokens=4,
        )
        assert follow.status in ("completed", "incomplete")
        unstored = a.responses.create(model="any", input=QUESTION, max_output_tokens=4, store=False)
        assert unstored.model_dump()["store"] is False
        with pytest.raises(openai.NotFoundError):
            a.responses.retrieve(unstored.id)
        a.responses.delete(mine.id)
        with pytest.raises(openai.NotFoundError):
            a.responses.retrieve(mine.id)


def test_the_store_is_bounded_and_owned() -> None:
    from sidecar.web.responses.store import Kept, ResponseStore, Stored

    def stored(name: str, owner: str = "a", scope: str | None = None) -> Stored:
        return Stored(name, owner, scope, {"id": name, "text": "x" * 400}, [])

    store = ResponseStore(budget_bytes=Kept.of(stored("r0")).nbytes * 3)
    for name in ("r0", "r1", "r2"):
        assert store.put(stored(name))
    assert store.get("r0", "a") is not None  # used: r1 is now the least recently used
    assert store.put(stored("r3"))
    assert store.get("r1", "a") is None and store.get("r0", "a") is not None
    assert store.get("r0", "b") is None and not store.delete("r0", "b")
    assert store.continuing("r0", "a", "key:k") is None
    assert store.put(stored("r4", scope="key:k"))
    assert store.continuing("r4", "a", "key:k") is not None
    assert not ResponseStore(budget_bytes=10).put(stored("big"))
    assert not ResponseStore(budget_bytes=0).enabled


def test_a_failure_after_the_first_byte_is_a_failed_event(faulty_service: Service) -> None:
    """Never a stream that just stops: response.failed, with no detail of the fault."""
    body = {"input": f"{RAISE} Tell me a story.", "stream": True, "max_output_tokens": 20}
    with httpx.stream("POST", faulty_service.url + "/v1/responses", json=body, timeout=60) as r:
        text = r.read().decode()
    assert r.status_code == 200
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "server_error"
    assert SECRET not in text


# The grammar forces {"k":1,"k":1}, which repeats a key: a reply that fails its final check
# whatever the model does (test_sidecar_openai_structured.py has the same for Chat).
REPEATS: Any = {
    "format": {
        "type": "json_schema",
        "name": "repeats",
        "schema": {
            "type": "object",
            "patternProperties": {"^k$": {"const": 1}},
            "additionalProperties": False,
            "minProperties": 2,
            "maxProperties": 2,
        },
    }
}


def test_a_reply_that_fails_its_check_is_never_completed(faulty_service: Service) -> None:
    """500 invalid_reply, or streamed a response.failed event; nothing is stored."""
    with sdk(faulty_service) as client:
        with pytest.raises(openai.InternalServerError) as raised:
            client.responses.create(model="any", input="Hi", text=REPEATS)
        assert raised.value.code == "invalid_reply"
        with client.responses.stream(model="any", input="Hi", text=REPEATS) as stream:
            events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[-1] == "response.failed" and "response.completed" not in kinds
    failed = events[-1]
    assert failed.type == "response.failed" and failed.response.error is not None
    assert "repeats a key" in failed.response.error.message
    body = {"model": "any", "input": "Hi", "text": REPEATS, "stream": True}
    with httpx.stream("POST", faulty_service.url + "/v1/responses", json=body) as response:
        text = response.read().decode()
    response_id = json.loads(text.split("data: ", 1)[1].split("\n", 1)[0])["response"]["id"]
    assert httpx.get(f"{faulty_service.url}/v1/responses/{response_id}").status_code == 404


BAD: dict[str, tuple[dict[str, Any], str | None, str]] = {
    "hosted-tool": ({"tools": [{"type": "web_search"}]}, "tools.0", "invalid_value"),
    "file-part": (
        {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
        "input.0.content.0",
        "invalid_value",
    ),
    "image-by-file-id": (
        {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
        "input.0.content.0",
        "invalid_value",
    ),
    "image-not-a-data-url": (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "input",
        "unsupported_image_url",
    ),
    "reasoning-item": (
        {"input": [{"type": "reasoning", "summary": []}]},
        "input.0",
        "invalid_value",
    ),
    "truncation": ({"truncation": "disabled"}, "truncation", "invalid_value"),
    "background": ({"background": True}, "background", "invalid_value"),
    "unknown-field": ({"frobnicate": 1}, "frobnicate", "invalid_value"),
    "include": ({"include": ["reasoning.encrypted_content"]}, "include.0", "invalid_value"),
    "top-logprobs": ({"top_logprobs": 21}, "top_logprobs", "invalid_value"),
    "logprobs-with-tools": (
        {"include": ["message.output_text.logprobs"], "tools": TOOLS},
        "include",
        "invalid_value",
    ),
    "last-not-user": ({"input": [{"role": "assistant", "content": "x"}]}, "input", "invalid_value"),
    "late-system": (
        {"input": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]},
        "input",
        "invalid_value",
    ),
    "result-of-no-call": (
        {"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]},
        "input",
        "invalid_value",
    ),
    "choice-names-no-tool": (
        {"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}},
        "tool_choice",
        "invalid_value",
    ),
    "x-guidance": (
        {"text": {"format": {"type": "json_schema", "name": "a", "schema": {"x-guidance": {}}}}},
        "text.format.schema",
        "invalid_value",
    ),
    "schema-loop": (
        {
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "a",
                    "schema": {
                        "type": "object",
                        "properties": {"a": {"$ref": "#"}},
                        "required": ["a"],
                    },
                }
            }
        },
        "text.format.schema",
        "invalid_schema",
    ),
    "parameters-not-object": (
        {"tools": [{**TOOLS[0], "parameters": {"type": "string"}}]},
        "tools.0.parameters",
        "invalid_value",
    ),
    "stop-with-format": (
        {"stop": ["x"], "text": {"format": {"type": "json_object"}}},
        "stop",
        "invalid_value",
    ),
    "unknown-previous": (
        {"previous_response_id": "resp_nope"},
        "previous_response_id",
        "response_not_found",
    ),
}


@pytest.mark.parametrize(("extra", "param", "code"), BAD.values(), ids=BAD.keys())
def test_refusals_name_the_responses_field(
    sidecar_service: Service, extra: dict[str, Any], param: str | None, code: str
) -> None:
    body = {"model": "any", "input": QUESTION, **extra}
    response = httpx.post(sidecar_service.url + "/v1/responses", json=body, timeout=60)
    error = response.json()["error"]
    assert response.status_code == (404 if code == "response_not_found" else 400)
    assert (error["param"], error["code"]) == (param, code), error["message"]
    assert error["message"].startswith(f"{param}:")


def test_get_and_delete_of_an_unknown_response_are_404(
    client: OpenAI, sidecar_service: Service
) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        client.responses.retrieve("resp_nope")
    assert raised.value.code == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.delete("resp_nope")
    # two routes share the path: a 405 names the methods of both
    response = httpx.put(sidecar_service.url + "/v1/responses/resp_nope", timeout=60)
    assert response.status_code == 405 and response.headers["allow"] == "DELETE, GET, HEAD"
