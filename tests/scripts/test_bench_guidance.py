"""`python -m scripts.bench guidance` runs end to end on the tiny model (its timings are not
checked: only that it measures what it says, and that forced tokens take fewer steps for the same
tokens on both paths)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.bench.__main__ import main


@pytest.mark.parametrize(
    ("rows", "path"), [("4", "batched decode (4 rows)"), ("1", "the Generator")]
)
def test_the_guidance_benchmark_runs(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], rows: str, path: str
) -> None:
    out = tmp_path / "samples.json"
    command = ["guidance", "--model", str(tiny_model_dir), "--runs", "1", "--rows", rows]
    assert main([*command, "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| JSON Schema, ff on |" in table and "| any-text grammar |" in table
    assert f"{path}," in table and json.loads(out.read_text())["path"] == path
    forced = json.loads(out.read_text())["forced"]
    (on,), (off,) = forced["ff on"], forced["ff off"]
    assert on["text"] == off["text"] and on["tokens"] == off["tokens"]
    if rows == "1":  # the Generator's llguidance adds forced tokens without a step each
        assert on["steps"] < off["steps"] == off["tokens"]  # one step a token without forcing
    else:  # forced runs read in one call (batch/guidance.py); the first token ends the prompt
        assert on["steps"] < off["steps"] == off["tokens"] - 1
        beside = json.loads(out.read_text())["beside"]
        assert set(beside) == {"guided JSON", "unguided text"}
        for row in beside.values():  # the three chats beside it made tokens meanwhile
            assert row["others_tokens"] > 0 and row["reply_tokens"] == on["tokens"]
        assert "| beside three chats, guided JSON |" in table
