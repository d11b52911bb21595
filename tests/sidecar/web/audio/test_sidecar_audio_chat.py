"""`input_audio` parts in /v1/chat/completions on the tiny chat model, which reads no audio:
transcribed by the real Whisper tiny.en and read as the user's text (the prompt's tokens grow by
the transcript's), the usage counting the audio's seconds; the refusals; and the same request on
a sidecar without a speech model."""

from __future__ import annotations

import base64
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.run import services
from scripts.run.services import Service

SENTENCE = "Paris is the capital and largest city of France."
pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng")


@pytest.fixture(scope="module")
def service(
    tiny_model_dir: Path, whisper_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    log = tmp_path_factory.mktemp("logs") / "sidecar-chat-audio.log"
    with services.sidecar(tiny_model_dir, log, SPEECH_MODEL_PATH=str(whisper_dir)) as running:
        services.wait_for_speech(running)
        yield running


@pytest.fixture(scope="module")
def wav(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("audio") / "s.wav"
    subprocess.run(["espeak-ng", "-w", str(out), SENTENCE], check=True)
    return base64.b64encode(out.read_bytes()).decode()


def chat(service: Service, content: Any) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 2}
    return httpx.post(service.url + "/v1/chat/completions", json=body, timeout=120)


def audio(data: str) -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}


def test_audio_is_read_as_the_user_s_text(service: Service, wav: str) -> None:
    spoken = chat(service, [audio(wav)])
    assert spoken.status_code == 200, spoken.text
    usage = spoken.json()["usage"]
    assert 3 < usage["prompt_tokens_details"]["audio_seconds"] < 4
    # the same words typed: the prompt holds about as many tokens (the transcript's)
    typed = chat(service, SENTENCE).json()["usage"]
    assert abs(usage["prompt_tokens"] - typed["prompt_tokens"]) <= 6
    assert "audio_seconds" not in typed["prompt_tokens_details"]
    both = chat(service, [{"type": "text", "text": "Answer this:"}, audio(wav)])
    assert both.json()["usage"]["prompt_tokens"] > usage["prompt_tokens"]


def test_bad_audio_parts_are_refused(service: Service, tmp_path: Path) -> None:
    reply = chat(service, [audio("not base64 !!")])
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "invalid_audio"
    assert reply.json()["error"]["param"] == "messages.0.content.0.input_audio.data"
    reply = chat(service, [audio(base64.b64encode(b"plain text, no audio").decode())])
    assert reply.json()["error"]["code"] == "invalid_audio"
    silence = tmp_path / "silence.wav"
    subprocess.run(["espeak-ng", "-w", str(silence), " "], check=True)
    reply = chat(service, [audio(base64.b64encode(silence.read_bytes()).decode())])
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["code"] in ("no_speech", "audio_empty")


def test_without_a_speech_model(sidecar_service: Service, wav: str) -> None:
    reply = chat(sidecar_service, [audio(wav)])
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "audio_input_unsupported"
    reply = httpx.post(
        sidecar_service.url + "/v1/audio/transcriptions", files={"file": ("a.wav", b"x")}
    )
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "speech_not_served"
    assert httpx.get(sidecar_service.url + "/readyz").json()["speech"] == {
        "served": False,
        "phase": "off",
    }
