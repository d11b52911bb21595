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


def test_responses_read_audio_and_store_its_transcript_only(service: Service, wav: str) -> None:
    """/v1/responses takes the same input_audio parts; the stored response and the
    conversation a later turn continues hold the transcript, never the audio's base64."""
    body = {
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi:"}, audio(wav)]}],
        "max_output_tokens": 2,
    }
    first = httpx.post(service.url + "/v1/responses", json=body, timeout=120)
    assert first.status_code == 200, first.text
    response = first.json()
    assert 3 < response["usage"]["input_tokens_details"]["audio_seconds"] < 4
    # What the store holds (/metrics): the transcript's bytes, not the audio's 200 KB of base64.
    assert 0 < store_bytes(service) < len(wav) // 20
    # A later turn continues from the transcript; GET returns the response.
    again = {"input": "And then?", "previous_response_id": response["id"], "max_output_tokens": 2}
    second = httpx.post(service.url + "/v1/responses", json=again, timeout=120)
    assert second.status_code == 200, second.text
    assert second.json()["usage"]["input_tokens"] > response["usage"]["input_tokens"]
    got = httpx.get(f"{service.url}/v1/responses/{response['id']}", timeout=10).json()
    assert got["id"] == response["id"] and wav[:64] not in str(got)
    assert store_bytes(service) < len(wav) // 10
    # Audio in an assistant item is refused, naming the input.
    bad = {"input": [{"role": "assistant", "content": [audio(wav)]}]}
    reply = httpx.post(service.url + "/v1/responses", json=bad, timeout=120)
    assert reply.status_code == 400 and reply.json()["error"]["param"].startswith("input")


def store_bytes(service: Service) -> float:
    metrics = httpx.get(service.url + "/metrics", timeout=10).text
    line = next(x for x in metrics.splitlines() if x.startswith("sidecar_response_store_bytes"))
    return float(line.split()[-1])
