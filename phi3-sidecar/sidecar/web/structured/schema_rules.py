"""What a client's JSON Schema must be for a grammar to hold a reply to it, checked in the web
process before admission (structured/settle.py; each failure is 400 invalid_schema naming the
field). A schema llguidance compiles can still fail it once the reply is under way, which the worker
could only end as an error: a 500, or a stream cut after its 200. So, before that:

- `unending`: every value the schema allows somewhere must have a finite JSON text. A `$ref`
  loop ({"$ref": "#"}), a required property or a `minItems` item that holds the schema itself
  again: llguidance fails at the first token, or writes forced text until its own limit.
- `inexact`: numeric bounds beyond 2^53 are rounded inward to doubles for llguidance
  (guidance.exact_bounds); a range with no double left in it is refused here, in those words.
- `crowded`: at most MAX_AT_ONCE properties that may come next at one place. llguidance's
  parser holds 2,000 items per row (its `max_items_in_row`) and an object's optional properties
  take 4 each at its opening brace ("Current row has 3599 items" for 900 of them); the
  branches of `anyOf`, `oneOf` and `allOf` that may start there add theirs, and an object open
  to other properties counts OPEN more (7 items).
- `probe`: the grammar itself, compiled by llguidance here with a tokenizer of single bytes
  (no model needed), gives a first token and survives the text it forces from there (a
  failure the rules above do not foresee shows there, in llguidance's words).

Subschemas are walked as JSON Schema nests them (properties, items, anyOf, ... and `$ref`
within the document); `not`, `if`/`then`/`else` and keywords llguidance refuses are not.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any, ClassVar, TypeGuard
from urllib.parse import unquote

import llguidance

from sidecar.ipc import Guidance
from sidecar.web.structured.guidance import exact_bounds

MAX_AT_ONCE = 480  # x 4 items, plus a few: under llguidance's 2,000 per row
OPEN = 2  # an object open to other properties (additionalProperties not false, patterns)
PROBE_ROUNDS = 64
_TYPES = ("null", "boolean", "object", "array", "number", "integer", "string")
_OBJECT_KEYWORDS = ("properties", "required", "additionalProperties", "patternProperties")
_EOS = 256


class SchemaRefused(Exception):
    """The schema cannot hold a reply; str() says why, in one line for the client."""


class _Document:
    """One schema document: its reachable subschemas and where each is."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.where: dict[int, str] = {}  # id of a subschema: its JSON pointer (the first path)
        self.nodes: list[dict[str, Any]] = []
        stack: list[tuple[object, str]] = [(root, "")]
        while stack:
            node, pointer = stack.pop()
            if not isinstance(node, dict) or id(node) in self.where:
                continue
            self.where[id(node)] = pointer or "/"
            self.nodes.append(node)
            stack.extend(_children(node, pointer))
            target = self.ref(node)
            if target is not None:
                stack.append((target, _pointer_of(node["$ref"])))

    def ref(self, node: dict[str, Any]) -> dict[str, Any] | None:
        """The subschema a `$ref` in this document points to (None: none, or elsewhere)."""
        reference = node.get("$ref")
        if not isinstance(reference, str) or not reference.startswith("#"):
            return None
        path = unquote(reference[1:])
        if path and not path.startswith("/"):
            return None  # an anchor ("#name"): llguidance's business
        target: object = self.root
        for part in path.split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                return None
        return target if isinstance(target, dict) else None


def _children(node: dict[str, Any], pointer: str) -> Iterator[tuple[object, str]]:
    for key in ("additionalProperties", "items", "additionalItems", "contains"):
        yield node.get(key), f"{pointer}/{key}"
    for key in ("unevaluatedProperties", "unevaluatedItems"):
        yield node.get(key), f"{pointer}/{key}"
    for key in ("anyOf", "oneOf", "allOf", "prefixItems", "items"):
        subs = node.get(key)
        for index, sub in enumerate(subs if isinstance(subs, list) else ()):
            yield sub, f"{pointer}/{key}/{index}"
    for key in ("properties", "patternProperties", "dependentSchemas"):
        subs = node.get(key)
        for name, sub in subs.items() if isinstance(subs, dict) else ():
            yield sub, f"{pointer}/{key}/{_escaped(str(name))}"


def _escaped(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _pointer_of(reference: str) -> str:
    return unquote(reference[1:]) or "/"


def check(schema: dict[str, Any]) -> None:
    """SchemaRefused if a reply held to this schema could never end, or would crowd the
    grammar engine's parser (see above)."""
    try:
        document = _Document(schema)
        where = unending(document) or inexact(document) or crowded(document)
    except RecursionError:
        raise SchemaRefused("the schema is nested too deeply") from None
    if where:
        raise SchemaRefused(where)


def unending(document: _Document) -> str | None:
    """Where a value of the schema can have no finite JSON text (None: nowhere). Found as a
    least fixpoint: every subschema starts without a finite value and gains one when what it
    requires has one; those left without one recurse for ever."""
    finite: dict[int, bool] = dict.fromkeys(document.where, False)
    changed = True
    while changed:
        changed = False
        for node in document.nodes:
            if not finite[id(node)] and _has_end(node, document, finite):
                finite[id(node)] = changed = True
    for node in document.nodes:
        kinds = [k for k in _types(node) if not _kind_has_end(k, node, document, finite)]
        if not finite[id(node)] or kinds:
            return (
                f"the schema at {document.where[id(node)]} has no finite value: it can only "
                "nest itself for ever (a $ref loop, or a required property or minItems item "
                "that recurses)"
            )
    return None


def _has_end(node: dict[str, Any], document: _Document, finite: dict[int, bool]) -> bool:
    def ok(sub: object) -> bool:
        return not isinstance(sub, dict) or finite[id(sub)]  # true, false: llguidance's own

    target = document.ref(node)
    if target is not None and not ok(target):
        return False
    if not all(ok(sub) for sub in _list(node.get("allOf"))):
        return False
    for key in ("anyOf", "oneOf"):
        if node.get(key) and not any(ok(sub) for sub in _list(node.get(key))):
            return False
    if "const" in node or "enum" in node:
        return True
    return any(_kind_has_end(kind, node, document, finite) for kind in _types(node))


def _kind_has_end(
    kind: str, node: dict[str, Any], document: _Document, finite: dict[int, bool]
) -> bool:
    """Whether a value of this type has a finite JSON text, given what has one so far."""
    if kind == "object":
        properties = node.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        # a required name no property lists: additionalProperties' (a pattern's: not followed)
        others = None if node.get("patternProperties") else node.get("additionalProperties")
        needed = [properties.get(name, others) for name in _names(node.get("required"))]
    elif kind == "array":
        count = node.get("minItems")
        count = count if isinstance(count, int) and not isinstance(count, bool) else 0
        first = _list(node.get("prefixItems")) or _list(node.get("items"))
        rest = node.get("items") if isinstance(node.get("items"), dict) else None
        needed = [first[i] if i < len(first) else rest for i in range(min(count, len(first) + 1))]
    else:
        return True
    return all(not isinstance(sub, dict) or finite[id(sub)] for sub in needed)


def inexact(document: _Document) -> str | None:
    """Where bounds rounded for llguidance hold no number though the schema's own did."""
    for node in document.nodes:
        rounded = dict(node)
        exact_bounds(rounded)
        low, high = rounded.get("minimum"), rounded.get("maximum")
        if rounded != node and _number(low) and _number(high) and low > high:
            return (
                f"the bounds at {document.where[id(node)]} hold no number the grammar engine "
                "can write: beyond 2^53 it reads bounds as doubles, so they are rounded inward "
                f"(to minimum {low}, maximum {high})"
            )
    return None


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def crowded(document: _Document) -> str | None:
    """Where more than MAX_AT_ONCE properties may come next at once (None: nowhere)."""
    for node in document.nodes:
        count = _at_once(node, document, set())
        if count > MAX_AT_ONCE:
            return (
                f"{count} properties may come next at {document.where[id(node)]} (optional "
                f"ones, with those of the anyOf/oneOf/allOf branches, an object open to others "
                f"counting {OPEN}); the grammar engine holds {MAX_AT_ONCE}: make some "
                "required, close the object (additionalProperties: false) or split the schema"
            )
    return None


def _at_once(node: object, document: _Document, seen: set[int]) -> int:
    """Properties that may come next right after this schema's opening brace."""
    if not isinstance(node, dict) or id(node) in seen:
        return 0
    seen.add(id(node))
    count = 0
    if _object_part(node):
        properties = node.get("properties")
        names = set(properties) if isinstance(properties, dict) else set()
        count += len(names - set(_names(node.get("required"))))
        if node.get("additionalProperties") is not False or node.get("patternProperties"):
            count += OPEN
    for key in ("anyOf", "oneOf", "allOf"):
        count += sum(_at_once(sub, document, seen) for sub in _list(node.get(key)))
    return count + _at_once(document.ref(node), document, seen)


def _object_part(node: dict[str, Any]) -> bool:
    """Whether the schema itself allows objects (not only through its branches or `$ref`)."""
    if "type" in node:
        return "object" in _types(node)
    if any(key in node for key in _OBJECT_KEYWORDS):
        return True
    return not any(key in node for key in ("anyOf", "oneOf", "allOf", "$ref", "const", "enum"))


def _types(node: dict[str, Any]) -> tuple[str, ...]:
    kind = node.get("type")
    if isinstance(kind, str):
        return (kind,)
    if isinstance(kind, list):
        return tuple(k for k in kind if isinstance(k, str))
    return _TYPES


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _names(value: object) -> list[str]:
    return [name for name in _list(value) if isinstance(name, str)]


def probe(guidance: Guidance) -> None:
    """SchemaRefused if llguidance cannot compile the grammar, or fails at its start or in
    the text the grammar forces from there (see above)."""
    try:
        if guidance.kind == "json_schema":
            grammar = llguidance.LLMatcher.grammar_from_json_schema(guidance.data)
        elif guidance.kind == "regex":
            grammar = llguidance.LLMatcher.grammar_from_regex(guidance.data)
        else:
            grammar = llguidance.LLMatcher.grammar_from_lark(guidance.data)
    except (ValueError, TypeError) as exc:  # not a JSON object
        raise SchemaRefused(f"the grammar engine cannot read it: {exc}") from None
    matcher = llguidance.LLMatcher(byte_tokenizer(), grammar, log_level=0)
    for _ in range(PROBE_ROUNDS):
        if matcher.is_error() or matcher.is_stopped():
            break
        mask = matcher.compute_bitmask()
        if matcher.is_error():
            break
        if not any(mask):
            raise SchemaRefused("the schema allows no reply")
        forced = matcher.compute_ff_tokens()
        if not forced or not matcher.consume_tokens(forced):
            break
    if matcher.is_error():
        # llguidance's first line; the rest is its parser state (the text so far)
        reason = matcher.get_error().strip().splitlines()[0][:300]
        raise SchemaRefused(f"the grammar engine cannot hold a reply to it: {reason}")


@functools.cache
def byte_tokenizer() -> llguidance.LLTokenizer:
    """A tokenizer whose tokens are the 256 bytes and an end token: a grammar's structure,
    without a model's vocabulary."""
    return llguidance.LLTokenizer(
        llguidance.TokenizerWrapper(_Bytes()), n_vocab=_EOS + 1, eos_token=_EOS
    )


class _Bytes:
    """What llguidance.TokenizerWrapper reads (as model/batch/guidance.py's _TokenSource)."""

    bos_token_id = None
    eos_token_id = _EOS
    special_token_ids: ClassVar = [_EOS]
    tokens: ClassVar = [bytes([i]) for i in range(256)] + [b"</s>"]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)
