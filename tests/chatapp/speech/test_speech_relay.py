"""POST /api/transcribe end to end: the app (gunicorn) relays an espeak-ng recording to a real
sidecar's Whisper tiny.en and answers its words; the sidecar's refusals keep their meaning;
a sidecar without a speech model is a sentence, and /healthz tells the page; nothing of the
audio or its text is logged by either service."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest

from scripts.run import services
from scripts.run.services import Service

SENTENCE = "Paris is the capital and largest city of France."
LONG = " ".join(["The quick brown fox jumps over the lazy dog."] * 6)  # about 15 s

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng")


def speak(text: str, out: Path) -> bytes:
    subprocess.run(["espeak-ng", "-w", str(out), text], check=True)
    return out.read_bytes()


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("app-logs")


def start_app(sidecar: Service, logs: Path, **settings: str) -> AbstractContextManager[Service]:
    """The app under gunicorn, as deployed, in front of `sidecar`."""
    log = logs / f"chatapp-{len(list(logs.iterdir()))}.log"
    return services.chatapp(sidecar.url, log, env=settings)


@pytest.fixture(scope="module")
def app(speech_sidecar_service: Service, logs: Path) -> Iterator[Service]:
    with start_app(speech_sidecar_service, logs) as running:
        yield running


def transcribe(app: Service, data: bytes, name: str = "speech.wav") -> httpx.Response:
    files = {"file": (name, data, "audio/wav")}
    return httpx.post(app.url + "/api/transcribe", files=files, timeout=120)


def test_a_recording_comes_back_as_its_words(
    app: Service, speech_sidecar_service: Service, tmp_path: Path
) -> None:
    reply = transcribe(app, speak(SENTENCE, tmp_path / "s.wav"))
    assert reply.status_code == 200, reply.text
    text = reply.json()["text"]
    assert all(word in text.lower() for word in ("paris", "capital", "france")), text
    assert reply.headers["Cache-Control"] == "no-store"
    speech = httpx.get(app.url + "/healthz", timeout=10).json()["sidecar"]["detail"]["speech"]
    assert speech == {"served": True, "phase": "ready", "max_seconds": 10}
    # Neither service logged the words (nor anything of the audio).
    for log in (app.log(), speech_sidecar_service.log()):
        assert "capital" not in log.lower() and "paris" not in log.lower()


def test_the_sidecars_refusals_keep_their_meaning(app: Service, tmp_path: Path) -> None:
    reply = transcribe(app, speak(LONG, tmp_path / "long.wav"))
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["type"] == "audio_too_long"
    reply = transcribe(app, b"plain text, not audio at all", "notes.wav")
    assert reply.status_code == 400 and reply.json()["error"]["type"] == "invalid_audio"
    assert "Traceback" not in reply.text


def test_without_a_speech_model(sidecar_service: Service, logs: Path, tmp_path: Path) -> None:
    with start_app(sidecar_service, logs) as app:
        reply = transcribe(app, speak(SENTENCE, tmp_path / "s.wav"))
        assert reply.status_code == 503
        error = reply.json()["error"]
        assert error["type"] == "speech_not_served"
        assert error["message"] == "Voice input is off: the model service has no speech model."
        detail = httpx.get(app.url + "/healthz", timeout=10).json()["sidecar"]["detail"]
        assert detail["speech"] == {"served": False, "phase": "off"}


def test_the_openai_upstream_relays_to_v1(
    speech_sidecar_service: Service, logs: Path, tmp_path: Path
) -> None:
    with start_app(speech_sidecar_service, logs, UPSTREAM_API="openai") as app:
        reply = transcribe(app, speak(SENTENCE, tmp_path / "s.wav"))
        assert reply.status_code == 200, reply.text
        assert "france" in reply.json()["text"].lower()
        detail = httpx.get(app.url + "/healthz", timeout=10).json()["sidecar"]["detail"]
        assert detail["speech"] == {"served": True, "phase": "ready", "max_seconds": 10}
