"""From a request's `response_format`, `tools` and `tool_choice` to the grammar its reply must
follow (ipc.Guidance, which the model worker hands to onnxruntime-genai's llguidance: every
token outside the grammar is masked, so the reply is valid by construction).

- json_schema: the user's JSON Schema, with two changes that only narrow what is produced
  (every reply still validates against the schema as given): `x-guidance`
  `whitespace_flexible: false` (compact JSON; with free whitespace a small model can run on in
  spaces until the length limit), and every `pattern` anchored as `^(?:...)$` (JSON Schema's
  pattern matches anywhere in the string, so "[A-Z]{3}" alone would allow any string holding
  three capitals; a user means the whole string).
- json_object: any JSON object, compact.
- tools: a Lark grammar over tool_protocol.py's text protocol: `auto` is a text reply or a
  call (`start: answer | calls`), `required` and a named function only a call, `none` only a
  text reply (TEXT_RULE: one that does not start like a call nor hold the marker). A call
  is MARKER and a JSON array of {"name", "arguments"} objects, each tool's arguments held to
  its `parameters`;
  `parallel_tool_calls: false` allows one call, else up to MAX_PARALLEL_CALLS (a small model
  can otherwise go on listing calls until the length limit).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from typing import Any

from sidecar.ipc import Guidance
from sidecar.web.openai_tools import (
    JsonObjectFormat,
    JsonSchemaFormat,
    NamedToolChoice,
    ResponseFormat,
    ToolChoice,
    ToolSpec,
)
from sidecar.web.tool_protocol import MARKER

COMPACT = {"whitespace_flexible": False}
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


def for_request(
    response_format: ResponseFormat | None,
    tools: Sequence[ToolSpec],
    tool_choice: ToolChoice | None,
    parallel_tool_calls: bool,
) -> Guidance | None:
    """The guidance of a request; None for a free text reply."""
    answer = _answer_schema(response_format)
    choice = tool_choice or "auto"
    if not tools:
        return None if answer is None else Guidance("json_schema", _dump(answer))
    if isinstance(choice, NamedToolChoice):
        tools = [t for t in tools if t.function.name == choice.function.name]
    if choice == "none":
        rows = ["start: answer", _answer_rule(answer)]
    elif choice == "auto":
        calls = _calls_rule(tools, parallel_tool_calls)
        rows = ["start: answer | calls", _answer_rule(answer), calls]
    else:
        rows = ["start: calls", _calls_rule(tools, parallel_tool_calls)]
    return Guidance("lark_grammar", "\n".join(rows))


def prepared(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema as llguidance gets it: compact, every pattern anchored (see above)."""
    schema = copy.deepcopy(schema)
    _anchor_patterns(schema)
    own = schema.get("x-guidance")
    schema["x-guidance"] = COMPACT | (own if isinstance(own, dict) else {})
    return schema


def _answer_schema(response_format: ResponseFormat | None) -> dict[str, Any] | None:
    if isinstance(response_format, JsonObjectFormat):
        return prepared({"type": "object"})
    if isinstance(response_format, JsonSchemaFormat):
        schema = response_format.json_schema.json_schema
        return prepared({"type": "object"} if schema is None else schema)
    return None


def _answer_rule(answer: dict[str, Any] | None) -> str:
    if answer is None:
        return "answer: TEXT\n" + TEXT_RULE
    return f"answer: %json {_dump(answer)}"


def _calls_rule(tools: Sequence[ToolSpec], parallel: bool) -> str:
    definitions: dict[str, Any] = {}
    calls: dict[str, Any] = {
        "type": "array",
        "items": {"anyOf": [_call_schema(t, definitions) for t in tools]},
        "minItems": 1,
        "maxItems": MAX_PARALLEL_CALLS if parallel else 1,
        "x-guidance": COMPACT,
    }
    if definitions:
        calls["$defs"] = definitions
    return f"calls: {json.dumps(MARKER)} %json {_dump(calls)}"


def _call_schema(tool: ToolSpec, definitions: dict[str, Any]) -> dict[str, Any]:
    """One tool's call; its parameters' own definitions ($defs, as the SDK's
    pydantic_function_tool writes nested models) move to the root as `<tool>.<name>`, where
    their `#/$defs/...` references then point."""
    parameters = tool.function.parameters
    if parameters is None:  # no arguments: {}
        parameters = {"type": "object", "properties": {}, "additionalProperties": False}
    arguments = prepared(parameters)
    arguments.pop("x-guidance")  # the whole array's applies
    prefix = tool.function.name + "."
    for key in ("$defs", "definitions"):
        moved = arguments.pop(key, None)
        for name, definition in moved.items() if isinstance(moved, dict) else ():
            definitions[prefix + name] = definition
    _move_references(arguments, prefix)
    for name in [n for n in definitions if n.startswith(prefix)]:
        _move_references(definitions[name], prefix)
    return {
        "type": "object",
        "properties": {"name": {"const": tool.function.name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _anchor_patterns(schema: object) -> None:
    """Anchor every `pattern` of this schema and its subschemas, in place."""
    if not isinstance(schema, dict):
        return
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        schema["pattern"] = anchored(pattern)
    for key in _ONE:
        _anchor_patterns(schema.get(key))
    for key in _MANY:
        subs = schema.get(key)
        for sub in subs if isinstance(subs, list) else ():
            _anchor_patterns(sub)
    for key in _MAP:
        subs = schema.get(key)
        if isinstance(subs, dict):
            for sub in subs.values():
                _anchor_patterns(sub)
    items = schema.get("items")
    if isinstance(items, list):  # the older tuple form
        for sub in items:
            _anchor_patterns(sub)


def _move_references(schema: object, prefix: str) -> None:
    """Point `#/$defs/x` and `#/definitions/x` references at `#/$defs/<prefix>x`, in place."""
    if isinstance(schema, list):
        for item in schema:
            _move_references(item, prefix)
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str):
            for root in ("#/$defs/", "#/definitions/"):
                if value.startswith(root):
                    schema[key] = "#/$defs/" + prefix + value.removeprefix(root)
        else:
            _move_references(value, prefix)


def anchored(pattern: str) -> str:
    """`pattern` matching whole strings: ^(?:core)$, its own ^ and $ taken off first."""
    core = pattern.removeprefix("^")
    trailing_backslashes = len(core[:-1]) - len(core[:-1].rstrip("\\"))
    if core.endswith("$") and trailing_backslashes % 2 == 0:
        core = core[:-1]
    return f"^(?:{core})$"


def _dump(schema: dict[str, Any]) -> str:
    return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
