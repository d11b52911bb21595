"""POST /v1/audio/transcriptions as clients see it: the official `openai` SDK's
`audio.transcriptions.create` against a real sidecar on the tiny chat model and the real
Whisper tiny.en, on sentences espeak-ng speaks; every response format; every refusal; the
speech model in /readyz and /v1/models; nothing of the audio or its text logged or written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from scripts.run import services
from scripts.run.services import Service

KEY = "test-key"
HEADERS = {"Authorization": f"Bearer {KEY}"}
SENTENCE = "Paris is the capital and largest city of France."
WORDS = ("paris", "capital", "france")

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng")


def speak(text: str, out: Path) -> bytes:
    subprocess.run(["espeak-ng", "-w", str(out), text], check=True)
    return out.read_bytes()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("speech-tmp")  # the sidecar's TMPDIR: must stay empty


@pytest.fixture(scope="module")
def service(
    tiny_model_dir: Path,
    whisper_dir: Path,
    scratch: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Service]:
    log = tmp_path_factory.mktemp("logs") / "sidecar-speech.log"
    with services.sidecar(
        tiny_model_dir,
        log,
        env={"TMPDIR": str(scratch)},
        SPEECH_MODEL_PATH=str(whisper_dir),
        SPEECH_MAX_BYTES="600000",  # 13.6 s of espeak-ng's 22 kHz 16-bit wav
        SPEECH_MAX_SECONDS="12",
        API_KEY=KEY,
    ) as running:
        services.wait_for_speech(running)
        yield running


@pytest.fixture(scope="module")
def wav(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return speak(SENTENCE, tmp_path_factory.mktemp("audio") / "sentence.wav")


@pytest.fixture
def client(service: Service) -> Iterator[OpenAI]:
    with OpenAI(base_url=service.url + "/v1", api_key=KEY, max_retries=0) as client:
        yield client


def post(service: Service, files: Any = None, data: Any = None, **kw: Any) -> httpx.Response:
    url = service.url + "/v1/audio/transcriptions"
    return httpx.post(url, files=files, data=data, headers=HEADERS, timeout=60, **kw)


def heard(text: str) -> bool:
    return all(word in text.lower() for word in WORDS)


def test_the_sdk_s_transcription_hears_the_sentence(client: OpenAI, wav: bytes) -> None:
    reply = client.audio.transcriptions.create(model="whisper-1", file=("s.wav", wav))
    assert heard(reply.text), reply.text
    assert reply.usage is not None and reply.usage.type == "duration"
    assert reply.usage.seconds == 4  # 3.3 s of speech, rounded up


def test_every_response_format(client: OpenAI, wav: bytes) -> None:
    create = client.audio.transcriptions.create
    text = create(model="whisper-1", file=("s.wav", wav), response_format="text")
    assert isinstance(text, str) and heard(text)
    srt = create(model="whisper-1", file=("s.wav", wav), response_format="srt")
    assert srt.startswith("1\n00:00:00,000 --> 00:00:0") and heard(srt)
    vtt = create(model="whisper-1", file=("s.wav", wav), response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n1\n00:00:00.000 --> ") and heard(vtt)
    verbose = create(
        model="whisper-1",
        file=("s.wav", wav),
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
    )
    assert verbose.language == "english" and heard(verbose.text)
    assert 3 < verbose.duration < 4
    assert verbose.segments and verbose.segments[0].start == 0.0
    assert verbose.words and {w.word.strip().strip(".").lower() for w in verbose.words} >= {
        "paris",
        "capital",
    }


def test_the_speech_model_in_readyz_and_models(service: Service) -> None:
    ready = httpx.get(service.url + "/readyz").json()["speech"]
    assert ready == {"served": True, "phase": "ready", "model": "whisper-tiny-en", "reason": None}
    models = httpx.get(service.url + "/v1/models", headers=HEADERS).json()["data"]
    speech = next(m for m in models if m["id"] == "whisper-tiny-en")
    assert speech["type"] == "transcription" and speech["max_audio_seconds"] == 12


@pytest.mark.parametrize(
    ("files", "data", "status", "code"),
    [
        (None, {"model": "whisper-1"}, 400, "audio_missing"),
        ({"file": ("e.wav", b"")}, None, 400, "audio_empty"),
        ({"file": ("t.txt", b"hello, this is not audio at all")}, None, 400, "invalid_audio"),
        ({"file": ("b.wav", b"RIFF\0\0\0\0WAVEfmt " + b"\0" * 64)}, None, 400, "invalid_audio"),
        ({"file": ("a.wav", b"x")}, {"response_format": "mp3"}, 400, "unsupported_response_format"),
        ({"file": ("a.wav", b"x")}, {"colour": "red"}, 400, "invalid_multipart"),
        ({"file": ("a.wav", b"x")}, {"temperature": "7"}, 400, "invalid_multipart"),
        ({"file": ("a.wav", b"x")}, {"language": "English!"}, 400, "invalid_multipart"),
    ],
)
def test_refusals(service: Service, files: Any, data: Any, status: int, code: str) -> None:
    # httpx sends multipart only with files; a body of fields alone is made multipart here
    reply = post(service, files=files or {"x": (None, "1")}, data=data)
    if files is None:
        reply = post(service, files={"model": (None, "whisper-1")})
    assert reply.status_code == status, reply.text
    assert reply.json()["error"]["code"] == code


def test_too_long_and_too_large_are_refused(service: Service, tmp_path: Path) -> None:
    long = speak(" ".join([SENTENCE] * 4), tmp_path / "long.wav")  # about 13 s, under 600 kB
    assert len(long) < 600_000
    reply = post(service, files={"file": ("l.wav", long)})
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "audio_too_long"
    large = speak(" ".join([SENTENCE] * 6), tmp_path / "large.wav")
    reply = post(service, files={"file": ("l.wav", large)})
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "audio_too_large"


def test_a_huge_part_header_and_the_wrong_media_type(service: Service) -> None:
    boundary = "b0undary"
    huge = "x" * 20_000
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{huge}"\r\n'
        f"Content-Type: audio/wav\r\n\r\nRIFF\r\n--{boundary}--\r\n"
    ).encode()
    headers = HEADERS | {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    url = service.url + "/v1/audio/transcriptions"
    reply = httpx.post(url, content=body, headers=headers)
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "invalid_multipart"
    reply = httpx.post(url, json={"file": "x"}, headers=HEADERS)
    assert reply.status_code == 415


def test_nothing_of_the_audio_or_its_text_is_logged_or_written(
    service: Service, client: OpenAI, wav: bytes, scratch: Path
) -> None:
    big = wav * 2  # over 1 MB with the headers: Starlette would spool this to a file
    client.audio.transcriptions.create(model="whisper-1", file=("s.wav", wav))
    post(service, files={"file": ("s.wav", big[:590_000])})
    assert os.listdir(scratch) == []
    log = service.log().lower()
    assert not any(word in log for word in WORDS)
    lines = [json.loads(line) for line in service.log_lines()]
    assert any(line.get("path") == "/v1/audio/transcriptions" for line in lines)
