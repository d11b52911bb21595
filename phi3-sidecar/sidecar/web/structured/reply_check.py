"""The check a finished structured reply passes before it is returned as valid: parsed as JSON
with every object key once (parsers keep the last of a repeated key, so a repeat could override
what the first said), then validated by a JSON Schema validator (jsonschema_rs, which compares
numbers exactly) against the schema the grammar was built from (guidance.Grammar). The grammar
makes nearly every failure impossible (structured/guidance.py says how); this catches what it
cannot: an object open to other properties may repeat one, and llguidance is not a validator.

A reply cut off by a limit (finish "length") is not checked: it says it is incomplete.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

import jsonschema_rs

from sidecar.web.chat_completions.tool_protocol import MARKER
from sidecar.web.structured.schema_rules import SchemaRefused


class ReplyCheck:
    """The validators of one request's reply (`validator`), built before admission
    (structured/settle.py)."""

    def __init__(
        self,
        answer: jsonschema_rs.Validator | None,
        arguments: dict[str, jsonschema_rs.Validator],
        max_calls: int,
    ) -> None:
        self._answer = answer  # the JSON reply's; None: a text reply, or calls only
        self._arguments = arguments  # each tool's that the reply may call
        self._max_calls = max_calls

    def problem(self, text: str, calling: bool) -> str | None:
        """Why this finished reply is not what its grammar promises (None: it is). `calling`:
        the reply is a tool call (tool_protocol.ReplySplitter). A text reply next to tools
        (tool_choice auto or none, no response_format) is free text."""
        try:
            if calling:
                self._check_calls(text)
            elif self._answer is not None:
                _check(self._answer, strict_loads(text))
        except ValueError as failed:
            return str(failed)
        return None

    def _check_calls(self, text: str) -> None:
        calls = strict_loads(text.lstrip().removeprefix(MARKER))
        if not isinstance(calls, list) or not 1 <= len(calls) <= self._max_calls:
            raise ValueError(f"the reply is not a list of 1 to {self._max_calls} calls")
        for index, call in enumerate(calls):
            if not isinstance(call, dict) or set(call) != {"name", "arguments"}:
                raise ValueError(f"call {index} is not {{name, arguments}}")
            arguments = self._arguments.get(call["name"])
            if arguments is None:
                raise ValueError(f"call {index} names no tool it may call")
            _check(arguments, call["arguments"], f"call {index}'s arguments")


def validator(schema: dict[str, Any]) -> jsonschema_rs.Validator:
    """The schema's validator; SchemaRefused if it is not valid JSON Schema (draft 2020-12
    unless its `$schema` names another)."""
    try:
        # offline: a `$ref` to a URL (http:, file:) is never fetched by this process
        return jsonschema_rs.validator_for(schema, offline=True)
    except jsonschema_rs.ValidationError as error:  # the schema against its meta-schema
        where = _pointer(error.instance_path)
        raise SchemaRefused(
            f"not a valid JSON Schema at {where}: {error.message.splitlines()[0][:200]}"
        ) from None
    except (ValueError, jsonschema_rs.ReferencingError) as error:
        reason = str(error).splitlines()[0][:200]
        raise SchemaRefused(f"not a valid JSON Schema: {reason}") from None


def _check(schema: jsonschema_rs.Validator, value: object, what: str = "the reply") -> None:
    try:
        error = next(schema.iter_errors(value), None)
    except ValueError:  # a number jsonschema_rs cannot hold (1e400 reads as infinity)
        raise ValueError(f"{what} holds a number the validator cannot read") from None
    if error is not None:  # its keyword and place, never the reply's text
        keyword = next((str(p) for p in reversed(error.schema_path) if isinstance(p, str)), "")
        raise ValueError(f"{what} breaks the schema at {_pointer(error.instance_path)} ({keyword})")


def strict_loads(text: str) -> object:
    """JSON with each key of an object once; ValueError otherwise (NaN and Infinity are not
    JSON either)."""
    return json.loads(text, object_pairs_hook=_once, parse_constant=_not_json)


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        raise ValueError("the reply repeats a key in an object")
    return value


def _not_json(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _pointer(path: list[str | int]) -> str:
    escaped = (str(part).replace("~", "~0").replace("/", "~1") for part in path)
    return "/" + "/".join(escaped)
