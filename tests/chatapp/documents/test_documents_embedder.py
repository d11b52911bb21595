"""documents/embedder.py: what each request to /v1/embeddings carries. Passages go as passages and
questions as queries in `input_type` to our sidecar only (its encoder's prompts, issue 55); an
OpenAI-compatible server (UPSTREAM_API=openai) gets OpenAI's fields alone."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chatapp.documents.embedder import Embedder
from chatapp.documents.service import embedder_for
from chatapp.settings import DEFAULTS
from tests.chatapp.fake_sidecar import FakeSidecar, Handler


def vectors(handler: Handler) -> None:
    """An embeddings reply: one vector per input, as OpenAI's shape has it."""
    texts = json.loads(handler.server.fake.raw_bodies[-1])["input"]
    body = {"data": [{"index": i, "embedding": [1.0, float(i)]} for i in range(len(texts))]}
    data = json.dumps(body).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


@pytest.fixture
def fake(fake: FakeSidecar) -> FakeSidecar:
    """The chat tests' fake sidecar (tests/chatapp/conftest.py), answering with vectors."""
    fake.predict = vectors
    return fake


def test_to_our_sidecar_passages_and_questions_say_what_they_are(fake: FakeSidecar) -> None:
    embedder = Embedder(fake.url, model="m", send_input_type=True, batch=2)
    assert embedder.embed(["a", "b", "c"]).shape == (3, 2)  # two requests of passages
    assert embedder.embed_query("what is a?").shape == (2,)
    assert [r["input_type"] for r in fake.requests] == ["passage", "passage", "query"]
    assert fake.paths == ["/v1/embeddings"] * 3


def test_an_openai_compatible_server_gets_openai_s_fields_only(fake: FakeSidecar) -> None:
    Embedder(fake.url, model="m").embed_query("a")
    assert fake.requests == [{"input": ["a"], "model": "m"}]


@pytest.mark.parametrize(("api", "sends"), [("predict", True), ("openai", False)])
def test_the_app_sends_input_type_to_its_sidecar_only(api: str, sends: bool) -> None:
    config: dict[str, Any] = dict(DEFAULTS) | {"UPSTREAM_API": api, "SIDECAR_URL": "http://x"}
    assert embedder_for(config).send_input_type is sends
