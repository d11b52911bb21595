"""GET /api/models (relay/model_list.py, relay/upstream_models.py) against the fake: the chat
models of our sidecar's list (its encoder and speech model left out, what a cold model reads
not guessed) and of other OpenAI-compatible servers' (state unknown, the app's default
marked), its refusals as the app's envelope, and the brief cache. Our real sidecar's list is
in test_chatapp_models_relay.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask

from chatapp.errors import ApiError
from chatapp.relay.model_list import ModelList
from chatapp.relay.upstream import ChatModel
from tests.chatapp.fake_sidecar import FakeSidecar

# Our sidecar's /v1/models with MODELS_FILE (phi3-sidecar/sidecar/web/models/api.py), then its
# encoder and speech model (sidecar/embeddings/service.py, sidecar/speech/service.py).
SIDECAR_LIST = {
    "object": "list",
    "data": [
        {
            "id": "phi3-mini",
            "object": "model",
            "owned_by": "phi3-sidecar",
            "input_modalities": ["text"],
            "aliases": ["phi3", "default"],
            "state": "loaded",
            "pinned": True,
            "default": True,
            "memory_bytes": 2_500_000_000,
            "load_s": 14.25,
        },
        {
            "id": "phi3.5-vision",
            "object": "model",
            "input_modalities": ["text"],  # not loaded: the sidecar cannot tell yet
            "aliases": [],
            "state": "available",
            "pinned": False,
            "default": False,
            "memory_bytes": None,
            "load_s": None,
        },
        {
            "id": "smollm2",
            "object": "model",
            "input_modalities": ["text"],
            "aliases": [],
            "state": "available",
            "default": False,
            "load_s": 11.6,
        },
        {"id": "all-MiniLM-L6-v2", "object": "model", "type": "embedding", "dimensions": 384},
        {"id": "whisper-base", "object": "model", "type": "transcription", "ready": True},
    ],
}
# Ollama's /v1/models: ids and owners, nothing about state or what a model reads.
OLLAMA_LIST = {
    "object": "list",
    "data": [
        {"id": "llama3.2:1b", "object": "model", "created": 1, "owned_by": "library"},
        {"id": "hf.co/bartowski/Qwen2.5-0.5B-GGUF:Q4_K_M", "object": "model", "owned_by": "x"},
        {"id": "has space", "object": "model"},  # not a name a chat can send: left out
        {"id": "nomic-embed", "object": "model", "type": "embeddings"},
    ],
}


def models_of(app: Flask) -> tuple[int, Any]:
    response = app.test_client().get("/api/models")
    assert response.headers["Cache-Control"] == "no-store"
    assert response.is_json
    return response.status_code, response.get_json()


def test_our_sidecars_chat_models_with_their_states(
    make_app: Callable[..., Flask], fake: FakeSidecar
) -> None:
    fake.models = (200, SIDECAR_LIST)
    status, body = models_of(make_app())
    assert status == 200
    assert body == {
        "models": [
            {
                "id": "phi3-mini",
                "default": True,
                "state": "loaded",
                "load_s": 14.2,  # a tenth of a second is all a wait needs
                "input_modalities": ["text"],
                "aliases": ["phi3", "default"],
            },
            {
                "id": "phi3.5-vision",
                "default": False,
                "state": "available",
                "load_s": None,
                "input_modalities": None,  # unknown until it has been loaded
                "aliases": [],
            },
            {
                "id": "smollm2",
                "default": False,
                "state": "available",
                "load_s": 11.6,
                "input_modalities": None,
                "aliases": [],
            },
        ]
    }
    assert fake.gets == ["/v1/models"]


def test_another_servers_models_with_the_apps_default(
    make_app: Callable[..., Flask], fake: FakeSidecar
) -> None:
    fake.models = (200, OLLAMA_LIST)
    status, body = models_of(make_app(UPSTREAM_API="openai"))
    assert status == 200
    assert [(m["id"], m["default"], m["state"]) for m in body["models"]] == [
        ("llama3.2:1b", True, None),  # the first listed: what a chat naming none gets
        ("hf.co/bartowski/Qwen2.5-0.5B-GGUF:Q4_K_M", False, None),
    ]
    assert all(m["input_modalities"] is None and m["load_s"] is None for m in body["models"])
    # UPSTREAM_MODEL is the default, listed first if the server lists it not (a deployment)
    status, body = models_of(
        make_app(UPSTREAM_API="openai", UPSTREAM_MODEL="qwen2.5:0.5b", SIDECAR_URL=fake.url + "/v1")
    )
    assert [(m["id"], m["default"]) for m in body["models"]] == [
        ("qwen2.5:0.5b", True),
        ("llama3.2:1b", False),
        ("hf.co/bartowski/Qwen2.5-0.5B-GGUF:Q4_K_M", False),
    ]


def test_a_server_without_a_model_list(make_app: Callable[..., Flask], fake: FakeSidecar) -> None:
    fake.models = (404, {"error": "not found"})
    status, body = models_of(make_app(UPSTREAM_API="openai", UPSTREAM_MODEL="phi3:mini"))
    assert status == 200
    assert [m["id"] for m in body["models"]] == ["phi3:mini"]
    status, body = models_of(make_app(UPSTREAM_API="openai"))
    assert status == 502 and body["error"]["type"] == "upstream_error"


@pytest.mark.parametrize(
    ("answer", "status", "type"),
    [
        (
            (401, {"error": {"message": "bad key", "type": "unauthorized"}}),
            502,
            "upstream_unauthorized",
        ),
        ((400, {"error": {"message": "no", "type": "invalid_host"}}), 502, "upstream_error"),
        ((500, {"error": "boom"}), 502, "upstream_error"),
        ((200, {"unexpected": True}), 200, None),  # no list: no models, not a failure
    ],
)
@pytest.mark.parametrize("api", ["predict", "openai"])
def test_refusals_are_the_apps_envelope(
    make_app: Callable[..., Flask],
    fake: FakeSidecar,
    api: str,
    answer: tuple[int, Any],
    status: int,
    type: str | None,
) -> None:
    fake.models = answer
    got, body = models_of(make_app(UPSTREAM_API=api, UPSTREAM_MODEL="m" if api == "openai" else ""))
    assert got == status
    if type is None:
        assert [m["id"] for m in body["models"]] == (["m"] if api == "openai" else [])
    else:
        assert body == {"error": {"message": body["error"]["message"], "type": type}}
        assert "Traceback" not in body["error"]["message"]


def test_a_model_service_not_reachable(make_app: Callable[..., Flask], down_url: str) -> None:
    status, body = models_of(make_app(SIDECAR_URL=down_url))
    assert status == 503 and body["error"]["type"] == "upstream_unavailable"


def test_one_list_serves_every_page_for_a_moment(
    make_app: Callable[..., Flask], fake: FakeSidecar
) -> None:
    fake.models = (200, SIDECAR_LIST)
    app = make_app()
    for _ in range(5):
        assert models_of(app)[0] == 200
    assert fake.gets == ["/v1/models"]


class Scripted:
    """An upstream whose `models()` answers the next of `answers` (an ApiError is raised)."""

    def __init__(self, *answers: list[ChatModel] | ApiError) -> None:
        self.answers = list(answers)
        self.asked = 0

    def models(self) -> list[ChatModel]:
        self.asked += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, ApiError):
            raise answer
        return answer


def test_a_failure_is_not_kept_and_a_list_is_kept_for_its_moment() -> None:
    down = ApiError("upstream_unavailable", "down", status=503)
    upstream = Scripted(down, [ChatModel("a", default=True)])
    models = ModelList(upstream, fresh_s=60)  # type: ignore[arg-type]
    with pytest.raises(ApiError):
        models.current()
    assert [m.id for m in models.current()] == ["a"]
    assert [m.id for m in models.current()] == ["a"]
    assert upstream.asked == 2


def test_what_a_model_reads_is_remembered_once_seen_loaded() -> None:
    """Our sidecar says what a model reads only while it is loaded (upstream_models.py)."""
    seeing = ChatModel("vision", state="loaded", input_modalities=("text", "image"))
    unloaded = ChatModel("vision", state="available")
    other = ChatModel("other", state="available")
    upstream = Scripted([unloaded, other], [seeing, other], [unloaded, other])
    models = ModelList(upstream, fresh_s=0)  # type: ignore[arg-type]
    assert [m.input_modalities for m in models.current()] == [None, None]
    assert [m.input_modalities for m in models.current()] == [("text", "image"), None]
    assert [m.input_modalities for m in models.current()] == [("text", "image"), None]


def test_a_list_with_a_model_loading_is_not_kept_nor_one_a_chat_made_old(
    make_app: Callable[..., Flask], fake: FakeSidecar
) -> None:
    """The page asks again when a reply ends: by then the model a chat named is loaded."""
    entries: list[dict[str, Any]] = SIDECAR_LIST["data"]  # type: ignore[assignment]
    loading = {"data": [{**entries[0], "state": "loading"}]}
    fake.models = (200, loading)
    app = make_app()
    models_of(app)
    models_of(app)
    assert fake.gets == ["/v1/models"] * 2
    fake.models = (200, SIDECAR_LIST)
    models_of(app)
    models_of(app)
    assert len(fake.gets) == 3
    response = app.test_client().post(
        "/chat", json={"messages": [{"role": "user", "content": "Hi"}], "model": "smollm2"}
    )
    assert response.status_code == 200
    response.close()
    models_of(app)
    assert len(fake.gets) == 4
