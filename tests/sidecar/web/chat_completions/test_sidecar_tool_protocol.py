"""The web process's side of structured output, as pure functions: how a request's schema is
prepared for the grammar (web/structured/guidance.py), and how tools, calls and results are written
into the prompt and read back from a reply (web/chat_completions/tool_protocol.py)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from sidecar.web.chat_completions.tool_protocol import (
    MARKER,
    RESULT_MARKER,
    ReplySplitter,
    Turn,
    conversation,
    read_calls,
    written,
)
from sidecar.web.chat_completions.tools import NamedToolChoice, ToolCall, ToolChoice, ToolSpec
from sidecar.web.structured.guidance import anchored, prepared

WEATHER = ToolSpec.model_validate(
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
)


@pytest.mark.parametrize(
    ("pattern", "whole"),
    [
        ("[A-Z]{3}", "^(?:[A-Z]{3})$"),
        ("^[a-z]+$", "^(?:[a-z]+)$"),
        ("^ab", "^(?:ab)$"),
        ("a|b", "^(?:a|b)$"),  # the alternation stays inside the group
        (r"cost\$", r"^(?:cost\$)$"),  # an escaped dollar is the character
        (r"x\\$", r"^(?:x\\)$"),  # an escaped backslash, then the anchor
    ],
)
def test_patterns_match_whole_strings(pattern: str, whole: str) -> None:
    assert anchored(pattern) == whole
    re.compile(whole)  # still a regex


def test_a_prepared_schema_anchors_every_subschema_and_is_compact() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "pattern": "a"},  # a property named "pattern"
            "list": {"type": "array", "items": {"pattern": "b"}},
            "either": {"anyOf": [{"pattern": "c"}, {"const": {"pattern": "not a schema"}}]},
        },
        "$defs": {"d": {"pattern": "d"}},
    }
    ready = prepared(schema)
    assert ready["x-guidance"] == {"whitespace_flexible": False}
    properties = ready["properties"]
    assert properties["pattern"]["pattern"] == "^(?:a)$"
    assert properties["list"]["items"]["pattern"] == "^(?:b)$"
    assert properties["either"]["anyOf"][0]["pattern"] == "^(?:c)$"
    assert properties["either"]["anyOf"][1]["const"] == {"pattern": "not a schema"}
    assert ready["$defs"]["d"]["pattern"] == "^(?:d)$"
    assert schema["properties"]["pattern"]["pattern"] == "a"  # the request's own is untouched


def test_a_call_and_its_result_become_ordinary_turns() -> None:
    call = ToolCall.model_validate(
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    )
    turns = [
        Turn("user", "Weather in Paris?"),
        Turn("assistant", None, (call,)),
        Turn("tool", "18 degrees", tool_call_id="call_1"),
    ]
    (system, user, assistant, result) = conversation(turns, [WEATHER], "auto")
    assert system[0] == "system" and '"name":"get_weather"' in system[1] and MARKER in system[1]
    assert user == ("user", "Weather in Paris?")
    # written as the grammar makes the model write it (compact), so the cache can reuse it
    assert assistant == (
        "assistant",
        MARKER + '[{"name":"get_weather","arguments":{"city":"Paris"}}]',
    )
    assert result[0] == "user" and result[1].startswith(RESULT_MARKER)
    results = json.loads(result[1].removeprefix(RESULT_MARKER))
    assert results == [{"tool_call_id": "call_1", "name": "get_weather", "content": "18 degrees"}]
    assert written([call]) == assistant[1]
    (read,) = read_calls(assistant[1]) or []
    assert (read.name, json.loads(read.arguments)) == ("get_weather", {"city": "Paris"})


def test_the_system_message_keeps_its_text_and_says_what_to_do() -> None:
    named = NamedToolChoice.model_validate(
        {"type": "function", "function": {"name": "get_weather"}}
    )
    turns = [Turn("system", "Be brief."), Turn("user", "Hi")]
    choices: list[tuple[ToolChoice, str]] = [
        ("required", "now"),
        (named, "get_weather now"),
        ("none", "Do not"),
    ]
    for choice, says in choices:
        system = conversation(turns, [WEATHER], choice)[0][1]
        assert system.startswith("Be brief.\n\n") and says in system


@pytest.mark.parametrize(
    ("pieces", "shown", "calling"),
    [
        (["Hello", " there"], "Hello there", False),
        (["<", "b>bold"], "<b>bold", False),  # starts like the marker, then is not
        (["<tool", "_call>[", "{}]"], "", True),
        ([" ", "<tool_call>[]"], "", True),
    ],
)
def test_a_reply_is_shown_at_once_unless_it_may_be_a_call(
    pieces: list[str], shown: str, calling: bool
) -> None:
    splitter = ReplySplitter()
    out = "".join(splitter.feed(piece) for piece in pieces)
    assert splitter.calling is calling
    assert out + ("" if calling else splitter.rest()) == shown
