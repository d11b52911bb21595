"""`python -m scripts.bench users` runs end to end on the tiny model and reports every
setting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_users_at_once_on_the_tiny_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    json_path = tmp_path / "users.json"
    args = ["--model", str(tiny_model_dir), "--users", "1,2", "--rows", "1,2", "--reps", "1"]
    args += ["--joins", "2", "--new-tokens", "6", "--prompt-tokens", "24", "--json", str(json_path)]
    result = subprocess.run(
        [sys.executable, "-m", "scripts.bench", "users", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(json_path.read_text())
    assert set(data["results"]) == {"1", "2"}
    for by_users in data["results"].values():
        assert set(by_users) == {"1", "2"}
        for values in by_users.values():
            assert len(values["aggregate_tps"]) == 1 and values["aggregate_tps"][0] > 0
            assert len(values["ttft_s"]) == 2 and all(t > 0 for t in values["ttft_s"])
    assert all(rss > 0 for rss in data["peak_rss_bytes"].values())
    loaded, serving = data["rss_after_loading_bytes"], data["rss_highest_serving_bytes"]
    assert all(0 < loaded[rows] <= serving[rows] for rows in loaded)
    assert "MiB after loading" in result.stdout
    assert "| 2 | 2 |" in result.stdout  # DECODE_BATCH_ROWS 2, 2 users
