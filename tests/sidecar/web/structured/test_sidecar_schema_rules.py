"""What a structured request's schemas must be before admission (web/structured/schema_rules.py, the
fields in web/chat_completions/tools.py), the bounds the grammar gets (web/structured/guidance.py)
and the final check of a finished reply (web/structured/reply_check.py), as pure functions. Where a
rule stands for something llguidance does, llguidance itself (its parser, with a tokenizer of single
bytes) shows that it does: a refused schema fails in it, an accepted one at the limit holds."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import llguidance
import pytest
from pydantic import BaseModel, ValidationError

from sidecar.ipc import Guidance
from sidecar.web.chat_completions.tools import JsonSchemaSpec, ToolSpec
from sidecar.web.structured.guidance import EXACT, held_to, meant, prepared
from sidecar.web.structured.reply_check import ReplyCheck, validator
from sidecar.web.structured.schema_rules import (
    MAX_AT_ONCE,
    SchemaRefused,
    byte_tokenizer,
    check,
    probe,
)


def llguidance_error(schema: dict[str, Any], text: str = "") -> str:
    """llguidance's error once it has read `text` as the worker feeds a reply, a mask and then
    a token at a time, and computed the next mask ('' if none)."""
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(prepared(schema)))
    matcher = llguidance.LLMatcher(byte_tokenizer(), grammar, log_level=0)
    for token in text.encode():
        matcher.compute_bitmask()
        matcher.consume_token(token)
    matcher.compute_bitmask()
    return str(matcher.get_error())


def properties(count: int, prefix: str = "p", **extra: Any) -> dict[str, Any]:
    names = (f"{prefix}{i}" for i in range(count))
    return {"type": "object", "properties": {n: {"type": "integer"} for n in names}, **extra}


LOOP = {"$ref": "#/$defs/loop", "$defs": {"loop": {"$ref": "#/$defs/loop"}}}
SELF_REQUIRED = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
# name: (schema, text after which llguidance fails: "" at its first token)
UNENDING: dict[str, tuple[dict[str, Any], str]] = {
    "ref-to-itself": ({"$ref": "#"}, ""),
    "ref-loop": (LOOP, ""),
    "ref-loop-of-two": (
        {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}},
        "",
    ),
    "required-recursion": (SELF_REQUIRED, "{"),
    "required-recursion-in-defs": (
        {
            "$ref": "#/$defs/node",
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {"next": {"$ref": "#/$defs/node"}},
                    "required": ["next"],
                }
            },
        },
        "{",
    ),
    "min-items-recursion": ({"type": "array", "items": {"$ref": "#"}, "minItems": 1}, "["),
    # an optional property whose every value recurses: a trap once the model writes its name
    "recursion-behind-an-optional-property": (
        {
            "type": "object",
            "properties": {"child": {"$ref": "#/$defs/node"}},
            "$defs": {"node": SELF_REQUIRED | {"properties": {"a": {"$ref": "#/$defs/node"}}}},
        },
        '{"child":{',
    ),
    "an-anyOf-branch-that-loops": (
        {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/loop"}], "$defs": LOOP["$defs"]},
        "",
    ),
}


@pytest.mark.parametrize(("schema", "text"), UNENDING.values(), ids=UNENDING.keys())
def test_a_schema_with_a_value_that_only_nests_itself_is_refused(
    schema: dict[str, Any], text: str
) -> None:
    with pytest.raises(SchemaRefused, match="no finite value"):
        check(schema)
    if "anyOf" not in schema:  # llguidance offers the null branch and never learns of the loop
        assert llguidance_error(schema, text)  # what it would have done with the reply


class Tree(BaseModel):
    value: int
    children: list[Tree] = []


class Chain(BaseModel):
    value: int
    next: Chain | None  # required, but may be null


# name: (schema, text llguidance reads without an error)
FINE: dict[str, tuple[dict[str, Any], str]] = {
    "optional": ({"type": "object", "properties": {"a": {"$ref": "#"}}}, '{"a":{"a":{'),
    "nullable": (
        {"type": ["object", "null"], "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
        '{"a":{"a":null}}',
    ),
    "may-be-empty": ({"type": "array", "items": {"$ref": "#"}}, "[[],[[]]]"),
    "pydantic-tree": (Tree.model_json_schema(), '{"value":1,"children":[{'),
    "pydantic-chain": (Chain.model_json_schema(), '{"value":1,"next":{"value":2,"next":null}}'),
    # the most properties at one place: the limit stands for what llguidance holds
    "most-optional-properties": (properties(MAX_AT_ONCE - 2), "{"),  # open: counts 2 more
    "most-closed": (properties(MAX_AT_ONCE, additionalProperties=False), "{"),
    "most-across-branches": (
        {"anyOf": [properties(10, f"b{i}_") for i in range(MAX_AT_ONCE // 12)]},
        "{",
    ),
}


@pytest.mark.parametrize(("schema", "text"), FINE.values(), ids=FINE.keys())
def test_a_schema_with_an_end_within_the_limit_is_accepted_and_llguidance_holds_it(
    schema: dict[str, Any], text: str
) -> None:
    check(schema)
    probe(Guidance("json_schema", json.dumps(prepared(schema))))
    assert llguidance_error(schema, text) == ""


@pytest.mark.parametrize(
    "schema",
    [
        properties(900),
        properties(MAX_AT_ONCE + 60, additionalProperties=False),
        {"anyOf": [properties(300, "a"), properties(300, "b")]},
        {"anyOf": [properties(4, f"b{i}_") for i in range(100)]},
        {"allOf": [properties(300, "a"), properties(300, "b")]},
        {"type": "object", "properties": {"inner": properties(600)}},  # behind an optional one
    ],
    ids=["900", "closed", "two-branches", "many-branches", "allOf", "nested"],
)
def test_too_many_properties_at_one_place_are_refused_where_llguidance_fails(
    schema: dict[str, Any],
) -> None:
    with pytest.raises(SchemaRefused, match="properties may come next"):
        check(schema)
    text = '{"inner":{' if "inner" in str(schema)[:40] else "{"
    assert "Current row has" in llguidance_error(schema, text)


def test_the_probe_refuses_what_llguidance_fails_on_at_its_start() -> None:
    for schema in (LOOP, SELF_REQUIRED, properties(900)):  # what the rules refuse first
        with pytest.raises(SchemaRefused, match="grammar engine cannot hold"):
            probe(Guidance("json_schema", json.dumps(prepared(schema))))
    with pytest.raises(SchemaRefused, match="grammar engine cannot hold"):
        probe(Guidance("json_schema", json.dumps({"type": "string", "pattern": "(("})))
    tool = ToolSpec.model_validate(
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    )
    grammar = held_to(None, [tool], "required", True)
    assert grammar is not None
    probe(grammar.guidance)  # a tool call grammar holds


def test_bounds_beyond_2_53_are_rounded_inward_to_doubles() -> None:
    def bounds(**given: int | float) -> dict[str, Any]:
        ready = prepared({"type": "integer", **given})
        return {k: v for k, v in ready.items() if k not in ("type", "x-guidance")}

    assert bounds(maximum=EXACT + 1) == {"maximum": EXACT}
    assert bounds(minimum=EXACT + 1) == {"minimum": EXACT + 2}
    assert bounds(minimum=-EXACT - 1) == {"minimum": -EXACT}
    assert bounds(exclusiveMaximum=2**60) == {"maximum": 2**60 - 128}  # doubles 128 apart
    assert bounds(exclusiveMinimum=-(2**60)) == {"minimum": -(2**60) + 128}
    assert bounds(exclusiveMaximum=1e20) == {"maximum": 99999999999999983616}
    assert bounds(minimum=3, maximum=40) == {"minimum": 3, "maximum": 40}  # small: as given
    assert bounds(minimum=3, exclusiveMaximum=EXACT * 2 + 1) == {
        "minimum": 3,
        "maximum": EXACT * 2,
    }
    # nested, and a range with no double left in it is refused in those words
    nested = {"type": "object", "properties": {"n": {"type": "integer", "maximum": EXACT + 1}}}
    assert prepared(nested)["properties"]["n"]["maximum"] == EXACT
    with pytest.raises(SchemaRefused, match="rounded inward"):
        check({"type": "integer", "minimum": EXACT + 1, "maximum": EXACT + 1})


def answers(schema: dict[str, Any]) -> ReplyCheck:
    return ReplyCheck(validator(meant(schema)), {}, 0)


def test_a_finished_reply_is_json_with_each_key_once_that_validates_exactly() -> None:
    const = {"type": "object", "properties": {"a": {"const": 1}}, "required": ["a"]}
    assert answers(const).problem('{"a":1,"b":"x"}', calling=False) is None
    for text in ('{"a":1,"\\u0061":"x"}', '{"a":1,"a":1}', '{"a":1,"b":{"c":1,"c":2}}'):
        assert answers(const).problem(text, calling=False) == "the reply repeats a key in an object"
    assert "at /a (const)" in str(answers(const).problem('{"a":2}', calling=False))
    big = answers({"type": "integer", "maximum": 9007199254740999})
    assert big.problem("9007199254740999", calling=False) is None
    assert "(maximum)" in str(big.problem("9007199254741000", calling=False))
    for text in ('{"a":1', "NaN", '{"a":1}{"a":1}', ""):
        assert answers({}).problem(text, calling=False) is not None


def test_tool_calls_are_checked_one_by_one() -> None:
    parameters = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"],
    }
    calls = ReplyCheck(None, {"f": validator(meant(parameters))}, 2)

    def problem(*listed: object) -> str | None:
        return calls.problem("<tool_call>" + json.dumps(listed), calling=True)

    good = {"name": "f", "arguments": {"city": "Paris"}}
    assert problem(good) is None
    assert problem(good, good) is None
    assert problem(good, good, good) == "the reply is not a list of 1 to 2 calls"
    assert problem() == "the reply is not a list of 1 to 2 calls"
    assert problem({"name": "g", "arguments": {}}) == "call 0 names no tool it may call"
    assert problem(good | {"id": "x"}) == "call 0 is not {name, arguments}"
    assert "call 1's arguments breaks" in str(problem(good, {"name": "f", "arguments": "Paris"}))
    assert "(maxLength)" in str(problem({"name": "f", "arguments": {"city": "Paris, France"}}))
    repeated = '<tool_call>[{"name":"f","arguments":{"city":"Paris","city":"Rome"}}]'
    assert calls.problem(repeated, calling=True) == "the reply repeats a key in an object"
    # a text reply next to tools (tool_choice auto or none) is free text
    assert calls.problem("Hello {", calling=False) is None


@pytest.fixture
def hits() -> Iterator[tuple[str, list[str]]]:
    """A local HTTP server that records every path asked for."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = b'{"type": "string"}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", asked
    server.shutdown()
    server.server_close()


def test_a_schema_that_is_not_json_schema_is_refused_and_nothing_is_fetched(
    hits: tuple[str, list[str]],
) -> None:
    url, asked = hits
    for schema in (
        {"type": "objectx"},
        {"type": "string", "pattern": "(("},
        {"$ref": "#/$defs/missing"},
        {"$ref": url + "/schema.json"},  # a URL is never fetched: nothing leaves the process
        {"$ref": "file:///etc/hostname"},
    ):
        with pytest.raises(SchemaRefused, match="not a valid JSON Schema"):
            validator(schema)
    assert asked == []


def spec(schema: object) -> dict[str, Any]:
    return {"name": "x", "schema": schema}


def tool(parameters: object) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


@pytest.mark.parametrize(
    ("model", "value", "says"),
    [
        (ToolSpec, tool({"type": "array"}), '"type": "object"'),
        (ToolSpec, tool({"type": "string"}), '"type": "object"'),
        (ToolSpec, tool({"type": "integer"}), '"type": "object"'),
        (ToolSpec, tool({"type": ["object", "null"]}), '"type": "object"'),
        (ToolSpec, tool("a string"), "dictionary"),
        (ToolSpec, tool({"type": "object", "x-guidance": {"lenient": True}}), "x-guidance"),
        (ToolSpec, tool({"properties": {"\ud800": {}}}), "valid Unicode"),
        (ToolSpec, tool({"description": "a\udfffb"}), "valid Unicode"),
        (JsonSchemaSpec, spec({"x-guidance": {"key_separator": "="}}), "x-guidance"),
        (JsonSchemaSpec, spec({"enum": [["\ud83d"]]}), "valid Unicode"),
    ],
)
def test_schemas_a_client_may_not_send(model: type[BaseModel], value: Any, says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        model.model_validate(value)


def test_a_tool_without_a_type_takes_an_object() -> None:
    spec = ToolSpec.model_validate(tool({"properties": {"a": {"type": "string"}}}))
    grammar = held_to(None, [spec], "required", False)
    assert grammar is not None
    assert grammar.arguments["f"]["type"] == "object"
    assert ToolSpec.model_validate(tool({"type": "object", "description": "é ✓"}))


def reads(guidance: Guidance, text: str) -> bool:
    """Whether llguidance lets a reply be `text` and end there."""
    grammar = llguidance.LLMatcher.grammar_from_lark(guidance.data)
    matcher = llguidance.LLMatcher(byte_tokenizer(), grammar, log_level=0)
    return bool(matcher.consume_tokens(list(text.encode())) and matcher.is_accepting())


def test_a_reference_to_the_parameters_root_stays_in_the_call() -> None:
    """In a tool call's grammar the parameters sit inside the calls array: their `#` means
    the parameters, not the array (it did: a nested "child" took a list of calls)."""
    parameters = {
        "type": "object",
        "properties": {"child": {"$ref": "#"}, "name": {"type": "string", "maxLength": 5}},
        "additionalProperties": False,
    }
    grammar = held_to(None, [ToolSpec.model_validate(tool(parameters))], "required", False)
    assert grammar is not None
    assert reads(grammar.guidance, '<tool_call>[{"name":"f","arguments":{"child":{"name":"a"}}}]')
    calls_inside = '{"child":[{"name":"f","arguments":{}}]}'
    assert not reads(grammar.guidance, '<tool_call>[{"name":"f","arguments":' + calls_inside + "}]")
