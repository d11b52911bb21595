"""scripts/run/services.py, the one launcher of the real services (tests, run_local, bench)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest

from scripts.run import services


def test_a_relative_model_path_means_the_callers_folder(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tiny_model_dir.parent)
    relative = Path(os.path.relpath(tiny_model_dir))
    assert not relative.is_absolute()
    with services.sidecar(relative, tmp_path / "sidecar.log") as sidecar:
        assert httpx.get(sidecar.url + "/readyz", timeout=10).status_code == 200


def test_waiting_for_a_sidecar_whose_model_failed_ends_at_once(tmp_path: Path) -> None:
    began = time.monotonic()
    with (
        pytest.raises(RuntimeError, match="is not a folder"),
        services.sidecar(tmp_path / "no-model", tmp_path / "sidecar.log"),
    ):
        pass  # pragma: no cover - never entered
    assert time.monotonic() - began < 30  # not the 60 s readiness timeout
