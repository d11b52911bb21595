"""Strict replicas of the four apps of App Service's tutorial for its built-in model sidecar.

Microsoft's "tutorial-ai-slm" apps (Azure-Samples/ai-slm-in-app-service-sidecar,
use_sidecar_extension/: ASP.NET Core, Express.js, FastAPI, Spring Boot) POST the same body to
/v1/chat/completions: a system and a user message, `"stream": true, "cache_prompt": false,
"n_predict": 150` (.NET) or 2048, and each reads the server-sent events its own way. Each
function below reads them as its app does (described, not copied), with the app's own
strictness: where the app throws, the replica raises; where the app only logs a line it cannot
parse and goes on (Express, FastAPI), the replica raises too, because that line's text is lost.

- .NET (Services/SLMService.cs): HttpClient, StreamReader.ReadLineAsync (a line ends at \\n, \\r
  or \\r\\n), every "data: " in the line removed, Trim, then `JsonNode.Parse` of every
  non-empty line that is not "[DONE]" (no try: an SSE comment line such as ": ping" throws),
  and `node?["choices"]?[0]?["delta"]?["content"]?.ToString()` (an empty choices array
  throws).
- Express (src/services/slm_service.js): axios, each chunk as it arrives decoded on its own and
  split at "\\n"; blank lines dropped, the first "data: " removed, "[DONE]" ends the chunk's
  handler; `JSON.parse` in a try that only warns.
- FastAPI (app/services/slm_service.py): httpx.AsyncClient, `timeout=30.0`, `aiter_lines()`
  (which splits at every line end str.splitlines knows: U+0085, U+2028, U+2029 too), every
  "data: " removed, `json.loads` in a try that only warns.
- Spring (service/ReactiveSLMService.java): WebClient, Accept: text/event-stream,
  `bodyToFlux(String.class)` (Spring's SSE reader: lines at \\n or \\r\\n, an event's data
  lines joined, an event without data, such as a comment, dropped), "[DONE]" filtered out,
  then Reactor's `map` of each event to org.json's choices[0].delta.getString("content"),
  which is null for a chunk without a string content: `map` rejects null, so the stream fails.
"""

from __future__ import annotations

import asyncio
import codecs
import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

SYSTEM = "You are a helpful assistant."


@dataclass
class Read:
    """What one app read: the text it shows, and what the test may look at besides."""

    pieces: list[str]
    request_id: str
    headers: httpx.Headers
    lines: list[str] = field(default_factory=list)  # FastAPI's: every line it read

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class AppFailed(AssertionError):
    """Where the app itself throws, or loses a line's text."""


def body(prompt: str, n_predict: int, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
    return {
        "messages": messages,
        "stream": True,
        "cache_prompt": False,
        "n_predict": n_predict,
        **extra,
    }


def _strict_json(text: str) -> Any:
    """JSON as System.Text.Json, JSON.parse and Python's json read it: no NaN or Infinity."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


# -- .NET ------------------------------------------------------------------------------------

_DOTNET_LINE_END = re.compile(r"\r\n|\r|\n")


def _dotnet_lines(response: httpx.Response) -> Iterator[str]:
    """StreamReader.ReadLineAsync: UTF-8 (bad bytes as U+FFFD); a line ends at \\n, \\r or
    \\r\\n; the text after the last line end is a line too."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    pending = ""
    for chunk in response.iter_bytes():
        pending += decoder.decode(chunk)
        held = pending.endswith("\r")  # perhaps the first half of \r\n
        *lines, pending = _DOTNET_LINE_END.split(pending[:-1] if held else pending)
        pending += "\r" if held else ""
        yield from lines
    pending += decoder.decode(b"", final=True)
    lines = _DOTNET_LINE_END.split(pending)
    yield from lines if lines[-1] else lines[:-1]


def _dotnet_index(node: Any, key: str | int) -> Any:
    """JsonNode's indexers: a missing key or a JSON null is null (and `?.` stops there); an
    index past an array's end, or the wrong kind of node, throws."""
    if node is None:
        return None
    if isinstance(key, int):
        if not isinstance(node, list):
            raise AppFailed(f".NET: JsonNode[{key}] on {type(node).__name__} throws")
        if key >= len(node):
            raise AppFailed(".NET: JsonArray[0] of an empty array throws")
        return node[key]
    if not isinstance(node, dict):
        raise AppFailed(f".NET: JsonNode[{key!r}] on {type(node).__name__} throws")
    return node.get(key)


def _dotnet_string(node: Any) -> str | None:
    """JsonNode.ToString(): a string value is itself, anything else its JSON text."""
    if node is None or isinstance(node, str):
        return node
    return json.dumps(node)


def dotnet_app(url: str, prompt: str, **extra: Any) -> Read:
    """SLMService.StreamChatCompletionsAsync (HttpClient's default timeout, 100 s, covers the
    wait for the headers with ResponseHeadersRead)."""
    with httpx.stream("POST", url, json=body(prompt, 150, **extra), timeout=100.0) as response:
        if response.status_code != 200:  # EnsureSuccessStatusCode
            raise AppFailed(f".NET: HTTP {response.status_code}: {response.read()!r}")
        pieces = []
        for raw in _dotnet_lines(response):
            line = raw.replace("data: ", "").strip()
            if line and line != "[DONE]":
                try:
                    node = _strict_json(line)  # JsonNode.Parse: no try around it in the app
                except ValueError as exc:
                    raise AppFailed(f".NET: JsonNode.Parse throws on {line[:200]!r}") from exc
                content = node
                for key in ("choices", 0, "delta", "content"):
                    content = _dotnet_index(content, key)
                text = _dotnet_string(content)
                if text:
                    pieces.append(text)
        return Read(pieces, response.headers["x-request-id"], response.headers)


# -- Express ---------------------------------------------------------------------------------


def express_app(url: str, prompt: str, **extra: Any) -> Read:
    """SLMService.streamChatCompletions (axios, responseType "stream": no timeout)."""
    with httpx.stream("POST", url, json=body(prompt, 2048, **extra), timeout=None) as response:
        if response.status_code != 200:  # axios rejects
            raise AppFailed(f"Express: HTTP {response.status_code}: {response.read()!r}")
        pieces = []
        for chunk in response.iter_raw():  # each 'data' event: a Buffer, decoded on its own
            for line in chunk.decode("utf-8", errors="replace").split("\n"):
                if not line.strip():
                    continue
                parsed = line
                if line.startswith("data: "):
                    parsed = line.replace("data: ", "", 1).strip()  # JS: the first one only
                if parsed == "[DONE]":
                    break  # `return` from the chunk's handler
                try:
                    data = _strict_json(parsed)
                except ValueError as exc:  # the app warns, and the line's text is lost
                    raise AppFailed(f"Express: cannot parse {parsed[:200]!r}") from exc
                choices = data.get("choices") if isinstance(data, dict) else None
                if choices:
                    content = (choices[0].get("delta") or {}).get("content")
                    if content:
                        pieces.append(str(content))
        return Read(pieces, response.headers["x-request-id"], response.headers)


# -- FastAPI ---------------------------------------------------------------------------------


def fastapi_app(url: str, prompt: str, **extra: Any) -> Read:
    """SLMService.stream_chat_completions: httpx, a 30-second timeout (connect, each read)."""
    return asyncio.run(_fastapi_app(url, prompt, **extra))


async def _fastapi_app(url: str, prompt: str, **extra: Any) -> Read:
    pieces: list[str] = []
    lines: list[str] = []
    async with (
        httpx.AsyncClient() as client,
        client.stream(
            "POST",
            url,
            json=body(prompt, 2048, **extra),
            headers={"Content-Type": "application/json"},
            timeout=30.0,
        ) as response,
    ):
        if response.status_code != 200:
            raise AppFailed(f"FastAPI: HTTP {response.status_code}: {await response.aread()!r}")
        async for line in response.aiter_lines():  # httpx.ReadTimeout: the app answers 503
            lines.append(line)
            if not line or line == "[DONE]":
                continue
            if line.startswith("data: "):
                line = line.replace("data: ", "").strip()
            try:
                data = _strict_json(line)
            except ValueError as exc:  # the app warns and goes on: the line's text is lost
                if line == "[DONE]":  # "data: [DONE]" is one too, and holds no text
                    continue
                raise AppFailed(f"FastAPI: cannot parse {line[:200]!r}") from exc
            if "choices" in data and len(data["choices"]) > 0:
                content = data["choices"][0].get("delta", {}).get("content")
                if content:
                    pieces.append(content)
    return Read(pieces, response.headers["x-request-id"], response.headers, lines)


# -- Spring ----------------------------------------------------------------------------------


def _spring_events(response: httpx.Response) -> Iterator[str]:
    """ServerSentEventHttpMessageReader, read as String: lines at \\n or \\r\\n; an event ends
    at an empty line; its data lines ("data:", one space dropped) joined with \\n; an event
    without data (a comment, an event: or id: line alone) yields nothing."""
    data: list[str] | None = None
    pending = b""
    for chunk in itertools.chain(response.iter_bytes(), [b"\n"]):  # and the last line
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for raw in complete:
            line = raw.removesuffix(b"\r").decode("utf-8", errors="replace")
            if not line:
                if data is not None:
                    yield "\n".join(data)
                data = None
            elif line.startswith("data:"):
                value = line[6:] if line.startswith("data: ") else line[5:]
                if value:
                    data = [*(data or []), value]
    if data is not None:  # the last lines, without an empty line after them
        yield "\n".join(data)


def _spring_content(event: str) -> str | None:
    """extractContentFromResponse (org.json; any exception: null)."""
    try:
        chunk = _strict_json(event)
        choices = chunk["choices"]  # getJSONArray
        if not isinstance(choices, list):
            return None
        if len(choices) > 0:
            delta = choices[0]["delta"]  # getJSONObject(0).getJSONObject("delta")
            if not isinstance(delta, dict):
                return None
            if "content" in delta:
                content = delta["content"]  # getString: only a string, JSONObject.NULL throws
                return content if isinstance(content, str) else None
        return None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def spring_app(url: str, prompt: str, **extra: Any) -> Read:
    """ReactiveSLMService.streamChatCompletions (WebClient: no read timeout by default)."""
    headers = {"Accept": "text/event-stream"}
    with httpx.stream(
        "POST", url, json=body(prompt, 2048, **extra), headers=headers, timeout=None
    ) as response:
        if response.status_code != 200:  # retrieve(): WebClientResponseException
            raise AppFailed(f"Spring: HTTP {response.status_code}: {response.read()!r}")
        pieces = []
        for event in _spring_events(response):
            if event == "[DONE]" or "event: complete" in event:  # .filter(...)
                continue
            content = _spring_content(event)
            if content is None:  # .map(...) returned null
                raise AppFailed(f"Spring: Reactor's map returned null for {event[:200]!r}")
            if content:  # .filter(content != null && !content.isEmpty())
                pieces.append(content)
        return Read(pieces, response.headers["x-request-id"], response.headers)


APPS = {"dotnet": dotnet_app, "express": express_app, "fastapi": fastapi_app, "spring": spring_app}
N_PREDICT = {"dotnet": 150, "express": 2048, "fastapi": 2048, "spring": 2048}
