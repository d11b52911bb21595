"""Family fixtures: a tiny random Hugging Face model of each family
(scripts/models/make_hf_model.py), exported by onnxruntime-genai's own builder through
scripts/models/export_model.py, once per session and family; a real sidecar and chat app on each.

The builder needs requirements-export.txt (torch, transformers): `make test` installs it. Without
it these tests are skipped locally and fail on CI (CI=true).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from scripts.models.hfgen.families import FAMILIES, Family
from scripts.run import services

REPO = Path(__file__).resolve().parents[2]
NAMES = sorted(FAMILIES)


@dataclass(frozen=True)
class Exported:
    family: Family
    hf_dir: Path  # the Hugging Face folder (transformers reads it)
    model_dir: Path  # what the builder wrote (the sidecar's MODEL_PATH)
    export_output: str  # what scripts/models/export_model.py printed


def _need_builder() -> None:
    missing = [
        m for m in ("torch", "transformers", "onnx_ir") if importlib.util.find_spec(m) is None
    ]
    if not missing:
        return
    message = f"{', '.join(missing)} not installed: pip install -r requirements-export.txt"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + " (CI=true: these tests must run on CI)", pytrace=False)
    pytest.skip(message)


def _run(*command: str) -> str:
    done = subprocess.run(
        [sys.executable, *command], capture_output=True, text=True, cwd=REPO, check=False
    )
    assert done.returncode == 0, f"{command[0]} failed:\n{done.stdout[-3000:]}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="session")
def export_family(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Exported]:
    """family name -> its exported model, built on first use and kept for the session."""
    built: dict[str, Exported] = {}
    root = tmp_path_factory.mktemp("families")

    def get(name: str) -> Exported:
        _need_builder()
        if name not in built:
            hf_dir, model_dir = root / "hf" / name, root / f"tiny-{name}"
            _run("-m", "scripts.models.make_hf_model", "--family", name, "--out", str(hf_dir))
            output = _run(
                "-m",
                "scripts.models.export_model",
                "--model",
                str(hf_dir),
                "--out",
                str(model_dir),
                "--cache-dir",
                str(root / "cache" / name),
            )
            built[name] = Exported(FAMILIES[name], hf_dir, model_dir, output)
        return built[name]

    return get


@pytest.fixture(params=NAMES, scope="module")
def exported(request: pytest.FixtureRequest, export_family: Callable[[str], Exported]) -> Exported:
    return export_family(request.param)


@pytest.fixture(scope="module")
def hf_tokenizer(exported: Exported) -> Any:
    """transformers' tokenizer of the Hugging Face folder: the reference for the template."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(exported.hf_dir)


@pytest.fixture(scope="module")
def family_sidecar(
    exported: Exported, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    log = tmp_path_factory.mktemp("logs") / f"sidecar-{exported.family.name}.log"
    with services.sidecar(exported.model_dir, log, MAX_CONCURRENCY="1") as service:
        yield service


@pytest.fixture(scope="module")
def family_app(
    family_sidecar: services.Service, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    log = tmp_path_factory.mktemp("logs") / "chatapp.log"
    with services.chatapp(family_sidecar.url, log) as app:
        yield app
