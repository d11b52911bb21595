"""`python -m scripts.bench models` end to end on generated models (model A the tiny preset's
folder, B the tiny preset): every part's figures are there, the soak's replies came from the
models asked for, without a 5xx (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_the_question_measures_every_part(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "models.json"
    command = [sys.executable, "-m", "scripts.bench", "models", "--model-a", str(tiny_model_dir)]
    command += ["--preset-b", "tiny", "--turns", "1", "--soak", "6", "--tokens", "2"]
    result = subprocess.run(
        [*command, "--json", str(out)], capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(out.read_text())
    assert set(data["turns"]["median_s"]) == {"a alone", "b alone", "a turns", "b turns"}
    cold = data["cold"]
    assert cold["first_token_s"] > 0 and cold["loading_events"]
    assert cold["loading_events"][0]["model"] == "a" and cold["phi3_mini_estimate_s"] > 0
    soak = data["soak"]
    assert soak["five_hundreds"] == 0 and soak["wrong_model"] == 0
    assert soak["peak_bytes"] > 0 and "soak:" in result.stdout
