"""GET /readyz: 200 only when this instance can serve a chat (App Service's health check path,
a Kubernetes readiness probe); else 503, Retry-After and the app's error envelope."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from tests.chatapp.fake_sidecar import READY, FakeSidecar


def not_ready(response: TestResponse) -> dict[str, str]:
    """The error of a 503 readiness answer, after checking its form."""
    assert response.status_code == 503
    assert response.headers["Content-Type"] == "application/json"
    assert int(response.headers["Retry-After"]) >= 1
    assert response.headers["Cache-Control"] == "no-store"
    body = response.get_json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type"}
    error: dict[str, str] = body["error"]
    return error


def test_ready_sidecar(client: FlaskClient, fake: FakeSidecar) -> None:
    fake.readyz = (200, {**READY, "model": "Phi-3-mini-4k-instruct"})
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.get_json() == {"status": "ready", "model": "Phi-3-mini-4k-instruct"}
    assert response.headers["Cache-Control"] == "no-store"
    assert client.head("/readyz").status_code == 200


@pytest.mark.parametrize("phase", ["starting", "downloading", "loading", "warming_up"])
def test_a_loading_model_is_503_loading(client: FlaskClient, fake: FakeSidecar, phase: str) -> None:
    fake.readyz = (503, {"ready": False, "phase": phase, "reason": None, "phase_seconds": 2.0})
    error = not_ready(client.get("/readyz"))
    assert error == {"message": f"The model is still loading (phase {phase}).", "type": "loading"}
    assert client.head("/readyz").status_code == 503
    # The page's health keeps its meaning: the app is alive, the model on its way.
    health = client.get("/healthz")
    assert health.status_code == 200 and health.get_json()["sidecar"]["ready"] is False


def test_a_restarting_worker_is_503_restarting(client: FlaskClient, fake: FakeSidecar) -> None:
    reason = "the model worker exited with code 3; restarting in 1 s"
    fake.readyz = (503, {"ready": False, "phase": "restarting", "reason": reason})
    assert not_ready(client.get("/readyz")) == {
        "message": "The model is restarting.",
        "type": "restarting",
    }


def test_a_failed_model_is_503_without_the_sidecars_reason(
    client: FlaskClient, fake: FakeSidecar
) -> None:
    reason = "onnxruntime-genai could not load the model in '/home/models/x': bad graph"
    fake.readyz = (503, {"ready": False, "phase": "failed", "reason": reason, "model": "x"})
    response = client.get("/readyz")
    assert not_ready(response)["type"] == "model_failed"
    assert "/home/models" not in response.text and "onnxruntime" not in response.text


def test_an_unknown_phase_is_not_echoed(client: FlaskClient, fake: FakeSidecar) -> None:
    fake.readyz = (503, {"ready": False, "phase": "<script>x</script>"})
    response = client.get("/readyz")
    assert not_ready(response) == {"message": "The model is not ready yet.", "type": "loading"}
    assert "script" not in response.text


def test_a_sidecar_that_is_down_is_503_unavailable(
    make_app: Callable[..., Flask], down_url: str
) -> None:
    response = make_app(SIDECAR_URL=down_url).test_client().get("/readyz")
    assert not_ready(response) == {
        "message": "The model service is not reachable; it may be starting or stopped.",
        "type": "upstream_unavailable",
    }


def test_a_refused_key_is_503_although_the_sidecars_readyz_says_ready(
    make_app: Callable[..., Flask], fake: FakeSidecar
) -> None:
    """The sidecar's /readyz is open to probes and says ready; every chat would be 401."""
    fake.models = (401, {"error": {"message": "Missing or invalid API key.", "type": "x"}})
    secret = "sk-not-for-the-body"
    response = make_app(UPSTREAM_API_KEY=secret).test_client().get("/readyz")
    error = not_ready(response)
    assert error["type"] == "upstream_unauthorized"
    assert "UPSTREAM_API_KEY" in error["message"] and secret not in response.text


def test_an_openai_server_is_ready_once_it_lists_a_model(
    make_app: Callable[..., Flask], fake: FakeSidecar
) -> None:
    client = make_app(UPSTREAM_API="openai").test_client()
    answer: Any = client.get("/readyz")
    assert answer.status_code == 200 and answer.get_json()["model"] == "fake-model"
    fake.models = (200, {"object": "list", "data": []})  # still pulling its model
    assert not_ready(client.get("/readyz"))["type"] == "loading"


def test_only_get_and_head(client: FlaskClient) -> None:
    response = client.post("/readyz")
    assert response.status_code == 405
    assert response.get_json()["error"]["type"] == "method_not_allowed"
