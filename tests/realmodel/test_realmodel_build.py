"""scripts/models/make_real_model.py once the model is built: a second run changes nothing and
needs no network (the wheel is kept, every step's stamp matches)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.models.realmodel.build import STAMP
from scripts.models.realmodel.sources import SMOLLM2_135M_INSTRUCT
from scripts.run.services import free_port

pytestmark = pytest.mark.realmodel

REPO = Path(__file__).resolve().parents[2]


def test_a_second_build_is_kept_offline(smollm2_dir: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in smollm2_dir.iterdir()}
    unreachable = f"http://127.0.0.1:{free_port()}/simple"
    mine = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env = {**mine, "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": unreachable}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.models.make_real_model",
            "--model",
            SMOLLM2_135M_INSTRUCT.name,
            "--out",
            str(smollm2_dir),
            "--work-dir",
            str(smollm2_dir.parent),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "kept the Hugging Face folder" in result.stdout
    assert f"kept the {SMOLLM2_135M_INSTRUCT.precision} model folder" in result.stdout
    assert {p.name: p.stat().st_mtime_ns for p in smollm2_dir.iterdir()} == before
    stamp = json.loads((smollm2_dir / STAMP).read_text())
    assert stamp["hf"]["wheel_sha256"] == SMOLLM2_135M_INSTRUCT.sha256
    assert stamp["precision"] == SMOLLM2_135M_INSTRUCT.precision
