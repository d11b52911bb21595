"""MODEL_DEVICE and PROVIDER_OPTIONS: the settings, and the one sentence /readyz gives when
cuda is asked for where it cannot run. This machine has no GPU and the CPU build of
onnxruntime-genai, so the refusal is real; the GPU path itself is not exercised here."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError
from pydantic_settings import SettingsError

from scripts.run import services
from sidecar.model.device import device_error
from sidecar.settings import Settings
from tests.sidecar.support import assert_error, predict
from tests.sidecar.web.test_sidecar_health import wait_for_phase


def test_the_device_is_cpu_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().model_device == "cpu" and Settings().provider_options == {}
    monkeypatch.setenv("MODEL_DEVICE", "CUDA")
    monkeypatch.setenv("PROVIDER_OPTIONS", '{"device_id": "1", "enable_cuda_graph": "0"}')
    settings = Settings()
    assert settings.model_device == "cuda"
    assert settings.provider_options == {"device_id": "1", "enable_cuda_graph": "0"}


@pytest.mark.parametrize(
    ("name", "value"),
    [("MODEL_DEVICE", "tpu"), ("PROVIDER_OPTIONS", "device_id=0"), ("PROVIDER_OPTIONS", "[1]")],
)
def test_a_bad_device_setting_is_refused(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises((ValidationError, SettingsError)):
        Settings()


def test_cuda_without_a_cuda_build_fails_readiness_with_one_sentence(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    env = {"MODEL_DEVICE": "cuda", "PROVIDER_OPTIONS": '{"device_id": "0"}'}
    with services.sidecar(tiny_model_dir, tmp_path / "sidecar.log", wait=False, env=env) as svc:
        body = wait_for_phase(svc, "failed")
        assert body["reason"] == (
            "MODEL_DEVICE=cuda, but this onnxruntime-genai is the CPU build: run the image's "
            "cuda target (onnxruntime-genai-cuda), or set MODEL_DEVICE=cpu"
        )
        assert httpx.get(svc.url + "/healthz", timeout=10).status_code == 200
        refused = predict(svc.url, {"input_text": "Hi"})
        assert "MODEL_DEVICE=cuda" in assert_error(refused, 503, "not_ready")


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (
            "libcuda.so.1: cannot open shared object file: No such file or directory",
            "no usable NVIDIA GPU or driver is available to this process",
        ),
        (
            "CUDA failure 100: no CUDA-capable device is detected ; GPU=0",
            "no usable NVIDIA GPU or driver is available to this process",
        ),
        (
            "CUDA driver version is insufficient for CUDA runtime version",
            "no usable NVIDIA GPU or driver is available to this process",
        ),
        (
            # The cuda build in the image's cuda target on this machine (no GPU, no driver).
            "Cuda interface not available: CUDA error in Create at "
            "/ort_genai_src/src/ep/cuda/cuda_common.h:80 - CUDA driver version is insufficient "
            "for CUDA runtime version",
            "GPU or driver is available to this process (CUDA driver version is insufficient",
        ),
        (
            "Cuda interface not available: Failed to load library: libcublasLt.so.13: cannot "
            "open shared object file: No such file or directory",
            "a CUDA library could not be loaded (Cuda interface not available: Failed to load",
        ),
        ("out of memory\nat ...", "could not load the model on the GPU: out of memory"),
    ],
)
def test_what_the_cuda_build_reports_becomes_one_sentence(error: str, says: str) -> None:
    """The errors of the cuda build without a GPU or driver (not producible on this machine)."""
    sentence = device_error("cuda", RuntimeError(error))
    assert says in sentence and "\n" not in sentence and sentence.startswith("MODEL_DEVICE=cuda")
