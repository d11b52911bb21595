"""scripts/quality.py on generated models: a folder against itself agrees everywhere with the
same perplexity; a folder that is not a model is refused."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def quality(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "quality.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_model_against_itself_agrees_everywhere(tiny_model_dir: Path) -> None:
    result = quality("--model", str(tiny_model_dir), "--reference", str(tiny_model_dir))
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    passages = [r for r in rows if re.match(r"\| (\d+|all) \|", r)]
    assert len(passages) == 7  # six passages and the total
    for row in passages:
        _, _, tokens, reference, model, agreement, _ = row.split("|")
        assert int(tokens) > 1 and reference == model and agreement.strip() == "100.0%"
    total = rows[-1].split("|")
    assert total[3].strip() in ("100.0%", "n/a")
    assert total[4].strip() == "8 of 8 replies identical"


def test_a_folder_without_a_model_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = quality("--model", str(tmp_path), "--reference", str(tiny_model_dir))
    assert result.returncode == 2
    assert "has no genai_config.json: not a model folder" in result.stderr
