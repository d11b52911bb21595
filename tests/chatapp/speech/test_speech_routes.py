"""POST /api/transcribe's own refusals, before any model service is asked (the Flask test
client: no process), and how a model service's transcription answers are read
(relay/upstream_speech.py). The relay to a real sidecar: test_speech_relay.py (slow)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import pytest
import requests
from flask import Flask

from chatapp.relay.upstream_speech import refusal, speech_of

WAV = b"RIFF\x24\x00\x00\x00WAVEfmt "  # only a name and a few bytes: never sent anywhere here


def post(app: Flask, data: Any = None, **kw: Any) -> Any:
    return app.test_client().post("/api/transcribe", data=data, **kw)


def recording(data: bytes, name: str = "a.wav") -> dict[str, Any]:
    return {"file": (io.BytesIO(data), name)}


def test_the_body_must_be_a_form_with_one_file(make_app: Callable[..., Flask]) -> None:
    app = make_app()
    reply = post(app, json={"file": "x"})
    assert reply.status_code == 415
    assert reply.get_json()["error"]["type"] == "unsupported_media_type"
    reply = post(app, data={"model": "whisper-1"}, content_type="multipart/form-data")
    assert reply.status_code == 400 and reply.get_json()["error"]["type"] == "audio_missing"
    reply = post(app, data=recording(b"", "empty.webm"), content_type="multipart/form-data")
    assert reply.status_code == 400 and reply.get_json()["error"]["type"] == "audio_empty"
    assert reply.headers["Cache-Control"] == "no-store"


def test_a_recording_over_the_largest_body_is_413(make_app: Callable[..., Flask]) -> None:
    app = make_app(MAX_IMAGES=0, MAX_IMPORT_BYTES=1000, MAX_CONTENT_LENGTH=1000)
    files = recording(WAV + bytes(2000))
    reply = post(app, data=files, content_type="multipart/form-data")
    assert reply.status_code == 413
    assert reply.get_json()["error"]["type"] == "audio_too_large"


def test_another_site_and_a_stranger_are_refused(make_app: Callable[..., Flask]) -> None:
    reply = post(
        make_app(),
        data=recording(WAV),
        content_type="multipart/form-data",
        headers={"Sec-Fetch-Site": "cross-site"},
    )
    assert reply.status_code == 403 and reply.get_json()["error"]["type"] == "cross_site"
    reply = post(
        make_app(AUTH_MODE="appservice"), data=recording(WAV), content_type="multipart/form-data"
    )
    assert reply.status_code == 401 and reply.get_json()["error"]["type"] == "unauthenticated"


def test_an_unreachable_model_service_is_503(make_app: Callable[..., Flask], down_url: str) -> None:
    app = make_app(SIDECAR_URL=down_url)
    reply = post(app, data=recording(WAV), content_type="multipart/form-data")
    assert reply.status_code == 503
    assert reply.get_json()["error"]["type"] == "upstream_unavailable"


def answer(status: int, error: dict[str, Any] | None, **headers: str) -> requests.Response:
    response = requests.Response()
    response.status_code = status
    response._content = json.dumps({"error": error}).encode() if error else b"not json"
    response.headers.update(headers)
    return response


@pytest.mark.parametrize(
    ("status", "error", "expected", "expected_status"),
    [
        (
            404,
            {"code": "speech_not_served", "message": "no speech model"},
            "speech_not_served",
            503,
        ),
        (404, None, "speech_not_served", 503),  # a server without the route
        (503, {"code": "model_not_ready", "phase": "loading"}, "speech_loading", 503),
        (503, {"code": "model_not_ready", "phase": "failed"}, "speech_failed", 503),
        (503, {"code": "overloaded", "message": "full"}, "busy", 503),
        (413, {"code": "audio_too_large", "message": "big"}, "audio_too_large", 413),
        (400, {"code": "audio_too_long", "message": "over 300 s"}, "audio_too_long", 400),
        (400, {"code": "audio_empty", "message": "no samples"}, "audio_empty", 400),
        (400, {"code": "invalid_audio", "message": "not audio"}, "invalid_audio", 400),
        (400, {"code": "invalid_host", "message": "host"}, "upstream_error", 502),
        (401, {"code": "invalid_api_key", "message": "key"}, "upstream_unauthorized", 502),
        (500, None, "upstream_error", 502),
    ],
)
def test_each_refusal_keeps_its_meaning(
    status: int, error: dict[str, Any] | None, expected: str, expected_status: int
) -> None:
    relayed = refusal(answer(status, error, **{"Retry-After": "3"}))
    assert (relayed.type, relayed.status) == (expected, expected_status)
    assert relayed.message.endswith(".") and "Traceback" not in relayed.message
    if expected == "speech_loading":
        assert relayed.retry_after == 3


def test_what_the_page_learns_of_speech() -> None:
    models = {
        "data": [{"id": "phi3"}, {"id": "w", "type": "transcription", "max_audio_seconds": 60}]
    }
    assert speech_of({"served": True, "phase": "ready", "reason": "/models/w"}, models) == {
        "served": True,
        "phase": "ready",
        "max_seconds": 60,
    }
    assert speech_of({"served": False, "phase": "off"}, {"data": []}) == {
        "served": False,
        "phase": "off",
    }
    assert speech_of(None, models) == {"served": True, "phase": "ready", "max_seconds": 60}
    assert speech_of(None, {"data": [{"id": "gpt"}]}) is None  # not said: the page offers it
