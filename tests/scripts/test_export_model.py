"""scripts/models/export_model.py: one sentence for each way it fails (tests/families has it
working)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.models import export_model

SCRIPT = ["-m", "scripts.models.export_model"]


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *SCRIPT, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
        check=False,
    )


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("x")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    cases = {
        ("--model", "not a model"): "neither a folder nor a Hub id",
        ("--model", str(tmp_path / "empty")): "without config.json",
        ("--model", str(tmp_path / "hf"), "--out", str(tmp_path / "taken")): "is not empty",
        ("--model", "a/b", "--extra-option", "novalue"): "KEY=VALUE",
        ("--model", "a/b", "--precision", "int3"): "invalid choice",
        ("--model", "a/b", "--block-size", "64", "--extra-option", "block_size=128"): (
            "repeats a variant option"
        ),
        ("--model", "a/b", "--block-size", "48"): "invalid choice",
        ("--model", "a/b", "--kv-cache", "int4_per_token"): "invalid choice",
    }
    for args, says in cases.items():
        result = run(*args)
        assert result.returncode == 2 and says in result.stderr, (args, result.stderr)


def test_a_model_the_builder_cannot_convert_is_one_sentence(tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "no-such-family"}))
    result = run("--model", str(hf), "--out", str(tmp_path / "out"))
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: The builder failed (exit ")
    assert "Traceback" not in result.stderr


def test_a_hub_model_without_the_hub_is_one_sentence(tmp_path: Path) -> None:
    result = run(
        "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--out", str(tmp_path / "out"), HF_HUB_OFFLINE="1"
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: The builder failed")


def test_the_builder_s_dependencies_are_named_when_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(export_model, "BUILDER_NEEDS", ("torch", "no_such_module_for_test"))
    with pytest.raises(export_model.ExportError) as missing:
        export_model.check_builder_installed()
    assert "no_such_module_for_test" in str(missing.value)
    assert "pip install -r requirements-export.txt" in str(missing.value)
