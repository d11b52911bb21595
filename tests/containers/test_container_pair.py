"""The real images, built from the real Dockerfiles and run as App Service runs them.

Both containers share one pod (one network namespace): the app reaches the sidecar at
http://localhost:8000 and only the app's port 8080 is published. In the pod the sidecar image
has the generated tiny model baked in; later tests run the model-less image with the model on a
mounted volume, and with MODEL_DOWNLOAD=1 against a local fake of the Hub. Needs podman
(scripts/run/setup_podman.sh); the harness is tests/containers/podman.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.models.make_model import LONG_PROMPT
from scripts.run import services
from tests.containers import podman
from tests.models.fake_hub import FakeHub

pytestmark = [pytest.mark.containers, pytest.mark.timeout(1800)]

# Greedy, long enough for the tiny model's multilingual reply (Cyrillic, CJK, Arabic...).
CHAT = {
    "messages": [{"role": "user", "content": LONG_PROMPT}],
    "temperature": 0,
    "max_new_tokens": 300,
}
UID = "10001"  # the USER of both Dockerfiles
READY_TIMEOUT = 120


@pytest.fixture(scope="module")
def pod(images: podman.Images) -> Iterator[podman.Pod]:
    with podman.pair(images.app, images.sidecar_model, services.free_port()) as pod:
        podman.wait_ready(pod.url, READY_TIMEOUT, pod.logs)
        yield pod


def read_chat(url: str, body: dict[str, Any]) -> tuple[bytes, list[dict[str, Any]]]:
    """POST /chat; returns the raw body and its NDJSON lines."""
    with httpx.stream("POST", url + "/chat", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("application/x-ndjson")
        raw = b"".join(response.iter_bytes())
    return raw, [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def local_reply(sidecar_service: services.Service, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The same request answered by the pair run from source on this machine."""
    log = tmp_path_factory.mktemp("logs") / "chatapp.log"
    with services.chatapp(sidecar_service.url, log) as app:
        _, lines = read_chat(app.url, CHAT)
    return "".join(line.get("delta", "") for line in lines)


def test_chat_streams_non_ascii_reply_intact_through_the_published_port(
    pod: podman.Pod, local_reply: str
) -> None:
    raw, lines = read_chat(pod.url, CHAT)
    raw.decode("utf-8", errors="strict")
    assert lines[-1].get("done") is True, lines[-1]
    assert not any("error" in line for line in lines), pod.logs()
    reply = "".join(line.get("delta", "") for line in lines)
    assert sum(1 for line in lines if "delta" in line) > 1, "the reply did not stream"
    assert any(ord(ch) > 0x7F for ch in reply), reply
    assert "\ufffd" not in reply, reply
    # Byte for byte what the same model says outside the containers.
    assert reply == local_reply


def test_both_containers_run_as_non_root(pod: podman.Pod, images: podman.Images) -> None:
    for container in (pod.app, pod.sidecar):
        result = podman.podman("exec", container, "id", "-u")
        assert result.stdout.strip() == UID, container
    for image in (images.app, images.sidecar, images.sidecar_model):
        assert podman.image_inspect(image)["Config"]["User"] == f"{UID}:{UID}", image


def test_sidecar_port_is_reachable_inside_the_pod_only(pod: podman.Pod) -> None:
    # Inside the pod the app reaches the sidecar on localhost:8000 ...
    probe = pod.exec_python(
        pod.app,
        "import urllib.request as u; print(u.urlopen('http://localhost:8000/readyz').status)",
    )
    assert probe.stdout.strip() == "200", probe.stderr
    # ... but the pod publishes the app's port only,
    inspect = json.loads(podman.podman("pod", "inspect", pod.name).stdout)
    inspect = inspect[0] if isinstance(inspect, list) else inspect
    bindings = inspect["InfraConfig"]["PortBindings"]
    assert set(bindings) == {"8080/tcp"}, bindings
    # what answers there is the app, not the model service,
    assert "sidecar" in httpx.get(pod.url + "/healthz", timeout=5).json()
    assert httpx.post(pod.url + "/predict", json={}, timeout=5).status_code == 404
    # and the pod has no address of its own that the host could reach port 8000 at.
    for container in (pod.app, pod.sidecar):
        networks = podman.podman(
            "inspect", "--format", "{{json .NetworkSettings.Networks}}", container
        ).stdout.strip()
        assert networks in ("null", "{}", ""), networks


def test_healthchecks_in_the_images_pass(pod: podman.Pod, images: podman.Images) -> None:
    for image in (images.app, images.sidecar_model):
        test = podman.image_inspect(image)["Healthcheck"]["Test"]
        assert "/healthz" in " ".join(test), test
    for container in (pod.app, pod.sidecar):
        result = podman.podman("healthcheck", "run", container, check=False)
        assert result.returncode == 0, (container, result.stdout, result.stderr)


def test_smoke_test_script_passes_against_the_pair(pod: podman.Pod) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "scripts.run.smoke_test", pod.url, "--wait", "30"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok: ")


def test_model_on_a_mounted_volume_instead_of_in_the_image(
    images: podman.Images, tiny_model_dir: Path
) -> None:
    """Option (b): the image without a model finds it at MODEL_PATH on a mounted volume."""
    model_path = podman.image_env(images.sidecar)["MODEL_PATH"]
    assert model_path.startswith("/home/"), model_path  # /home persists on App Service
    with podman.alone(images.sidecar, 8000, f"--volume={tiny_model_dir}:{model_path}:ro") as (
        name,
        url,
    ):
        status = podman.poll(lambda: _status(url + "/readyz", want=200), READY_TIMEOUT)
        assert status == 200, podman.podman("logs", name, check=False).stderr[-3000:]


def test_model_download_into_a_volume_on_first_start_only(
    images: podman.Images, tiny_model_dir: Path
) -> None:
    """Option (b) with MODEL_DOWNLOAD=1: the non-root sidecar downloads the model into an empty
    named volume (as docker-compose.yml does; /home on App Service), and a second container on
    the same volume finds it there. The Hub is a local fake, reached from the container through
    slirp4netns' host loopback address."""
    model_path = podman.image_env(images.sidecar)["MODEL_PATH"]
    repo, subfolder = "fake-org/tiny-onnx", "cpu/int4"
    with FakeHub.from_folder(repo, tiny_model_dir, subfolder) as hub, podman.volume() as models:
        port = hub.url.rsplit(":", 1)[1]
        options = (
            f"--volume={models}:{Path(model_path).parent}",
            "--env=MODEL_DOWNLOAD=1",
            f"--env=MODEL_REPO_ID={repo}",
            f"--env=MODEL_SUBFOLDER={subfolder}",
            f"--env=HF_ENDPOINT=http://10.0.2.2:{port}",
        )
        network = "slirp4netns:allow_host_loopback=true"
        for start in ("first", "second"):
            with podman.alone(images.sidecar, 8000, *options, network=network) as (name, url):
                status = podman.poll(lambda: _status(url + "/readyz", want=200), READY_TIMEOUT)
                logs = podman.podman("logs", name, check=False).stderr
                assert status == 200, (start, logs[-3000:])
            if start == "first":
                assert '"phase": "downloading"' in logs, logs[-3000:]
                downloads = list(hub.downloads)
                assert any(path.endswith(".onnx.data") for path in downloads), downloads
        assert hub.downloads == downloads  # the second start found the model in the volume


def test_image_without_a_model_is_alive_not_ready_and_says_why(images: podman.Images) -> None:
    with podman.alone(images.sidecar, 8000) as (name, url):
        assert podman.poll(lambda: _status(url + "/healthz", want=200), READY_TIMEOUT) == 200
        body = podman.poll(lambda: _not_ready_reason(url), READY_TIMEOUT)
        assert body is not None, podman.podman("logs", name, check=False).stderr[-3000:]
        assert "MODEL_PATH" in body


def _status(url: str, want: int) -> int | None:
    try:
        status = httpx.get(url, timeout=3).status_code
    except httpx.HTTPError:
        return None
    return status if status == want else None


def _not_ready_reason(url: str) -> str | None:
    """The /readyz body once it is a 503 that names the problem."""
    try:
        response = httpx.get(url + "/readyz", timeout=3)
    except httpx.HTTPError:
        return None
    if response.status_code == 503 and "MODEL_PATH" in response.text:
        return response.text
    return None


def test_images_hold_no_compiler_and_no_unused_frameworks(images: podman.Images) -> None:
    check = (
        "import importlib.util, shutil, sys; "
        "bad = [m for m in ('torch', 'transformers', 'tensorflow') if importlib.util.find_spec(m)]"
        " + [c for c in ('gcc', 'cc', 'g++', 'make') if shutil.which(c)]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    for image in (images.app, images.sidecar):
        result = podman.podman(
            "run", "--rm", "--network=none", image, "python", "-c", check, check=False
        )
        assert result.returncode == 0, (image, result.stdout, result.stderr)


def test_image_sizes_stay_small(images: podman.Images) -> None:
    """What each Dockerfile adds to the base, without a model (sizes in build/containers/)."""
    added = {name: size - images.base_size for name, size in images.sizes.items()}
    # The app: Flask, gunicorn, gevent and requests (about 26 MB), OpenTelemetry and
    # prometheus-client (about 14 MB), Azure Monitor's exporter (about 26 MB: cryptography);
    # since issues 43-44 (255 MB measured): numpy (74 MB, the documents' vectors), SQLAlchemy
    # (29 MB), lxml and python-docx, tokenizers, huggingface_hub with hf_xet (19 MB),
    # psycopg's binary, sqlean and sqlite-vec.
    assert added["app"] < 280_000_000, added
    # The sidecar: onnxruntime, onnxruntime-genai, numpy, tokenizers, FastAPI (under 350 MB
    # until issue 57); speech to text (issue 57) adds about 250 MB: CTranslate2 (146 MB, its
    # own oneDNN and OpenMP libraries) and PyAV (104 MB, the FFmpeg libraries it decodes
    # uploads with); 589 MB measured on 2026-12-07.
    assert added["sidecar"] < 620_000_000, added
