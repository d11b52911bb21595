"""Liveness, readiness and what a newcomer sees when the model folder is missing or broken,
including MODEL_DOWNLOAD=1 (offline: a fake Hub, a port that never answers, a closed port)."""

from __future__ import annotations

import json
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.run import services
from scripts.run.services import Service
from tests.models.fake_hub import FakeHub
from tests.sidecar.support import assert_error, predict


def readyz(url: str) -> httpx.Response:
    return httpx.get(url + "/readyz", timeout=10)


def wait_for_phase(service: Service, phase: str, timeout: float = 60.0) -> dict[str, Any]:
    """Poll /readyz until it reports `phase` (the port may not be open at first)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        assert service.process.poll() is None, service.log()
        try:
            body = readyz(service.url).json()
        except httpx.TransportError as exc:
            last = exc
        else:
            if body["phase"] == phase:
                return dict(body)
            last = body
        time.sleep(0.05)
    raise AssertionError(f"phase {phase!r} not reached; last: {last}\n{service.log()}")


def test_healthz_and_readyz_when_ready(sidecar_service: Service) -> None:
    health = httpx.get(sidecar_service.url + "/healthz", timeout=10)
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    ready = readyz(sidecar_service.url)
    assert ready.status_code == 200
    body = ready.json()
    assert (body["ready"], body["phase"], body["reason"]) == (True, "ready", None)
    assert body["max_length"] == 4096


@pytest.fixture
def env_without_hf(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))


def broken_folders(tiny_model_dir: Path, tmp: Path) -> Iterator[tuple[str, Path, str]]:
    yield "missing", tmp / "does-not-exist", "is not a folder"
    (tmp / "empty").mkdir()
    yield "empty", tmp / "empty", "has no genai_config.json"
    garbage = tmp / "garbage"
    shutil.copytree(tiny_model_dir, garbage)
    (garbage / "genai_config.json").write_text("{not json")
    yield "garbage-config", garbage, "not a genai_config.json"
    no_graph = tmp / "no-graph"
    shutil.copytree(tiny_model_dir, no_graph)
    config = json.loads((no_graph / "genai_config.json").read_text())
    (no_graph / config["model"]["decoder"]["filename"]).unlink()
    yield "no-graph", no_graph, "the folder is incomplete"
    no_weights = tmp / "no-weights"
    shutil.copytree(tiny_model_dir, no_weights)
    (no_weights / (config["model"]["decoder"]["filename"] + ".data")).unlink()
    yield "no-weights", no_weights, "onnxruntime-genai could not load the model"


@pytest.mark.parametrize("case", ["missing", "empty", "garbage-config", "no-graph", "no-weights"])
def test_a_missing_or_broken_model_folder_is_explained_once(
    case: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    folders = {name: (path, says) for name, path, says in broken_folders(tiny_model_dir, tmp_path)}
    folder, says = folders[case]
    with services.sidecar(folder, tmp_path / "sidecar.log", wait=False) as service:
        body = wait_for_phase(service, "failed")
        reason = body["reason"]
        assert says in reason and "\n" not in reason
        assert body["ready"] is False
        response = readyz(service.url)
        assert response.status_code == 503 and int(response.headers["retry-after"]) > 0
        # The process stays up and alive; /predict says why it cannot answer.
        assert httpx.get(service.url + "/healthz", timeout=10).status_code == 200
        refused = predict(service.url, {"input_text": "Hi"})
        assert says in assert_error(refused, 503, "not_ready")
        assert refused.json()["error"]["phase"] == "failed"  # clients need not parse the text
        assert int(refused.headers["retry-after"]) > 0
        time.sleep(0.3)
        lines = [json.loads(line) for line in service.log_lines() if line[:1] == "{"]
        assert [line["level"] for line in lines if reason in line.values()] == ["error"]
        assert service.process.poll() is None


def black_hole() -> socket.socket:
    """A port that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


def test_while_downloading_the_port_is_open_and_readyz_says_so(
    env_without_hf: None, tmp_path: Path
) -> None:
    with black_hole() as hole:
        endpoint = f"http://127.0.0.1:{hole.getsockname()[1]}"
        with services.sidecar(
            tmp_path / "model", tmp_path / "sidecar.log", wait=False,
            MODEL_DOWNLOAD="1", HF_ENDPOINT=endpoint,
        ) as service:  # fmt: skip
            body = wait_for_phase(service, "downloading")
            assert body["ready"] is False
            response = readyz(service.url)
            assert response.status_code == 503 and response.headers["retry-after"]
            assert httpx.get(service.url + "/healthz", timeout=10).status_code == 200
            refused = predict(service.url, {"input_text": "Hi"})
            assert "downloading" in assert_error(refused, 503, "not_ready")
            assert refused.json()["error"]["phase"] == "downloading"


def test_a_failed_download_shows_in_readyz(env_without_hf: None, tmp_path: Path) -> None:
    closed = services.free_port()
    with services.sidecar(
        tmp_path / "model", tmp_path / "sidecar.log", wait=False,
        MODEL_DOWNLOAD="1", HF_ENDPOINT=f"http://127.0.0.1:{closed}",
    ) as service:  # fmt: skip
        reason = wait_for_phase(service, "failed")["reason"]
        assert reason.startswith("MODEL_DOWNLOAD=1 but the download failed: ")
        assert "\n" not in reason and "Traceback" not in service.log()
        assert readyz(service.url).status_code == 503


def test_model_download_fetches_the_model_once(
    env_without_hf: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    model_path = tmp_path / "models"
    with FakeHub.from_folder("fake-org/tiny-onnx", tiny_model_dir, "cpu/int4") as hub:
        settings = {
            "MODEL_DOWNLOAD": "1",
            "HF_ENDPOINT": hub.url,
            "MODEL_REPO_ID": "fake-org/tiny-onnx",
            "MODEL_SUBFOLDER": "cpu/int4",
        }
        with services.sidecar(model_path, tmp_path / "first.log", env=settings) as service:
            assert '"phase": "downloading"' in service.log()
            assert predict(service.url, {"input_text": "Hi"}).status_code == 200
        assert (model_path / "cpu" / "int4" / "genai_config.json").is_file()
        downloads = list(hub.downloads)
        assert downloads
        with services.sidecar(model_path, tmp_path / "second.log", env=settings) as service:
            assert predict(service.url, {"input_text": "Hi"}).status_code == 200
        assert hub.downloads == downloads  # found on disk: nothing fetched again
