"""Fixtures for the container tests: both images built once per session from the real
Dockerfiles (the sidecar twice: without a model, and with the generated tiny model baked in)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.containers import podman


@pytest.fixture(scope="session")
def images(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> podman.Images:
    podman.require_podman()
    podman.remove_leftovers()
    seconds: dict[str, float] = {}
    started = time.monotonic()
    podman.ensure_base_image()
    seconds["base"] = time.monotonic() - started
    conf = podman.pip_config(tmp_path_factory.mktemp("pip"))
    seconds["app"] = podman.build(podman.REPO / "main-app", podman.APP_IMAGE, conf)
    sidecar_dir = podman.REPO / "phi3-sidecar"
    seconds["sidecar"] = podman.build(sidecar_dir, podman.SIDECAR_IMAGE, conf, "--target=runtime")
    seconds["sidecar_model"] = podman.build(
        sidecar_dir, podman.SIDECAR_MODEL_IMAGE, conf, f"--build-context=model={tiny_model_dir}"
    )
    images = podman.Images(
        app=podman.APP_IMAGE,
        sidecar=podman.SIDECAR_IMAGE,
        sidecar_model=podman.SIDECAR_MODEL_IMAGE,
        seconds={k: round(v, 1) for k, v in seconds.items()},
        sizes={
            "app": podman.image_size(podman.APP_IMAGE),
            "sidecar": podman.image_size(podman.SIDECAR_IMAGE),
            "sidecar_model": podman.image_size(podman.SIDECAR_MODEL_IMAGE),
        },
        base_size=podman.image_size(podman.BASE_IMAGE),
    )
    # For docs/deploy.md's image sizes and for anyone comparing runs.
    podman.BUILD.mkdir(parents=True, exist_ok=True)
    (podman.BUILD / "images.json").write_text(json.dumps(asdict(images), indent=2) + "\n")
    return images
