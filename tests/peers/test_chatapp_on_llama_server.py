"""The chat app in front of llama.cpp's own server (UPSTREAM_API=openai), through real processes:
a server that is not ours, with its own model names, chunk shapes (`"content": null` in the
first delta, `timings` beside `usage`) and error bodies."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from scripts.bench.peers import gguf_model, llamacpp
from scripts.run import services
from tests.e2e import live

pytest.importorskip("gguf", reason="requirements-peers.txt is not installed")

pytestmark = [pytest.mark.peers, pytest.mark.usefixtures("llama_server_built")]

USER = [{"role": "user", "content": "Plan a short walk through the old town, please."}]
CONTEXT = 512


@pytest.fixture(scope="module")
def llama(
    llama_server_built: None, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    folder = tmp_path_factory.mktemp("llama-upstream")
    gguf = folder / "tiny.gguf"
    gguf_model.convert(tiny_model_dir, gguf)
    with llamacpp.server(gguf, folder / "server.log", threads=1, slots=1, context=CONTEXT) as sc:
        yield sc


@pytest.fixture(scope="module")
def app(
    llama: services.Service, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    log = tmp_path_factory.mktemp("app-on-llama") / "app.log"
    with services.chatapp(llama.url, log, UPSTREAM_API="openai") as service:
        yield service


def test_the_reply_is_llama_servers_reply(app: services.Service, llama: services.Service) -> None:
    body = {"messages": USER, "max_tokens": 12, "temperature": 0}
    direct = httpx.post(llama.url + "/v1/chat/completions", json=body, timeout=60).json()
    objs = live.chat(app.url, USER, max_new_tokens=12, temperature=0)
    assert live.text_of(objs) == direct["choices"][0]["message"]["content"]
    done = objs[-1]
    assert done["done"] is True and done["finish_reason"] == direct["choices"][0]["finish_reason"]
    assert done["prompt_tokens"] == direct["usage"]["prompt_tokens"]


def test_health_names_the_model_llama_server_lists(
    app: services.Service, llama: services.Service
) -> None:
    (listed,) = httpx.get(llama.url + "/v1/models", timeout=10).json()["data"]
    health = httpx.get(app.url + "/healthz", timeout=10).json()
    assert health["sidecar"]["ready"] is True and health["model"] == listed["id"]


def test_a_conversation_over_its_context_is_the_readable_overflow(app: services.Service) -> None:
    long = [{"role": "user", "content": "old town walk " * CONTEXT}]
    response = httpx.post(app.url + "/chat", json={"messages": long}, timeout=60)
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "context_overflow"
