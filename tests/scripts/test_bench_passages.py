"""`python -m scripts.bench passages` runs end to end on the tiny model (its timings and scores
are not checked: only the tables it prints, and that it measures what it says)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.bench.__main__ import main


def test_the_quality_gate_runs(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gate.json"
    command = ["passages", "--model", str(tiny_model_dir), "--questions", "2"]
    assert main([*command, "--recompute", "0,4", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    for row in ("exact run", "moved, N=0", "moved, N=4"):
        assert f"\n{row} " in table
    result = json.loads(out.read_text())
    assert result["questions"] == 2 and result["encoding"] == "int8"
    rows = {row["reuse"]: row for row in result["rows"]}
    assert set(rows) == {"exact run", "moved, N=0", "moved, N=4"}
    assert all(row["placed_mean"] > 0 and row["nll"] > 0 for row in rows.values())
    # Moved reuse reads each passage's first N tokens again: fewer placed at N=4
    assert rows["moved, N=4"]["placed_mean"] < rows["moved, N=0"]["placed_mean"]


def test_the_first_token_runs(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "timing.json"
    command = ["passages", "--model", str(tiny_model_dir), "--timing", "--repeats", "1"]
    command += ["--passage-tokens", "60"]
    assert main([*command, "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "\ngrounded, same passages in the store " in table
    result = json.loads(out.read_text())
    assert set(result["median_s"]) == {"bare", "off", "miss", "exact", "warmed", "moved"}
    assert result["placed_tokens"]["exact"] > 3 * 60 and result["placed_tokens"]["moved"] > 0
    # Warmed: its best passage and what stands before it, not the other passages
    assert 60 < result["placed_tokens"]["warmed"] < result["placed_tokens"]["exact"] - 60
