"""Shared fixtures: generated models (built once per session) and running services."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts import services

REPO = Path(__file__).resolve().parents[1]


def build_model(preset: str, out: Path, *extra: str) -> Path:
    """Run the real generator script; returns the folder that holds genai_config.json."""
    subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "make_model.py"),
            "--preset",
            preset,
            "--out",
            str(out),
            *extra,
        ],
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model("tiny", tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def small_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model("small", tmp_path_factory.mktemp("models") / "small")


@pytest.fixture(scope="session")
def sidecar_service(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    """One real sidecar process on the tiny model, shared by tests that only read from it."""
    log = tmp_path_factory.mktemp("logs") / "sidecar.log"
    with services.sidecar(tiny_model_dir, log) as service:
        yield service
