"""The text protocol for tool calls: one way to offer tools, read calls and return results that
works with every model family we serve, whether or not its chat template knows tools (Phi-3's
and the generated test models' do not). It is written into the ordinary system, user and
assistant turns, which the model's own template renders, and structured/guidance.py's grammar holds
the model's reply to it:

- offered tools: a paragraph at the end of the system message (one is added when there is
  none) lists them as JSON ({"name", "description", "parameters"}), says how to call, and
  whether to call now (tool_choice);
- a call: the reply is MARKER followed by a JSON array of {"name": ..., "arguments": {...}};
  anything else is a text reply (the grammar keeps a text reply from starting like a call or
  holding the marker);
- an earlier assistant turn with `tool_calls` is written the same way, and the `tool` messages
  that answer it become one user turn: RESULT_MARKER and a JSON array of
  {"tool_call_id", "name", "content"}.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.ipc import Role
from sidecar.web.chat_completions.tools import NamedToolChoice, ToolCall, ToolChoice, ToolSpec

MARKER = "<tool_call>"
RESULT_MARKER = "<tool_result>"


def instructions(tools: Sequence[ToolSpec], choice: ToolChoice) -> str:
    """The paragraph that offers the tools (for tool_choice none too: the model still reads
    the calls and results earlier in the conversation)."""
    if not tools:
        return ""
    listed = [
        {
            "name": t.function.name,
            "description": t.function.description or "",
            "parameters": t.function.parameters or {"type": "object", "properties": {}},
        }
        for t in tools
    ]
    if isinstance(choice, NamedToolChoice):
        when = f"Call the function {choice.function.name} now."
    elif choice == "required":
        when = "Call one or more of them now."
    elif choice == "none":
        when = "Do not call them now: answer in text."
    else:
        when = "Call them when they help; otherwise answer in text."
    example = f'{MARKER}[{{"name":"{listed[0]["name"]}","arguments":{{...}}}}]'
    return (
        f"You can call these functions: {_dump(listed)}\n"
        f"To call functions, reply with only {MARKER} and a JSON array of the calls, "
        f"for example {example}. Their results come back in a message that starts with "
        f"{RESULT_MARKER}. {when}"
    )


@dataclass(frozen=True)
class Turn:
    """One message of the request, as tool_protocol needs it."""

    role: str  # system, developer, user, assistant, tool
    content: str | None
    tool_calls: Sequence[ToolCall] = ()
    tool_call_id: str | None = None


def conversation(
    turns: Sequence[Turn], tools: Sequence[ToolSpec], choice: ToolChoice
) -> tuple[tuple[Role, str], ...]:
    """The turns in the roles every template knows (system, user, assistant)."""
    return placed(turns, tools, choice)[0]


def placed(
    turns: Sequence[Turn], tools: Sequence[ToolSpec], choice: ToolChoice
) -> tuple[tuple[tuple[Role, str], ...], list[int | None]]:
    """`conversation`, and where each turn went in it (None: a tool result, joined with the
    others of its call in one user turn). A user turn's text is kept as it is, so an image
    keeps its offset in it (ipc.Generate.image_slots)."""
    names = {c.id: c.function.name for t in turns for c in t.tool_calls}
    out: list[tuple[Role, str]] = []
    where: list[int | None] = []
    results: list[dict[str, str]] = []
    for turn in turns:
        where.append(None if turn.role == "tool" else len(out) + (1 if results else 0))
        if turn.role == "tool":
            call_id = turn.tool_call_id or ""
            content = turn.content or ""
            name = names.get(call_id, "")
            results.append({"tool_call_id": call_id, "name": name, "content": content})
            continue
        if results:
            out.append(("user", RESULT_MARKER + _dump(results)))
            results = []
        if turn.role in ("system", "developer"):
            out.append(("system", turn.content or ""))
        elif turn.role == "assistant" and turn.tool_calls:
            text = (turn.content or "").strip()
            out.append(("assistant", (text + "\n" if text else "") + written(turn.tool_calls)))
        else:
            role: Role = "assistant" if turn.role == "assistant" else "user"
            out.append((role, turn.content or ""))
    if results:
        out.append(("user", RESULT_MARKER + _dump(results)))
    offer = instructions(tools, choice)
    if offer:
        if out and out[0][0] == "system":
            out[0] = ("system", f"{out[0][1]}\n\n{offer}")
        else:
            out.insert(0, ("system", offer))
            where = [None if at is None else at + 1 for at in where]
    return tuple(out), where


def written(calls: Sequence[ToolCall]) -> str:
    """Earlier calls as the model would have written them."""
    listed = []
    for call in calls:
        try:
            arguments: Any = json.loads(call.function.arguments)
        except ValueError:
            arguments = call.function.arguments  # as sent: the model sees what it was given
        listed.append({"name": call.function.name, "arguments": arguments})
    return MARKER + _dump(listed)


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    arguments: str  # JSON text

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        call = {"id": self.id, "type": "function"}
        head = {"index": index} if index is not None else {}
        return head | call | {"function": {"name": self.name, "arguments": self.arguments}}


def read_calls(text: str) -> list[Call] | None:
    """The calls in a reply that starts with MARKER; None if it does not parse (a reply cut
    off by the length limit)."""
    try:
        listed = json.loads(text.lstrip().removeprefix(MARKER))
    except ValueError:
        return None
    if not isinstance(listed, list) or not all(isinstance(c, dict) for c in listed):
        return None
    calls = []
    for call in listed:
        name, arguments = call.get("name"), call.get("arguments")
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return None
        calls.append(Call(f"call_{secrets.token_hex(12)}", name, _dump(arguments)))
    return calls


class ReplySplitter:
    """Tells, as a reply's text comes, whether it is text to show at once or a call to hold
    until the end: while the text so far could still be the start of MARKER it is held."""

    def __init__(self) -> None:
        self._held = ""
        self.calling = False
        self._decided = False

    def feed(self, text: str) -> str:
        """The part of `text` to send as content now."""
        if self._decided and not self.calling:
            return text
        self._held += text
        if self._decided:
            return ""
        start = self._held.lstrip()
        if start.startswith(MARKER):
            self._decided = self.calling = True
            return ""
        if MARKER.startswith(start):
            return ""  # undecided yet
        self._decided = True
        out, self._held = self._held, ""
        return out

    @property
    def undecided(self) -> bool:
        """Nothing shown yet: what is held could still begin a call."""
        return not self._decided

    def rest(self) -> str:
        """At the end: the held text (all of it for a call)."""
        out, self._held = self._held, ""
        return out


def _dump(value: object) -> str:
    """Compact JSON, as the grammar makes the model write it: an earlier call written back
    into the conversation is then the same text, and the conversation cache reuses it."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
