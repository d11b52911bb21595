"""`python -m scripts.bench guidance` runs end to end on the tiny model (its timings are not
checked: only that it measures what it says, and that forced tokens take fewer steps for the same
tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.bench.__main__ import main


def test_the_guidance_benchmark_runs(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "samples.json"
    assert (
        main(["guidance", "--model", str(tiny_model_dir), "--runs", "1", "--json", str(out)]) == 0
    )
    table = capsys.readouterr().out
    assert "| JSON Schema, ff on |" in table and "| any-text grammar |" in table
    forced = json.loads(out.read_text())["forced"]
    (on,), (off,) = forced["ff on"], forced["ff off"]
    assert on["text"] == off["text"] and on["tokens"] == off["tokens"]
    assert on["steps"] < off["steps"] == off["tokens"]  # one step a token without forcing
