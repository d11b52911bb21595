"""Apps written for App Service's built-in model sidecar extension, replayed against a real
sidecar on the tiny model served where the extension serves, on port 11434 (PORT=11434).

Microsoft's "tutorial-ai-slm" apps (ASP.NET Core, Express.js, FastAPI, Spring Boot) POST the
same body to http://localhost:11434/v1/chat/completions: a system and a user message,
`"stream": true, "cache_prompt": false, "n_predict": 150` (2048 in some). Each reads the
server-sent events its own way; the readers below do what each app's code does (described,
not copied), and the reply each one assembles must be the whole reply the model gives.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts import services
from scripts.make_model import LONG_PROMPT
from tests.sidecar import reference
from tests.sidecar.support import request_line

EXTENSION_PORT = 11434
URL = f"http://localhost:{EXTENSION_PORT}/v1/chat/completions"
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": LONG_PROMPT},
]


def tutorial_body(n_predict: int, stream: bool = True) -> dict[str, Any]:
    return {"messages": MESSAGES, "stream": stream, "cache_prompt": False, "n_predict": n_predict}


@pytest.fixture(scope="module")
def extension_port_sidecar(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    """The sidecar with PORT=11434 and HOST=localhost: the one setting such an app needs."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", EXTENSION_PORT)) == 0:
            pytest.skip(f"port {EXTENSION_PORT} is taken on this machine (Ollama or the like?)")
    log = tmp_path_factory.mktemp("logs") / "sidecar-11434.log"
    with services.sidecar(tiny_model_dir, log, port=EXTENSION_PORT) as service:
        yield service


def dotnet_reader(response: httpx.Response) -> Iterator[str]:
    """SLMService.cs: each line with "data: " removed and trimmed; empty lines and [DONE]
    skipped; every other line parsed as JSON (a line that is not JSON throws); the text is
    choices[0].delta.content when it is not empty."""
    for raw in response.iter_lines():
        line = raw.replace("data: ", "").strip()
        if line and line != "[DONE]":
            text = (json.loads(line).get("choices") or [{}])[0].get("delta", {}).get("content")
            if text:
                yield str(text)


def express_reader(response: httpx.Response) -> Iterator[str]:
    """slm_service.js: each chunk as it arrives split on newlines, blank lines dropped, a
    leading "data: " removed, [DONE] ends the reading; a line that does not parse is only
    warned about (and its text lost), so every line must parse on its own."""
    for chunk in response.iter_text():
        for line in (part for part in chunk.split("\n") if part.strip()):
            if line.startswith("data: "):
                line = line.replace("data: ", "", 1).strip()
            if line == "[DONE]":
                return
            data = json.loads(line)  # the app would warn and drop it: fail here instead
            choices = data.get("choices") or []
            if choices:
                text = (choices[0].get("delta") or {}).get("content")
                if text:
                    yield str(text)


def fastapi_reader(response: httpx.Response) -> Iterator[str]:
    """slm_service.py (httpx, aiter_lines): empty lines and a bare [DONE] skipped, a leading
    "data: " removed, then JSON; what does not parse is skipped (that is "[DONE]" here)."""
    for line in response.iter_lines():
        if not line or line == "[DONE]":
            continue
        if line.startswith("data: "):
            line = line.replace("data: ", "").strip()
        try:
            data = json.loads(line)
        except ValueError:
            assert line == "[DONE]", line  # nothing else may be lost
            continue
        if data.get("choices"):
            text = data["choices"][0].get("delta", {}).get("content")
            if text:
                yield str(text)


def spring_reader(response: httpx.Response) -> Iterator[str]:
    """ReactiveSLMService.java (WebClient, Accept: text/event-stream, bodyToFlux(String)):
    Spring decodes the event stream into each event's data; [DONE] is filtered out, the rest is
    JSON whose choices[0].delta.content is the text (empty ones dropped)."""
    data_lines: list[str] = []
    for line in [*response.iter_lines(), ""]:
        if line:
            field, _, value = line.partition(":")
            if field == "data":
                data_lines.append(value.removeprefix(" "))
            continue
        if data_lines:
            data = "\n".join(data_lines)
            data_lines = []
            if data != "[DONE]":
                text = json.loads(data)["choices"][0]["delta"].get("content")
                if text:
                    yield str(text)


# Each app: its reader, the headers it adds, and the n_predict it sends.
READERS = {
    "dotnet": (dotnet_reader, {}, 150),
    "express": (express_reader, {}, 2048),
    "fastapi": (fastapi_reader, {}, 2048),
    "spring": (spring_reader, {"Accept": "text/event-stream"}, 2048),
}


@pytest.mark.parametrize("app", READERS)
def test_each_tutorial_app_reads_the_whole_streamed_reply(
    extension_port_sidecar: services.Service, tiny_model_dir: Path, app: str
) -> None:
    reader, headers, n_predict = READERS[app]
    expected = reference.generate(tiny_model_dir, MESSAGES, n_predict)
    with httpx.stream("POST", URL, json=tutorial_body(n_predict), headers=headers, timeout=30) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        pieces = list(reader(r))
        rid = r.headers["x-request-id"]
    assert len(pieces) > 1  # streamed, not one piece at the end
    assert "".join(pieces) == expected.text
    line = request_line(extension_port_sidecar, rid)
    assert line["generated_tokens"] == len(expected.tokens) <= n_predict
    assert line["cached_tokens"] == 0  # cache_prompt false


def test_the_same_request_without_streaming_reads_the_message(
    extension_port_sidecar: services.Service, tiny_model_dir: Path
) -> None:
    """The non-streamed shape (the OpenAI SDKs' default): choices[0].message.content."""
    expected = reference.generate(tiny_model_dir, MESSAGES, 150)
    response = httpx.post(URL, json=tutorial_body(150, stream=False), timeout=30)
    assert response.status_code == 200, response.text
    completion = response.json()
    assert completion["choices"][0]["message"]["content"] == expected.text
    assert completion["choices"][0]["finish_reason"] == ("stop" if expected.eos else "length")
    assert completion["usage"]["completion_tokens"] == len(expected.tokens)


def test_nothing_else_changes_for_such_an_app(extension_port_sidecar: services.Service) -> None:
    """Its other calls: the model list, and readiness on the same port."""
    with contextlib.closing(httpx.Client(timeout=10)) as client:
        models = client.get(f"http://localhost:{EXTENSION_PORT}/v1/models").json()
        assert models["data"][0]["object"] == "model"
        assert client.get(f"http://localhost:{EXTENSION_PORT}/readyz").status_code == 200
