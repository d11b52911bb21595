"""Several models behind our real sidecar (MODELS_FILE: the tiny model pinned, the small one
loaded when asked for), through the app, with both APIs: GET /api/models lists them with their
states, `POST /chat`'s `model` picks the one that answers, a cold one's loading is relayed
before its reply, a name it does not serve is 404 model_not_found, and a stored chat keeps each
reply's model."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from flask import Flask

from scripts.run import services

HELLO = [{"role": "user", "content": "Hello there"}]
APIS = ["predict", "openai"]


@pytest.fixture(scope="module")
def two_models(
    tiny_model_dir: Path, small_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    folder = tmp_path_factory.mktemp("two-models")
    tiny = {"id": "tiny", "path": str(tiny_model_dir), "aliases": ["chat"], "pinned": True}
    small = {"id": "small", "path": str(small_model_dir), "aliases": ["bigger"]}
    with services.several_models(folder, [tiny, small]) as service:
        yield service


def unload(sidecar: services.Service, model: str) -> None:
    response = httpx.post(f"{sidecar.url}/v1/models/{model}/unload", timeout=30)
    assert response.status_code == 200 and response.json()["state"] == "available"


def chat_lines(app: Flask, **body: Any) -> list[dict[str, Any]]:
    response = app.test_client().post("/chat", json={"max_new_tokens": 3, **body})
    try:
        assert response.status_code == 200, response.get_data()
        return [json.loads(line) for line in response.get_data().splitlines()]
    finally:
        response.close()


@pytest.mark.parametrize("api", APIS)
def test_the_sidecars_models_are_listed_with_their_states(
    api: str, two_models: services.Service, make_app: Callable[..., Flask]
) -> None:
    unload(two_models, "small")
    app = make_app(SIDECAR_URL=two_models.url, UPSTREAM_API=api)
    response = app.test_client().get("/api/models")
    assert response.status_code == 200
    models = {m["id"]: m for m in response.get_json()["models"]}
    assert list(models) == ["tiny", "small"]  # the sidecar's order; no other kind of model
    tiny, small = models["tiny"], models["small"]
    assert (tiny["state"], tiny["default"], tiny["aliases"]) == ("loaded", True, ["chat"])
    assert tiny["input_modalities"] == ["text"]  # loaded: known
    assert (small["state"], small["default"], small["aliases"]) == ("available", False, ["bigger"])
    assert small["input_modalities"] is None  # not loaded: the sidecar does not know yet


@pytest.mark.parametrize("api", APIS)
def test_a_cold_model_is_loaded_and_the_page_is_told(
    api: str, two_models: services.Service, make_app: Callable[..., Flask]
) -> None:
    """The chat names the small model, which is not loaded: the sidecar's `loading` events
    cross to the app and become the page's lines, all before the first delta; the done line
    names the model, and the list then says it is loaded."""
    unload(two_models, "small")
    app = make_app(SIDECAR_URL=two_models.url, UPSTREAM_API=api, SIDECAR_READ_TIMEOUT=120.0)
    lines = chat_lines(app, messages=HELLO, model="small", conversation_id=f"cold-{api}")
    loading = [line["loading"] for line in lines if "loading" in line]
    assert loading and {entry["model"] for entry in loading} == {"small"}
    assert set(loading[0]) == {"model", "seconds", "seconds_left"}
    first_delta = next(i for i, line in enumerate(lines) if "delta" in line)
    assert all("loading" not in line for line in lines[first_delta:])
    assert lines[-1]["done"] is True and lines[-1]["model"] == "small"
    listed = {m["id"]: m for m in app.test_client().get("/api/models").get_json()["models"]}
    assert listed["small"]["state"] == "loaded"
    assert listed["small"]["input_modalities"] == ["text"]
    # The default answers a chat that names none, by any name the sidecar knows it
    lines = chat_lines(app, messages=HELLO, model="chat")
    assert not any("loading" in line for line in lines) and lines[-1]["model"] == "chat"


@pytest.mark.parametrize("api", APIS)
def test_a_model_the_sidecar_does_not_serve(
    api: str, two_models: services.Service, make_app: Callable[..., Flask]
) -> None:
    app = make_app(SIDECAR_URL=two_models.url, UPSTREAM_API=api)
    response = app.test_client().post("/chat", json={"messages": HELLO, "model": "gpt-4o"})
    assert response.status_code == 404
    assert response.get_json()["error"] == {
        "message": "The model service has no model named 'gpt-4o'; choose another model.",
        "type": "model_not_found",
    }


def test_a_stored_chat_keeps_each_replys_model(
    two_models: services.Service, make_app: Callable[..., Flask], database_url: str
) -> None:
    headers = {"X-MS-CLIENT-PRINCIPAL-ID": "models-oid"}
    app = make_app(
        SIDECAR_URL=two_models.url,
        DATABASE_URL=database_url,
        AUTH_MODE="appservice",
        SIDECAR_READ_TIMEOUT=120.0,
    )
    client = app.test_client()
    chat_id = client.post("/api/chats", json={}, headers=headers).get_json()["id"]
    for model in ("small", None, "tiny"):
        body: dict[str, Any] = {"chat_id": chat_id, "messages": HELLO, "max_new_tokens": 2}
        if model is not None:
            body["model"] = model
        response = client.post("/chat", json=body, headers=headers)
        assert response.status_code == 200
        assert json.loads(response.get_data().splitlines()[-1])["done"] is True
        response.close()
    messages = client.get(f"/api/chats/{chat_id}", headers=headers).get_json()["messages"]
    assert [m.get("model") for m in messages] == [None, "small", None, None, None, "tiny"]
