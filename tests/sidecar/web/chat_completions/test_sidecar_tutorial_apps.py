"""Apps written for App Service's built-in model sidecar extension, replayed against a real
sidecar on the tiny model served where the extension serves, on port 11434 (PORT=11434).

The four apps of Microsoft's tutorial (ASP.NET Core, Express.js, FastAPI, Spring Boot) read the
stream each its own way, some more strictly than any OpenAI SDK: tests/sidecar/tutorial_apps.py
replicates each reader with its app's strictness, and the reply each one assembles must be the
whole reply the model gives. Waiting in the queue and long prompts (the FastAPI app's 30-second
read timeout) are in test_sidecar_stream_start.py.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.models.make_model import LONG_PROMPT
from scripts.run import services
from tests.sidecar import reference
from tests.sidecar.support import request_line
from tests.sidecar.tutorial_apps import APPS, N_PREDICT, SYSTEM

EXTENSION_PORT = 11434
URL = f"http://localhost:{EXTENSION_PORT}/v1/chat/completions"
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": LONG_PROMPT}]


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


@pytest.mark.parametrize("app", APPS)
def test_each_tutorial_app_reads_the_whole_streamed_reply(
    extension_port_sidecar: services.Service, tiny_model_dir: Path, app: str
) -> None:
    """Spring's Reactor once failed at the first chunk, {"role": "assistant"} without a
    content: its map returned null."""
    n_predict = N_PREDICT[app]
    expected = reference.generate(tiny_model_dir, MESSAGES, n_predict)
    read = APPS[app](URL, LONG_PROMPT)
    assert read.headers["content-type"].startswith("text/event-stream")
    assert len(read.pieces) > 1  # streamed, not one piece at the end
    assert read.text == expected.text
    line = request_line(extension_port_sidecar, read.request_id)
    assert line["generated_tokens"] == len(expected.tokens) <= n_predict
    assert line["cached_tokens"] == 0  # cache_prompt false


# A reply that must be exactly this string (a JSON Schema enum: the grammar forces it): every
# character some line reader takes for a line end, which JSON leaves raw.
LINE_ENDS = "one\u2028two\u2029three\u0085four"


@pytest.mark.parametrize("app", APPS)
def test_each_tutorial_app_reads_a_reply_that_holds_line_separators(
    extension_port_sidecar: services.Service, app: str
) -> None:
    """U+2028, U+2029 and U+0085 are escaped in the events: the FastAPI app's httpx
    aiter_lines split its lines there, and it lost every piece that held one."""
    schema = {"name": "answer", "schema": {"enum": [LINE_ENDS]}}
    extra = {"response_format": {"type": "json_schema", "json_schema": schema}}
    read = APPS[app](URL, "Say it.", **extra)
    assert read.text == '"' + LINE_ENDS + '"'
    line = request_line(extension_port_sidecar, read.request_id)
    assert line["outcome"] == "eos"


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
