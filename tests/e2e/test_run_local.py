"""scripts/run/run_local.py: one command brings up both services; Ctrl+C or a dying child ends
all."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from scripts.run import services
from tests.e2e import live

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@dataclass
class Run:
    process: subprocess.Popen[bytes]
    output: Path
    url: str
    sidecar_url: str = ""

    def text(self) -> str:
        return self.output.read_text(errors="replace")


@contextlib.contextmanager
def run_local(models_dir: Path, tmp_path: Path) -> Iterator[Run]:
    port, sidecar_port = services.free_port(), services.free_port()
    output = tmp_path / "run_local.out"
    cmd = [
        sys.executable, "-m", "scripts.run.run_local", "--model", "tiny",
        "--models-dir", str(models_dir), "--log-dir", str(tmp_path / "logs"),
        "--port", str(port), "--sidecar-port", str(sidecar_port),
    ]  # fmt: skip
    with output.open("wb") as out:
        process = subprocess.Popen(cmd, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    run = Run(process, output, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{sidecar_port}")
    try:
        live.wait_until(
            lambda: f"http://localhost:{port}" in run.text() or process.poll() is not None,
            60,
            "run_local.py to print the address",
        )
        assert process.poll() is None, run.text()
        yield run
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def descendants(process: subprocess.Popen[bytes]) -> list[psutil.Process]:
    return psutil.Process(process.pid).children(recursive=True)


def assert_all_gone(processes: list[psutil.Process]) -> None:
    _, alive = psutil.wait_procs(processes, timeout=15)
    for child in alive:
        child.kill()
    assert not alive, [child.cmdline() for child in alive]


def test_run_chat_and_ctrl_c(models_dir: Path, tmp_path: Path) -> None:
    with run_local(models_dir, tmp_path) as run:
        live.wait_until(
            lambda: httpx.get(run.url + "/healthz", timeout=5).json()["sidecar"]["ready"],
            30,
            "the model to be ready",
        )
        assert httpx.get(run.url + "/", timeout=5).status_code == 200
        objs = live.chat(run.url, [{"role": "user", "content": "Hello"}])
        assert live.text_of(objs) and objs[-1]["done"] is True
        live.wait_until(
            lambda: httpx.get(run.sidecar_url + "/readyz", timeout=5).json()["embeddings"][
                "served"
            ],
            30,
            "the tiny encoder to be ready",
        )
        vectors = httpx.post(run.sidecar_url + "/v1/embeddings", json={"input": "hi"}, timeout=30)
        assert vectors.status_code == 200 and vectors.json()["data"][0]["embedding"]
        children = descendants(run.process)
        commands = [" ".join(child.cmdline()) for child in children]
        assert any("-m sidecar" in c for c in commands), commands
        assert any("gunicorn" in c for c in commands), commands
        run.process.send_signal(signal.SIGINT)
        assert run.process.wait(30) == 0, run.text()
        assert_all_gone(children)
    text = run.text()
    assert "generating the tiny model" in text
    assert "generating the tiny encoder" in text
    assert "gibberish" in text
    assert "[sidecar] " in text and "[chatapp] " in text
    assert (models_dir / "tiny" / "genai_config.json").is_file()


def test_a_dying_service_stops_the_other(models_dir: Path, tmp_path: Path) -> None:
    with run_local(models_dir, tmp_path) as run:
        children = descendants(run.process)
        sidecar = next(c for c in children if "-m sidecar" in " ".join(c.cmdline()))
        time.sleep(0.5)
        sidecar.kill()
        assert run.process.wait(30) == 1, run.text()
        assert_all_gone(children)
        assert "the sidecar stopped" in run.text()


@contextlib.contextmanager
def listener() -> Iterator[int]:
    """A port something already listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_port_in_use(models_dir: Path, tmp_path: Path) -> None:
    with listener() as port:
        result = subprocess.run(
            [sys.executable, "-m", "scripts.run.run_local", "--model", "tiny",
             "--models-dir", str(models_dir), "--port", str(port)],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    assert result.returncode == 1
    assert f"port {port} is already in use" in result.stdout


def test_the_real_model_without_network_says_what_to_do(tmp_path: Path) -> None:
    # The hub client is pointed at a local port where nothing listens: no internet is needed.
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{services.free_port()}"}
    result = subprocess.run(
        [sys.executable, "-m", "scripts.run.run_local", "--model", "phi3",
         "--models-dir", str(tmp_path), "--port", str(services.free_port()),
         "--sidecar-port", str(services.free_port())],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert result.returncode == 1
    assert "make run MODEL=smollm2" in result.stdout and "MODEL=tiny" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
