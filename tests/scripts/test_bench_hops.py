"""`python -m scripts.bench hops` end to end on the tiny model: every variant runs and every
output is written.

No timing is asserted (this machine is noisy); the point is that the benchmark keeps working.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_quick_bench_on_the_tiny_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    json_path = tmp_path / "results" / "hops.json"
    args = ["--quick", "--model", str(tiny_model_dir), "--prompt-tokens", "40"]
    args += ["--new-tokens", "12", "--reps", "1", "--concurrency", "1,3", "--json", str(json_path)]
    result = subprocess.run(
        [sys.executable, "-m", "scripts.bench", "hops", *args],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr

    data = json.loads(json_path.read_text())
    assert data["benchmark"]["question"] == "hops" and "CPUs" in data["benchmark"]["cpu"]
    variants = {"engine-default", "engine", "sidecar", "app"}
    assert {s["variant"] for s in data["samples"]} == variants
    assert all(s["tokens"] == 12 and s["status"] == 200 for s in data["samples"])
    assert data["prompt_tokens"] >= 40
    assert [row["n"] for row in data["concurrency"]] == [1, 3]
    # The queue has room for the largest burst, so nothing is turned away.
    assert all(row["accepted"] == row["n"] for row in data["concurrency"])
    assert set(data["peak_rss_bytes"]) == {
        "sidecar (web + model worker)",
        "main-app (gunicorn)",
        "engine alone (this script)",
    }
    assert all(rss > 0 for rss in data["peak_rss_bytes"].values())
    assert json_path.with_suffix(".png").stat().st_size > 10_000
    # The conversation cache's table: turn 1 reads everything, later turns continue the cache
    # (the uncached sidecar's numbers sit beside them).
    turns = data["turns"]
    assert [row["turn"] for row in turns] == [1, 2, 3, 4, 5]
    assert turns[0]["cached_tokens"] == 0
    assert all(row["cached_tokens"] > 0 for row in turns[1:])
    assert all(row["prompt_tokens"] > turns[0]["prompt_tokens"] for row in turns[1:])
    assert data["prompt_cache_mb"] > 0
    table = result.stdout
    assert "Conversation cache" in table and "| 5 |" in table
    for row in ("| engine-default |", "| engine |", "| sidecar |", "| app |", "| 3 | 3 | 0 |"):
        assert row in table
    # The tuned configuration is the sidecar's, and the run says what it was.
    assert "intra-op threads" in data["tuned_configuration"]
    assert data["tuned_configuration"] in table
