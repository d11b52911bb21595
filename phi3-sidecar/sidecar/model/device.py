"""Where the model runs (MODEL_DEVICE, PROVIDER_OPTIONS): the execution provider set on
onnxruntime-genai's config, the CUDA libraries loaded first, and one sentence for /readyz when
the device cannot be used."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

from sidecar.model.folder import ModelFolderError, first_line

log = logging.getLogger("sidecar.model.device")


class ProviderConfig(Protocol):
    """What use_device needs of an og.Config (engine.py makes it: the only module that imports
    onnxruntime-genai)."""

    def clear_providers(self) -> None: ...

    def append_provider(self, provider: str) -> None: ...

    def set_provider_option(self, provider: str, key: str, value: str) -> None: ...


class DeviceUnavailable(ModelFolderError):
    """MODEL_DEVICE cannot be used here; str() is one sentence for /readyz and the log."""


def use_device(config: ProviderConfig, device: str, options: Mapping[str, str]) -> None:
    """Run on `device` whatever the folder's genai_config.json says: cpu is onnxruntime's
    default provider (no provider listed), cuda is appended with its options."""
    config.clear_providers()
    if device == "cpu":
        return
    _preload_cuda_libraries()
    config.append_provider(device)
    for key, value in options.items():
        config.set_provider_option(device, key, value)


def _preload_cuda_libraries() -> None:
    """The NVIDIA runtime libraries installed as Python packages (the cuda image's), loaded
    before onnxruntime looks for them; a system CUDA installation needs nothing."""
    try:
        import onnxruntime

        preload = getattr(onnxruntime, "preload_dlls", None)
        if preload is not None:
            preload(cuda=True, cudnn=True, msvc=False)
    except Exception as exc:  # reported by the model load that follows, in a sentence
        log.debug("CUDA libraries not preloaded", extra={"fields": {"error": first_line(exc)}})


def device_error(device: str, error: BaseException) -> str:
    """One sentence on why MODEL_DEVICE could not be used."""
    text = first_line(error)
    lowered = text.lower()
    # "Cuda interface not available: CUDA error in Create at <file>:<line> - <what>"
    reason = text.rsplit(" - ", 1)[-1] if "cuda error in" in lowered else text
    if "libonnxruntime-genai-cuda.so: cannot open shared object file" in lowered:
        return (
            f"MODEL_DEVICE={device}, but this onnxruntime-genai is the CPU build: run the "
            "image's cuda target (onnxruntime-genai-cuda), or set MODEL_DEVICE=cpu"
        )
    if any(
        sign in lowered
        for sign in ("libcuda.so", "no cuda-capable device", "driver", "cudaerrornodevice")
    ):
        return (
            f"MODEL_DEVICE={device}, but no usable NVIDIA GPU or driver is available to this "
            f"process ({reason}): run on a GPU node with an NVIDIA driver recent enough for "
            "CUDA 13 and the NVIDIA container toolkit, or set MODEL_DEVICE=cpu"
        )
    if "cannot open shared object file" in lowered:
        return (
            f"MODEL_DEVICE={device}, but a CUDA library could not be loaded ({reason}): run "
            "the image's cuda target, which ships them, or install the NVIDIA runtime libraries"
        )
    return f"MODEL_DEVICE={device}: onnxruntime-genai could not load the model on the GPU: {text}"
