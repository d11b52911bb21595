"""From a request's `response_format`, `tools` and `tool_choice` to the grammar its reply must
follow (ipc.Guidance, which the model worker hands to llguidance: every token outside the
grammar is masked), and the JSON Schemas the finished reply is then checked against
(structured/reply_check.py: the grammar engine is not a validator, see below).

- json_schema: the user's JSON Schema, with changes that only narrow what is produced (every
  reply still validates against the schema as given), in `prepared`: llguidance's option
  `x-guidance` `whitespace_flexible: false` (compact JSON; with free whitespace a small model
  can run on in spaces until the length limit; a client's own `x-guidance` is refused,
  chat_completions/tools.py); every `pattern` anchored as `^(?:...)$` (JSON Schema's pattern matches
  anywhere in the string, so "[A-Z]{3}" alone would allow any string holding three capitals;
  a user means the whole string); and numeric bounds beyond 2^53 rounded inward to a double
  (llguidance compares bounds as doubles: a maximum of 9007199254740999 allowed
  9007199254741000).
- json_object: any JSON object, compact.
- tools: a Lark grammar over chat_completions/tool_protocol.py's text protocol: `auto` is a
  text reply or a call (`start: answer | calls`), `required` and a named function only a call,
  `none` only a text reply (TEXT_RULE: one that does not start like a call nor hold the
  marker). A call is MARKER and a JSON array of {"name", "arguments"} objects, each tool's
  arguments held to its `parameters` (an object: "type": "object" is added where the schema has
  no type); `parallel_tool_calls: false` allows one call, else up to MAX_PARALLEL_CALLS (a small
  model can otherwise go on listing calls until the length limit).

What the grammar cannot hold to the final check catches (`Grammar.answer` and
`Grammar.arguments` are the schemas a finished reply must validate against): an object open to
other properties may repeat a key, also spelled with escapes ("\\u0061" for "a", which would
override a `const`: parsers keep the last; llguidance's `json_allowed_escapes`, which could
forbid that spelling, is unknown to onnxruntime-genai's copy on the Generator path), and
whatever else llguidance reads differently from a validator.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from sidecar.ipc import Guidance
from sidecar.web.chat_completions.tool_protocol import MARKER
from sidecar.web.chat_completions.tools import (
    JsonObjectFormat,
    JsonSchemaFormat,
    NamedToolChoice,
    ResponseFormat,
    ToolChoice,
    ToolSpec,
)

COMPACT = {"whitespace_flexible": False}
EXACT = 2**53  # every integer up to this is a double; llguidance holds bounds as doubles
MAX_PARALLEL_CALLS = 8
# A text reply (tool_choice auto or none): anything that does not start like a call (the
# marker, or a JSON object or array written as text) and never holds the marker, so a call can
# never come back as text (a model trained on `<tool_call>` may write one after a sentence).
_CALL_START = r"[ \t\r\n]*(" + re.escape(MARKER) + r"|\{|\[)(.|\n)*"
TEXT_RULE = rf"TEXT: /(.|\n)+/ & ~/{_CALL_START}/ & ~/(.|\n)*{re.escape(MARKER)}(.|\n)*/"

# Keywords whose value is a schema, a list of schemas, or a map of name to schema.
_ONE = (
    *("additionalProperties", "items", "not", "if", "then", "else", "contains"),
    *("propertyNames", "unevaluatedProperties", "unevaluatedItems", "additionalItems"),
)
_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


@dataclass(frozen=True)
class Grammar:
    """What a request's reply is held to: the grammar, and the schemas (`meant`) of what it
    may end as."""

    guidance: Guidance
    # The JSON reply's schema (response_format); None: a text reply, if any.
    answer: dict[str, Any] | None
    # Each callable tool's arguments (each with its own $defs); empty: no calls.
    arguments: dict[str, dict[str, Any]] = field(default_factory=dict)
    max_calls: int = 0


def held_to(
    response_format: ResponseFormat | None,
    tools: Sequence[ToolSpec],
    tool_choice: ToolChoice | None,
    parallel_tool_calls: bool,
) -> Grammar | None:
    """The grammar of a request; None for a free text reply."""
    given = _answer_schema(response_format)
    answer = None if given is None else prepared(given)
    checked = None if given is None else meant(given)
    choice = tool_choice or "auto"
    if not tools:
        return None if answer is None else Grammar(Guidance("json_schema", _dump(answer)), checked)
    if isinstance(choice, NamedToolChoice):
        tools = [t for t in tools if t.function.name == choice.function.name]
    if choice == "none":
        rows = ["start: answer", _answer_rule(answer)]
        return Grammar(Guidance("lark_grammar", "\n".join(rows)), checked)
    calls = _calls_rule(tools, parallel_tool_calls)
    if choice == "auto":
        rows = ["start: answer | calls", _answer_rule(answer), calls]
    else:
        rows = ["start: calls", calls]
    arguments = {t.function.name: meant(_parameters(t)) for t in tools}
    max_calls = MAX_PARALLEL_CALLS if parallel_tool_calls else 1
    return Grammar(Guidance("lark_grammar", "\n".join(rows)), checked, arguments, max_calls)


def for_request(
    response_format: ResponseFormat | None,
    tools: Sequence[ToolSpec],
    tool_choice: ToolChoice | None,
    parallel_tool_calls: bool,
) -> Guidance | None:
    """The guidance of a request; None for a free text reply."""
    grammar = held_to(response_format, tools, tool_choice, parallel_tool_calls)
    return None if grammar is None else grammar.guidance


def prepared(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema as llguidance gets it: compact, every pattern anchored, bounds a double
    holds (see above)."""
    schema = meant(schema)
    for subschema in _subschemas(schema):
        exact_bounds(subschema)
    schema["x-guidance"] = dict(COMPACT)
    return schema


def meant(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema as the client means it, every pattern anchored: what a finished reply is
    checked against (the grammar's narrower bounds are the grammar's business)."""
    schema = copy.deepcopy(schema)
    for subschema in _subschemas(schema):
        pattern = subschema.get("pattern")
        if isinstance(pattern, str):
            subschema["pattern"] = anchored(pattern)
    return schema


def _answer_schema(response_format: ResponseFormat | None) -> dict[str, Any] | None:
    if isinstance(response_format, JsonObjectFormat):
        return {"type": "object"}
    if isinstance(response_format, JsonSchemaFormat):
        schema = response_format.json_schema.json_schema
        return {"type": "object"} if schema is None else schema
    return None


def _answer_rule(answer: dict[str, Any] | None) -> str:
    if answer is None:
        return "answer: TEXT\n" + TEXT_RULE
    return f"answer: %json {_dump(answer)}"


def _calls_rule(tools: Sequence[ToolSpec], parallel: bool) -> str:
    definitions: dict[str, Any] = {}
    calls: dict[str, Any] = {
        "type": "array",
        "items": {"anyOf": [_call_schema(t, i, definitions) for i, t in enumerate(tools)]},
        "minItems": 1,
        "maxItems": MAX_PARALLEL_CALLS if parallel else 1,
        "x-guidance": COMPACT,
    }
    if definitions:
        calls["$defs"] = definitions
    return f"calls: {json.dumps(MARKER)} %json {_dump(calls)}"


def _call_schema(tool: ToolSpec, index: int, definitions: dict[str, Any]) -> dict[str, Any]:
    """One tool's call, the `index`th of the array's items; its parameters' own definitions
    ($defs, as the SDK's pydantic_function_tool writes nested models) move to the root as
    `<tool>.<name>`, where their `#/$defs/...` references then point; its other references
    (`#` itself, `#/properties/...`) point into its arguments where they now are."""
    arguments = prepared(_parameters(tool))
    arguments.pop("x-guidance")  # the whole array's applies
    prefix = tool.function.name + "."
    for key in ("$defs", "definitions"):
        moved = arguments.pop(key, None)
        for name, definition in moved.items() if isinstance(moved, dict) else ():
            definitions[prefix + name] = definition
    here = f"#/items/anyOf/{index}/properties/arguments"
    _move_references(arguments, prefix, here)
    for name in [n for n in definitions if n.startswith(prefix)]:
        _move_references(definitions[name], prefix, here)
    return {
        "type": "object",
        "properties": {"name": {"const": tool.function.name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _parameters(tool: ToolSpec) -> dict[str, Any]:
    """A tool's arguments schema: always an object (chat_completions/tools.py refuses another type;
    one with none would allow any JSON)."""
    parameters = tool.function.parameters
    if parameters is None:  # no arguments: {}
        parameters = {"type": "object", "properties": {}, "additionalProperties": False}
    return {"type": "object"} | parameters


def _subschemas(schema: object) -> Iterator[dict[str, Any]]:
    """This schema and every subschema in it (values of `const`, `enum`, `default`, ... are
    not schemas), each once."""
    if not isinstance(schema, dict):
        return
    yield schema
    for key in _ONE:
        yield from _subschemas(schema.get(key))
    for key in _MANY:
        subs = schema.get(key)
        for sub in subs if isinstance(subs, list) else ():
            yield from _subschemas(sub)
    for key in _MAP:
        subs = schema.get(key)
        if isinstance(subs, dict):
            for sub in subs.values():
                yield from _subschemas(sub)
    items = schema.get("items")
    if isinstance(items, list):  # the older tuple form
        for sub in items:
            yield from _subschemas(sub)


def exact_bounds(schema: dict[str, Any]) -> None:
    """Numeric bounds beyond 2^53 (in size) as the nearest double inside them, in place:
    llguidance reads a bound as a double, rounded to nearest, so a maximum of 2^53 + 1 allowed
    2^53 + 2; an exclusive bound becomes an inclusive one a whole number inside it (llguidance
    subtracts 1 from the double, which at that size changes nothing)."""
    lows: list[int] = []
    highs: list[int] = []
    for key in _BOUNDS:
        value = schema.get(key)
        if not _is_number(value) or abs(value) <= EXACT:
            continue
        del schema[key]
        if key == "minimum":
            lows.append(_double_at_least(value))
        elif key == "exclusiveMinimum":
            lows.append(_double_at_least(math.floor(value) + 1))
        elif key == "maximum":
            highs.append(_double_at_most(value))
        else:
            highs.append(_double_at_most(math.ceil(value) - 1))
    own = schema.get("minimum")  # a small bound of the schema's own still applies
    if lows:
        schema["minimum"] = max([*lows, own] if _is_number(own) else lows)
    own = schema.get("maximum")
    if highs:
        schema["maximum"] = min([*highs, own] if _is_number(own) else highs)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _double_at_least(value: float) -> int:
    """The least whole number a double holds exactly that is >= value."""
    exact = math.ceil(value)
    double = float(exact)
    if double < exact:
        double = math.nextafter(double, math.inf)
    return int(double)


def _double_at_most(value: float) -> int:
    """The greatest whole number a double holds exactly that is <= value."""
    exact = math.floor(value)
    double = float(exact)
    if double > exact:
        double = math.nextafter(double, -math.inf)
    return int(double)


def _move_references(schema: object, prefix: str, here: str) -> None:
    """Point `#/$defs/x` and `#/definitions/x` references at `#/$defs/<prefix>x`, and the
    document's others (`#`, `#/...`) below `here`, in place."""
    if isinstance(schema, list):
        for item in schema:
            _move_references(item, prefix, here)
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str):
            moved = [r for r in ("#/$defs/", "#/definitions/") if value.startswith(r)]
            if moved:
                schema[key] = "#/$defs/" + prefix + value.removeprefix(moved[0])
            elif value == "#" or value.startswith("#/"):
                schema[key] = here + value[1:]
        else:
            _move_references(value, prefix, here)


def anchored(pattern: str) -> str:
    """`pattern` matching whole strings: ^(?:core)$, its own ^ and $ taken off first."""
    core = pattern.removeprefix("^")
    trailing_backslashes = len(core[:-1]) - len(core[:-1].rstrip("\\"))
    if core.endswith("$") and trailing_backslashes % 2 == 0:
        core = core[:-1]
    return f"^(?:{core})$"


def _dump(schema: dict[str, Any]) -> str:
    return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
