"""`python -m scripts.bench prompt-lookup` runs end to end on the tiny model (its timings are not
checked: only the tables it prints, and that it measures what it says)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.bench.__main__ import main


def test_the_prompt_lookup_benchmark_runs(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "samples.json"
    command = ["prompt-lookup", "--model", str(tiny_model_dir), "--runs", "1"]
    command += ["--new-tokens", "24", "--call-repeats", "2"]
    assert main([*command, "--json", str(out)]) == 0
    table = capsys.readouterr().out
    for row in ("grounded answer, quoting", "copies its passage", "plain chat"):
        assert f"| {row} |" in table
    assert "| the other user (plain chat) |" in table
    assert "| 1 row, 5 tokens (a draft of 4) |" in table
    result = json.loads(out.read_text())
    assert result["draft_tokens"] == 4
    for label in ("grounded answer, quoting", "copies its passage", "plain chat"):
        (off,), (on,) = result["alone"][label]["off"], result["alone"][label]["on"]
        assert on["text"] == off["text"] and off["calls"] == 0 and on["calls"] > 0
    (off,), (on,) = result["two_users"]["off"], result["two_users"]["on"]
    assert on["other"]["checked"] == 0  # nobody drafts while two decode
    assert on["other"]["tokens"] == off["other"]["tokens"] > 0
    assert len(result["calls"]) == 5 and all(ms > 0 for ms in result["calls"].values())
